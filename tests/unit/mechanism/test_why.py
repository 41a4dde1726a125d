"""Why a job waits or runs (core/why.py), in hand-made situations: the states are built with the
real reducers (builders.py), the round planned by the real planner where it matters, so that a
code says what the planner did. Type ``a`` runs 1/2/4 steps/s on k80/p100/v100."""

from __future__ import annotations

from mechanism_service.core import why
from mechanism_service.core.attempts import end_lease, start_attempt
from mechanism_service.core.memory import Memory
from mechanism_service.core.model import Placement
from mechanism_service.core.reducers import NewJob
from mechanism_service.core.rounds import RoundPlan, open_round
from tests.unit.mechanism.builders import GAVEL, no_shuffle, state

SEED_S = GAVEL.seed_s


def planned(memory: Memory, now_s: float = 0.0) -> Memory:
    """This round planned by the real planner, as the round loop keeps it."""
    assert memory.state is not None
    plan = open_round(memory.state, now_s, GAVEL, no_shuffle)
    memory.running = (now_s, plan, False)
    return memory


def test_a_gang_larger_than_the_free_gpus_of_its_type_waits_for_resources():
    # v100 x4: j0 (1 GPU) holds one; j1, a gang of 4 with its share on v100, finds 3 free
    s = state(v100=4).job("a").job("a", scale_factor=4).allocate((0,), v100=0.5).allocate((1,), v100=0.5).received((1,), v100=400.0)
    memory = planned(Memory(state=s.type_time(v100=1000.0).build()))
    assert [entry for entry in memory.state.previous_assignment] == [(0,)]  # type: ignore[union-attr]
    assert why.reason_codes(memory) == {"j0": why.RUNNING, "j1": why.RESOURCES}
    detail = why.explain(memory, "j1", 0.0, seed_s=SEED_S)
    assert detail is not None and detail["code"] == why.RESOURCES
    assert detail["gang_gpus"] == 4 and detail["free_gpus"] == {"v100": 3}
    assert "a gang of 4 GPUs" in str(detail["reason"]) and "v100 3 free" in str(detail["reason"])
    assert detail["holders"] == [{"ids": ["j0"], "accelerator_type": "v100", "gpus": 1, "priority": detail["holders"][0]["priority"]}]  # type: ignore[index]


def test_a_job_whose_share_is_on_a_busy_type_waits_on_priority_and_names_who_holds_it():
    # v100 x1. j0 and j1 both have their share there; j1 received more, so j0 runs and j1
    # waits; j1's priority there is below j0's, and it is owed time there
    s = (
        state(v100=1).job("a").job("a")
        .allocate((0,), v100=0.5).allocate((1,), v100=0.5)
        .received((0,), v100=100.0).received((1,), v100=300.0).type_time(v100=400.0)
    )
    memory = planned(Memory(state=s.build()), now_s=1000.0)
    assert why.reason_codes(memory) == {"j0": why.RUNNING, "j1": why.PRIORITY}
    detail = why.explain(memory, "j1", 1000.0, seed_s=SEED_S)
    assert detail is not None
    assert detail["shares"] == {"v100": 0.5}
    assert detail["priority"]["v100"] == round(0.5 / (300.0 / 400.0), 6)  # type: ignore[index]
    holders = detail["holders"]
    assert [h["ids"] for h in holders] == [["j0"]]  # type: ignore[union-attr]
    assert holders[0]["priority"] == round(0.5 / (100.0 / 400.0), 6) > detail["priority"]["v100"]  # type: ignore[index]
    # owed on v100: its share x time since the last reset (0), less what it received past the seed
    assert detail["owed_s"]["v100"] == 0.5 * 1000.0 - (300.0 - SEED_S)  # type: ignore[index]
    assert "v100 0.50" in str(detail["reason"]) and "j0" in str(detail["reason"])


def test_a_job_run_for_the_estimator_is_profiling():
    s = state(v100=2).job("a").job("a").allocate((0,), v100=0.5).allocate((1,), v100=0.5).ran((1,), "v100", 1).build()
    profiled = RoundPlan({(1,): Placement("v100", (1,))}, frozenset(), 0, 0, 1, profiled=frozenset({(1,)}))
    memory = Memory(state=s, running=(0.0, profiled, False))
    codes = why.reason_codes(memory)
    assert codes["j1"] == why.PROFILING
    assert "measure its speed for the estimator" in str(why.explain(memory, "j1", 0.0)["reason"])  # type: ignore[index]
    assert why.pending_counts(memory) == {why.PRIORITY: 1}  # j0: its share is on v100, whose free GPU waits for it


def test_a_held_job_and_one_whose_arrival_is_ahead():
    held = NewJob("big", "a", 8, 100, 0.0)
    later = NewJob("later", "a", 1, 100, 500.0)
    memory = Memory(state=state(v100=4).build(), held=[(held, "needs 8 GPUs ...: it waits for workers to join")], submitted=[later])
    assert why.reason_codes(memory) == {"big": why.HELD, "later": why.BEGIN_TIME}
    assert why.explain(memory, "big", 0.0) == {
        "code": why.HELD, "reason": "held at admission: needs 8 GPUs ...: it waits for workers to join", "gang_gpus": 8,
    }
    assert why.explain(memory, "later", 100.0)["reason"] == "submitted; it arrives in 400 s (mechanism time)"  # type: ignore[index]
    assert why.explain(memory, "nobody", 0.0) is None


def test_a_job_admitted_since_the_last_solve_has_no_allocation_and_one_the_policy_left_out_waits_on_priority():
    # j0 and j1 were in the solve (j1 with no share: FIFO's queue); j2 came after it
    s = state(v100=1).jobs(3).allocate((0,), v100=1.0).allocate((1,), v100=0.0).build()
    memory = planned(Memory(state=s))
    assert why.reason_codes(memory) == {"j0": why.RUNNING, "j1": why.PRIORITY, "j2": why.NO_ALLOCATION}
    memory.observations.allocation_solved_at_s = 0.0
    assert "next solve" in str(why.explain(memory, "j2", 10.0)["reason"])  # type: ignore[index]
    assert "no share" in str(why.explain(memory, "j1", 10.0)["reason"])  # type: ignore[index]
    memory.observations.degraded_since_s = 5.0  # the policy stopped answering: nobody left out is "behind"
    assert why.reason_codes(memory)["j1"] == why.NO_ALLOCATION
    assert "does not answer" in str(why.explain(memory, "j2", 10.0)["reason"])  # type: ignore[index]


def test_no_allocation_solved_yet():
    memory = planned(Memory(state=state(v100=1).jobs(1).build()))
    assert why.reason_codes(memory) == {"j0": why.NO_ALLOCATION}
    assert "no allocation has been solved yet" in str(why.explain(memory, "j0", 0.0)["reason"])  # type: ignore[index]


def test_a_job_whose_last_attempt_crashed_is_retrying_with_its_failures_counted():
    s = state(v100=1).job("a").allocate((0,), v100=1.0).ran((0,), "v100", 0).build()
    memory = Memory(state=s)
    for round_id in (1, 2):
        start_attempt(memory.observations.attempts, "j0", round_id=round_id, now_s=0.0, accelerator_type="v100", workers=["w"])
        end_lease(memory.observations.attempts, "j0", "crashed (exit 1)", 0, None)
    assert why.reason_codes(memory) == {"j0": why.RETRYING}
    assert why.pending_counts(memory) == {why.RETRYING: 1}  # its lease crashed: it waits for the next round
    detail = why.explain(memory, "j0", 0.0)
    assert detail is not None and detail["failed_attempts_in_a_row"] == 2
    assert "crashed" in str(detail["reason"]) and "2 attempts failed in a row" in str(detail["reason"])


def test_a_cancelled_job_is_cancelling_until_the_boundary():
    memory = Memory(state=state(v100=1).jobs(2).allocate((0,), v100=1.0).ran((0,), "v100", 0).build(), cancelling={"j0": "cancelled by ann", "j1": "by ann"})
    assert why.reason_codes(memory) == {"j0": why.CANCELLING, "j1": why.CANCELLING}
    assert why.pending_counts(memory) == {why.CANCELLING: 1}  # j0's last lease still runs: not pending
    assert "cancelled by ann" in str(why.explain(memory, "j0", 0.0)["reason"])  # type: ignore[index]


def test_every_job_the_planner_left_out_has_a_waiting_code_and_every_one_it_picked_runs():
    # 12 jobs of mixed gangs on a small cluster, every one with a share: the codes match the plan
    b = state(k80=2, p100=2, v100=4)
    for k in range(12):
        b.job("a", scale_factor=(1, 2, 4)[k % 3])
    for k in range(12):
        b.allocate((k,), v100=0.2, p100=0.1).received((k,), v100=float(10 * k), p100=float(5 * k))
    memory = planned(Memory(state=b.type_time(v100=1000.0, p100=1000.0, k80=1000.0).build()))
    running = {i for entry in memory.state.previous_assignment for i in entry}  # type: ignore[union-attr]
    codes = why.reason_codes(memory)
    assert running and len(running) < 12
    for k in range(12):
        assert (codes[f"j{k}"] == why.RUNNING) == (k in running)
        assert codes[f"j{k}"] in (why.RUNNING, why.PRIORITY, why.RESOURCES)
