"""What-if replay (sim/whatif): a journal read back into what happened, and the replay of its
jobs. Journals come from the real services in virtual time (tests/support/whatif.py: the
mechanism journals as a live one does), or are written event by event where a test needs figures
no simulated fleet would report (each job its own steps/s)."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from common.codec import DEFAULT_CODEC
from common.errors import ReplayError
from common.messages import (
    AllocationComputed,
    JobProgress,
    JobSpec,
    JobSubmitted,
    SolveStatus,
)
from common.messages.base import Message
from mechanism_service.core import audit
from policy_service.service import shipped_context
from sim.whatif.compare import REAL, jain_index, run_figures
from sim.whatif.history import LeaseRun, history_of, read_history
from sim.whatif.real import boundary_lag_s, shifted
from sim.whatif.replay import measured_steps_per_s, setup
from sim.whatif.runs import replay
from tests.support.whatif import POLICY, arriving_trace, journal_of_run

CONTEXT = shipped_context()  # the policy service's: the table and the prices (some policies read them)
TABLE, PRICES = CONTEXT.table, CONTEXT.prices_per_hour
RESNET = "ResNet-18 (batch size 64)"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """12 arriving jobs on 2 GPUs of each type, default preset: (journal, the run's result). ~3 s."""
    path = tmp_path_factory.mktemp("whatif") / "mechanism.sqlite"
    return path, journal_of_run(path, arriving_trace())


def test_the_journal_says_what_the_run_did(run):
    path, result = run
    history = read_history(str(path))
    jcts = {j.job_id: j.jct_s for j in result.jobs}
    assert {j.job_id: history.ends[j.job_id].completion_s - j.arrival_s for j in history.jobs} == pytest.approx(jcts, abs=1e-6)
    assert (history.round_s, history.charges_from_previous_end, history.last_policy) == (360.0, False, POLICY)
    assert history.fleets[-1][1] == {"k80": 2, "p100": 2, "v100": 2}


def test_a_replay_under_the_policy_it_ran_makes_the_real_schedule(run):
    path, result = run
    s = setup(read_history(str(path)), TABLE)
    assert (s.preset, s.policy, s.round_s, s.gpus_per_server, s.window) == ("default", POLICY, 360.0, 1, (0, 12))
    assert s.cells.measured > 0 and s.cells.measured + s.cells.assumed == 12 * 3
    replayed = replay(s, POLICY, PRICES)
    real = shifted(s.real, s.origin_s)
    assert {j.job_id: j.jct_s for j in replayed.jobs} == pytest.approx({j.job_id: j.jct_s for j in result.jobs}, abs=1e-6)
    figures = run_figures(POLICY, replayed, s.table, PRICES, run_figures(REAL, real, s.table, PRICES).avg_jct_s)
    assert figures.avg_jct_vs_real == pytest.approx(1.0, abs=1e-9)
    assert replayed.makespan_s == pytest.approx(real.makespan_s, abs=1e-6)


def test_from_measures_the_later_jobs_and_replays_those_still_running_as_load(run):
    path, _ = run
    history = read_history(str(path))
    first_s = min(j.arrival_s for j in history.jobs)
    later = sorted(history.jobs, key=lambda j: j.arrival_s)[6]
    from_s = later.arrival_s - first_s
    s = setup(history, TABLE, from_s=from_s)
    measured = {j.job_id for j in s.trace[s.window[0]:s.window[1]]}
    assert measured == {j.job_id for j in history.jobs if j.arrival_s >= later.arrival_s}
    load = s.trace[:s.window[0]]
    still_running = {
        j.job_id for j in history.jobs if j.arrival_s < later.arrival_s and history.ends[j.job_id].completion_s > later.arrival_s
    }
    assert {j.job_id for j in load} == still_running and load
    for job in load:  # from T with the steps it had left then, and arriving at T
        credited = sum(n for at_s, job_id, n in history.credited if job_id == job.job_id and at_s <= later.arrival_s)
        total = next(j.total_steps for j in history.jobs if j.job_id == job.job_id)
        assert (job.total_steps, job.arrival_time_s) == (total - credited, later.arrival_s)
    assert any(job.total_steps < next(j.total_steps for j in history.jobs if j.job_id == job.job_id) for job in load)
    assert shifted(s.real, s.origin_s).makespan_s < shifted(setup(history, TABLE).real, first_s).makespan_s


def test_a_journal_that_cannot_be_replayed_says_why(run):
    path, _ = run
    history = read_history(str(path))
    last_s = max(j.arrival_s for j in history.jobs) - min(j.arrival_s for j in history.jobs)
    with pytest.raises(ReplayError, match="--from .*after the last arrival"):
        setup(history, TABLE, from_s=last_s + 1.0)
    submitted_only = history_of([(1, "submitted", _body(JobSubmitted(JobSpec("a", RESNET, 100))), 0.0)])
    with pytest.raises(ReplayError, match="no job finished"):
        setup(submitted_only, TABLE)


# --- a journal written event by event ----------------------------------------------------------


def _body(message: Message) -> bytes:
    return DEFAULT_CODEC.encode(message, source="test", sent_at_s=0.0)


def _lease(lease_id: str, job_id: str, accelerator_type: str, worker: str) -> audit.LeaseRecord:
    return audit.LeaseRecord(lease_id, (job_id,), accelerator_type, ((worker, 0),), False)


def _report(
    job_id: str, lease_id: str, steps: int, rate: float, accelerator_type: str, *, finished: bool, elapsed_s: float,
) -> bytes:
    return _body(JobProgress(
        job_id, "w", lease_id, 0, steps, elapsed_s, rate, finished=finished, accelerator_type=accelerator_type,
    ))


def hand_written_journal() -> list[tuple[int, str, bytes, float | None]]:
    """Two ResNet-18 jobs on a v100 and a k80 worker, rounds of 100 s under the default preset (a
    lease that is not an extension restores for 20 s first). On the v100, a steps at 1.5/s and b
    at 3.0/s: the table says one figure for the type, each job keeps its own. On the k80, a runs
    a fresh lease (50 steps in 20 + 100 s) and an extension that took 30 s beyond its stepping
    (a real worker's checkpoint: 100 steps at 1.0/s in 130 s); b never ran on the k80 (its lease
    there made no step): the table's figure, assumed."""
    workers = (("v100-0", "v100", 1), ("k80-0", "k80", 1))
    round0 = audit.BoundaryRecord(
        1, 0.0, 0, (_lease("0:0", "a", "v100", "v100-0"), _lease("0:1", "b", "k80", "k80-0")), (), workers, None, round_s=100.0,
    )
    round1 = audit.BoundaryRecord(
        1, 120.0, 1, (_lease("1:0", "a", "k80", "k80-0"), _lease("1:1", "b", "v100", "v100-0")), (), None, None, round_s=100.0,
    )
    extension = audit.LeaseRecord("2:0", ("a",), "k80", (("k80-0", 0),), True)
    round2 = audit.BoundaryRecord(1, 240.0, 2, (extension,), (), None, None, round_s=100.0)
    events: list[tuple[str, bytes, float | None]] = [
        ("submitted", _body(JobSubmitted(JobSpec("a", RESNET, 10_000))), 0.0),
        ("submitted", _body(JobSubmitted(JobSpec("b", RESNET, 420, entity="team-x"))), 0.0),
        ("allocation", _body(AllocationComputed("r", POLICY, SolveStatus.OPTIMAL, 0.0, 0.0, ())), None),
        ("boundary", audit.encode_boundary(round0), 0.0),
        ("progress", _report("a", "0:0", 150, 1.5, "v100", finished=False, elapsed_s=120.0), None),
        ("progress", _report("b", "0:1", 0, 1.0, "k80", finished=False, elapsed_s=120.0), None),  # no step: no figure
        ("boundary", audit.encode_boundary(round1), 120.0),
        ("progress", _report("a", "1:0", 50, 0.5, "k80", finished=False, elapsed_s=120.0), None),
        ("progress", _report("b", "1:1", 300, 3.0, "v100", finished=True, elapsed_s=120.0), None),
        ("ended", audit.encode_end(audit.EndRecord("b", "completed", "", 240.0, 1)), 240.0),
        ("boundary", audit.encode_boundary(round2), 240.0),
        ("progress", _report("a", "2:0", 100, 1.0, "k80", finished=False, elapsed_s=130.0), None),
    ]
    return [(seq, kind, body, at_s) for seq, (kind, body, at_s) in enumerate(events, 1)]


def test_each_job_keeps_its_own_measured_steps_per_s():
    history = history_of(hand_written_journal())
    s = setup(history, TABLE)
    assert s.preset == "default"
    rows = {
        j.job_id: {w: s.table.isolated_steps_per_s[(j.job_type, 1, w)] for w in ("k80", "v100")} for j in s.trace
    }
    # a on the k80: 150 steps in (120 - 20) + 130 s, its extension's checkpoint time included
    assert rows == {
        "a": {"v100": 1.5, "k80": pytest.approx(150 / 230)},
        "b": {"v100": 3.0, "k80": TABLE.isolated_steps_per_s[(RESNET, 1, "k80")]},
    }
    assert (s.cells.measured, s.cells.assumed, dict(s.cells.by_source)) == (3, 1, {"measured": 3, "table": 1})
    # jobs of one type with different rows are different kinds in the replay's table; packed,
    # each keeps the share of its own speed that the table's pair of ResNet-18s keeps
    kind = {j.job_id: j.job_type for j in s.trace}
    assert len(set(kind.values())) == 2
    both, alone = TABLE.pair(RESNET, RESNET, 1, "v100"), TABLE.isolated(RESNET, 1, "v100")
    assert s.table.pair(kind["a"], kind["b"], 1, "v100") == pytest.approx((1.5 * both[0] / alone, 3.0 * both[1] / alone))
    assert s.table.pair(kind["b"], kind["a"], 1, "v100") == pytest.approx((3.0 * both[1] / alone, 1.5 * both[0] / alone))
    # b completed at the end of its lease on the v100 (dispatched at 120, 120 s): its JCT is 240 s;
    # a never finished, so it is load, not compared
    assert history.ends["b"].completion_s == pytest.approx(240.0)
    assert s.window == (1, 2) and s.trace[0].job_id == "a"
    assert [j.entity for j in s.trace] == [None, "team-x"]


def test_jains_index():
    assert jain_index(np.array([2.0, 2.0, 2.0, 2.0])) == pytest.approx(1.0)
    assert jain_index(np.array([1.0, 0.0, 0.0, 0.0])) == pytest.approx(0.25)
    assert jain_index(np.array([1.0, 3.0])) == pytest.approx(16 / 20)
    assert jain_index(np.array([])) is None


def test_a_journal_file_that_is_not_one_is_refused(tmp_path: pathlib.Path):
    from common.errors import JournalError

    bad = tmp_path / "not.sqlite"
    bad.write_text("hello")
    with pytest.raises(JournalError, match="not an SQLite database"):
        read_history(str(bad))
    with pytest.raises(JournalError, match="no such journal"):
        read_history(str(tmp_path / "missing.sqlite"))


def test_a_lockstep_journal_s_arrivals_are_the_trace_s():
    """A lockstep mechanism stamps no arrival: the job arrives at its trace time."""
    spec = JobSpec("a", RESNET, 100, submit_time_s=42.0)
    history = history_of([(1, "submitted", _body(JobSubmitted(spec)), None)])
    assert [j.arrival_s for j in history.jobs] == [42.0]


def test_the_boundaries_lag_is_measured_from_what_called_for_each():
    """Job a arrives at -5 and runs at 0 (leases ending at 90 and 100) and at 103 (ending at 200);
    job b arrives at 990 into an idle cluster, runs at 1,000 (ending at 1,090) and at 1,100. The
    lags: 0 - (-5) (woken by a), 103 - 100 (closing the round), 1,000 - 990 (woken by b: the 800 s
    before were idle), 1,100 - 1,090; from 500 on, only b's two."""
    def lease(job_id: str, at_s: float, elapsed_s: float) -> LeaseRun:
        return LeaseRun(f"{at_s}", (job_id,), "v100", 1, at_s, False, (1,), (1.0,), elapsed_s, True, False)

    leases = [
        lease("a", 0.0, 90.0), lease("a", 0.0, 100.0), lease("a", 103.0, 97.0), lease("b", 1_000.0, 90.0),
        lease("b", 1_100.0, 50.0),
    ]
    arrivals = {"a": -5.0, "b": 990.0}
    assert boundary_lag_s(leases, arrivals) == pytest.approx((5.0 + 3.0 + 10.0 + 10.0) / 4)
    assert boundary_lag_s(leases, arrivals, from_s=500.0) == pytest.approx(10.0)
    assert boundary_lag_s([], arrivals) is None


@pytest.mark.slow  # ~6-8 s: a packing policy's run of the services under the gavel preset, and its replay
def test_a_packing_policys_run_is_replayed_exactly_under_the_gavel_preset(tmp_path):
    policy = "max_min_fairness_packed"
    result = journal_of_run(tmp_path / "m.sqlite", arriving_trace(), policy=policy, preset_name="gavel")
    history = read_history(str(tmp_path / "m.sqlite"))
    assert history.packed_leases > 0
    s = setup(history, TABLE)
    assert (s.preset, s.policy) == ("gavel", policy)
    replayed = replay(s, policy, PRICES)
    assert {j.job_id: j.jct_s for j in replayed.jobs} == pytest.approx({j.job_id: j.jct_s for j in result.jobs}, abs=1e-6)


def test_a_boundary_lag_delays_every_boundary():
    """One job alone on one v100 for exactly three full leases (gavel preset: no restore): each
    lease runs d = steps / rate, so its JCT is 3d; with a lag L before each boundary (the first
    woken by its arrival, the others closing a round), 3d + 3L."""
    from mechanism_service.core.settings import preset
    from sim.fastpath import RunConfig, simulate
    from sim.traces import TraceJob

    rate = TABLE.isolated(RESNET, 1, "v100")
    steps = int(rate * 360.0)
    trace = (TraceJob("0", RESNET, 3 * steps, 1, 0.0),)
    jct_s = {
        lag_s: simulate(trace, RunConfig(POLICY, {"v100": 1}, preset("gavel", POLICY), boundary_lag_s=lag_s), CONTEXT).jobs[0].jct_s
        for lag_s in (0.0, 36.0)
    }
    assert jct_s == {0.0: pytest.approx(3 * steps / rate), 36.0: pytest.approx(3 * steps / rate + 3 * 36.0)}


def test_reading_a_long_journal_says_how_far_it_got(monkeypatch):
    import sim.whatif.history as history_module

    monkeypatch.setattr(history_module, "PROGRESS_EVERY", 5)
    said: list[int] = []
    history_of(hand_written_journal(), said.append)
    assert said == [5, 10]  # 12 events


@pytest.mark.slow  # ~4-6 s: a run of the services with the learned estimator, and its replay
def test_cells_never_measured_take_the_estimators_latest_word(tmp_path):
    from sim.learning import EstimationConfig

    unknown = EstimationConfig("learned", unknown_types=("LM (batch size 5)", "CycleGAN"))
    result = journal_of_run(tmp_path / "m.sqlite", arriving_trace(), estimation=unknown)
    history = read_history(str(tmp_path / "m.sqlite"))
    s = setup(history, TABLE)
    assert s.cells.by_source.keys() == {"measured", "estimated"} and s.cells.by_source["estimated"] > 0
    measured = measured_steps_per_s(history.leases, 20.0)  # the default preset's restore
    assumed = [(j, w) for j in s.trace for w in s.cluster if (j.job_id, w) not in measured]
    assert assumed and all(
        s.table.isolated_steps_per_s[(j.job_type, 1, w)] == history.estimates[j.job_id][w] for j, w in assumed
    )
    # the real mechanism learned the rates the replay's knows from the start: close, not exact
    replayed = replay(s, POLICY, PRICES)
    real = {j.job_id: j.jct_s for j in result.jobs}
    mean = sum(j.jct_s for j in replayed.jobs) / len(replayed.jobs)
    assert mean == pytest.approx(sum(real.values()) / len(real), rel=0.05)


def test_the_fleet_follows_its_changes_at_the_next_boundary():
    """One ResNet-18 job for ~3 h on a v100. On one k80 alone; with a v100 joining at 500 s, it
    moves there at the first boundary after (the second, ~720 s) and finishes sooner; with the
    v100 leaving at 500 s instead, it ends on the k80."""
    from mechanism_service.core.settings import preset
    from sim.fastpath import RunConfig, simulate
    from sim.traces import TraceJob

    trace = (TraceJob("0", RESNET, int(TABLE.isolated(RESNET, 1, "v100") * 3 * 3600), 1, 0.0),)
    settings = preset("gavel", POLICY)

    def run(cluster: dict[str, int], changes: tuple = ()):
        return simulate(trace, RunConfig(POLICY, cluster, settings, fleet_changes=changes), CONTEXT)

    def types_used(result) -> list[tuple[str, ...]]:
        return [tuple(w for w, n in r.busy_gpus_by_type.items() if n) for r in result.rounds]

    alone = run({"k80": 1})
    joined = run({"k80": 1}, ((500.0, (("k80", 1), ("v100", 1))),))
    assert set(types_used(alone)) == {("k80",)}
    used = types_used(joined)
    assert used[:2] == [("k80",), ("k80",)] and set(used[2:]) == {("v100",)}
    assert joined.jobs[0].jct_s < alone.jobs[0].jct_s
    left = run({"k80": 1, "v100": 1}, ((500.0, (("k80", 1),)),))
    used = types_used(left)
    assert used[:2] == [("v100",), ("v100",)] and set(used[2:]) == {("k80",)}


def test_a_fleet_that_lost_workers_is_followed_by_the_replay(tmp_path):
    """Two workers crash during the run (sim/faults.py) and register again: the journal's fleet
    changes four times, the replay follows it at its boundaries and never leases more GPUs of a
    type than the fleet had then. ~3 s."""
    result = journal_of_run(tmp_path / "m.sqlite", arriving_trace(), faults="worker-crash=2")
    history = read_history(str(tmp_path / "m.sqlite"))
    assert history.workers_lost == 2
    s = setup(history, TABLE)
    assert s.fleet_changes == tuple(
        (at_s, tuple(fleet.items())) for at_s, fleet in history.fleets if at_s > s.origin_s
    ) and len(s.fleet_changes) == 4
    replayed = replay(s, POLICY, PRICES)
    for r in replayed.rounds:
        in_force = [dict(fleet) for at_s, fleet in s.fleet_changes if at_s - s.origin_s <= r.start_s]
        fleet = in_force[-1] if in_force else s.cluster
        assert all(n <= fleet.get(w, 0) for w, n in r.busy_gpus_by_type.items()), (r.start_s, r.busy_gpus_by_type, fleet)
    real = {j.job_id: j.jct_s for j in result.jobs}
    mean = sum(j.jct_s for j in replayed.jobs) / len(replayed.jobs)
    assert mean == pytest.approx(sum(real.values()) / len(real), rel=0.05)
