"""The mechanism's state as the numbers its metrics export (core/gauges.py), in hand-made
situations built with the real reducers (builders.py). Type ``a`` runs 1/2/4 steps/s on
k80/p100/v100."""

from __future__ import annotations

from common.messages import StragglerFlag
from mechanism_service.core import gauges, why
from mechanism_service.core.admission import NewJob
from mechanism_service.core.memory import Memory
from tests.unit.mechanism.builders import state


def test_an_empty_mechanism_says_every_state_at_zero_and_no_allocation_age():
    g = gauges.read(Memory(), now_s=50.0)
    assert g.jobs == dict.fromkeys(gauges.JOB_STATES, 0)
    assert g.pending == {} and g.gpus == {} and g.allocated_gpus == {}
    assert g.allocation_age_s is None and not g.degraded
    assert g.workers == {"up": 0, "lost": 0, "refused": 0}


def test_jobs_per_state_gpus_per_type_and_the_allocation_in_force():
    # v100 x4 on two workers, k80 x2 on one; j0 runs on 1 v100, j1 (a gang of 2) on 2 v100, j2
    # waits (its share is on the k80s, nobody runs it); j3 ended (completed), j4 failed
    s = (
        state(v100=4, k80=2).job("a").job("a", scale_factor=2).job("a").job("a").job("a")
        .allocate((0,), v100=0.5).allocate((1,), v100=1.0).allocate((2,), k80=0.25)
        .ran((0,), "v100", 0).ran((1,), "v100", 1, 2)
        .build()
    )
    memory = Memory(state=s)
    memory.servers["v100"] += [("v-0", 2), ("v-1", 2)]
    memory.servers["k80"] += [("k-0", 2)]
    memory.lost_workers["k-1"] = {"accelerator_type": "k80", "gpus": 2, "lost_at_s": 5.0, "reason": "silent"}
    memory.refused_workers["x-0"] = "another clock"
    for index, steps in ((3, 1000), (4, 10)):
        done = s.jobs.pop(index)
        done.steps_done = steps
        s.completed.append(done)
    memory.submitted.append(NewJob("later", "a", 1, 100, 900.0, 1.0, None, None))
    memory.held.append((NewJob("huge", "a", 64, 100, 0.0, 1.0, None, None), "no type has 64 GPUs"))
    memory.queued.append((NewJob("over", "a", 1, 100, 0.0, 1.0, None, "team"), "quota: ..."))  # the admission queue
    memory.observations.rejected["bad"] = "unknown type"
    memory.observations.allocation_solved_at_s = 40.0
    memory.cancelling["j0"] = "by its owner"
    memory.book.stragglers["v-1"] = StragglerFlag("v-1", 0.5, 3)

    g = gauges.read(memory, now_s=100.0)

    assert g.jobs == {
        "submitted": 1, "held": 1, "admission": 1, "queued": 1, "running": 1, "retrying": 0, "cancelling": 1, "completed": 1,
        "failed": 1, "cancelled": 0, "rejected": 1,
    }
    assert g.pending == why.pending_counts(memory)
    assert g.pending[why.BEGIN_TIME] == 1 and g.pending[why.HELD] == 1 and why.RUNNING not in g.pending
    assert g.pending[why.ADMISSION] == 1
    assert g.gpus == {
        ("v100", "busy"): 3, ("v100", "idle"): 1, ("v100", "lost"): 0,
        ("k80", "busy"): 0, ("k80", "idle"): 2, ("k80", "lost"): 2,
    }
    assert g.allocated_gpus == {"v100": 0.5 * 1 + 1.0 * 2, "k80": 0.25}  # shares x gang sizes
    assert g.allocation_age_s == 60.0 and not g.degraded
    assert g.workers == {"up": 3, "lost": 1, "refused": 1}
    assert g.speed_ratio == {"v-1": 0.5}


def test_a_kept_allocation_while_the_policy_is_silent_is_degraded_and_ages():
    memory = Memory(state=state(v100=1).job("a").allocate((0,), v100=1.0).ran((0,), "v100", 0).build())
    memory.observations.allocation_solved_at_s = 10.0
    memory.observations.degraded_since_s = 20.0
    g = gauges.read(memory, now_s=70.0)
    assert g.degraded and g.allocation_age_s == 60.0
    assert g.jobs["running"] == 1 and g.gpus == {}  # no worker registered: no GPU to count
