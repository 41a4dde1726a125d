"""The services on the in-memory bus (mechanism, policy, simulated fleet, in virtual time) make
exactly the schedule of the bus-free path that runs the same cores: every job's completion, every
round, every reset."""

from __future__ import annotations

import numpy as np
import pytest

from common.errors import ServiceError
from mechanism_service.core.settings import preset
from policy_service.service import shipped_context
from sim.driver import simulate_services
from sim.fastpath import RunConfig, simulate
from sim.traces import TraceSpec, generate_trace, read_trace
from tests.support.data import REFERENCE

CONTEXT = shipped_context()


def assert_same_schedule(fast, services):
    assert [(j.job_id, j.start_s, j.completion_s, j.steps_done) for j in services.jobs] == [
        (j.job_id, j.start_s, j.completion_s, j.steps_done) for j in fast.jobs
    ]
    assert services.rounds == fast.rounds
    assert (services.resets, services.makespan_s) == (fast.resets, fast.makespan_s)


@pytest.mark.slow  # ~3-10 s a policy: the trace on both engines
@pytest.mark.parametrize("policy", ["max_min_fairness_perf", "max_min_fairness_packed", "fifo", "gandiva"])
async def test_gavel_preset_on_the_static_trace(policy):
    trace = read_trace(REFERENCE / "static_n32_seed0.trace")
    config = RunConfig(policy, {"v100": 4, "p100": 4, "k80": 4}, preset("gavel", policy), seed=0)
    assert_same_schedule(simulate(trace, config, CONTEXT), await simulate_services(trace, config, CONTEXT))


@pytest.mark.slow  # ~6-16 s a policy: the trace on both engines
@pytest.mark.parametrize("policy", ["max_min_fairness", "finish_time_fairness_perf"])
async def test_default_preset_with_arrivals_a_window_and_multi_gpu_gangs(policy):
    spec = TraceSpec(num_jobs=60, jobs_per_hour=3.0, multi_gpu=True)
    trace = generate_trace(spec, CONTEXT.table, np.random.default_rng(7))
    config = RunConfig(
        policy, {"v100": 8, "p100": 4, "k80": 4}, preset("default", policy, gpus_per_server=2), seed=3, window=(10, 40)
    )
    fast = simulate(trace, config, CONTEXT)
    finished = {j.job_id for j in fast.jobs if j.completion_s is not None}
    assert set(fast.measured_job_ids) <= finished  # the window completed
    assert any(j.scale_factor > 1 and j.job_id in finished for j in fast.jobs)  # gangs ran
    assert_same_schedule(fast, await simulate_services(trace, config, CONTEXT))


@pytest.mark.parametrize("name", ["gavel", "default"])
async def test_an_idle_cluster_with_unallocated_jobs_resolves_instead_of_waiting(name):
    """Two jobs finish within 1920 s of the last solve while a third, admitted since, has no
    allocation yet: the idle boundary re-solves (Gavel's rule) instead of stalling."""
    from sim.traces.job import TraceJob

    trace = [
        TraceJob("0", "A3C", 3438, 1, 0.0),
        TraceJob("1", "A3C", 3438, 1, 100.0),
        TraceJob("2", "A3C", 1000, 1, 500.0),
    ]
    config = RunConfig("max_min_fairness_perf", {"k80": 2}, preset(name, "max_min_fairness_perf"), seed=0)
    fast = simulate(trace, config, CONTEXT)
    assert all(j.completion_s is not None for j in fast.jobs)
    assert_same_schedule(fast, await simulate_services(trace, config, CONTEXT))


async def test_the_services_publish_round_and_job_events():
    """What an observer on the bus sees: each round's start and end, every completion."""
    from common.bus import Delivery
    from common.messages import JobCompleted, RoundEnded, RoundStarted

    class Observer:
        name = "observer"

        def __init__(self) -> None:
            self.seen: dict[str, int] = {"round.started": 0, "round.ended": 0, "job.completed": 0}

        async def start(self, bus) -> None:  # noqa: ANN001
            keys = [RoundStarted.ROUTING_KEY, RoundEnded.ROUTING_KEY, JobCompleted.ROUTING_KEY]
            await bus.subscribe("observer", keys, self.observe)

        async def observe(self, d: Delivery) -> None:
            self.seen[d.routing_key] += 1

        async def stop(self) -> None:
            return None

    observer = Observer()
    trace = read_trace(REFERENCE / "static_n32_seed0.trace")
    config = RunConfig("fifo_perf", {"v100": 4, "p100": 4, "k80": 4}, preset("gavel", "fifo_perf"), seed=0)
    result = await simulate_services(trace, config, CONTEXT, observers=[observer])
    assert observer.seen["round.started"] == len(result.rounds)
    assert observer.seen["round.ended"] == len(result.rounds)  # no window: every round also ended
    assert observer.seen["job.completed"] == 32


async def test_a_mechanism_that_crashes_fails_the_simulation_instead_of_ending_it(monkeypatch):
    """A crashed round loop stops the mechanism: the run must say so, not return its jobs so far
    as if the trace were over."""
    from mechanism_service.core import commands as commands_core

    real = commands_core.dispatch
    calls = {"n": 0}

    def dispatch(*args, **kwargs):  # noqa: ANN002, ANN003
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("a bug")
        return real(*args, **kwargs)

    monkeypatch.setattr(commands_core, "dispatch", dispatch)
    trace = read_trace(REFERENCE / "static_n32_seed0.trace")
    config = RunConfig("max_min_fairness_perf", {"v100": 4, "p100": 4, "k80": 4}, preset("default", "max_min_fairness_perf"))
    with pytest.raises(ServiceError, match="the mechanism crashed during the simulation"):
        await simulate_services(trace, config, CONTEXT)


@pytest.mark.slow  # ~8-16 s: two runs on the services
async def test_a_mechanism_that_forgets_as_it_goes_gives_the_same_results(monkeypatch):
    """The simulated mechanism forgets finished jobs and old rounds as a live one does
    (core/retention.py) into the driver's archive: with a rule of 3 jobs and 3 rounds, every job,
    round, solve time and refusal is still in the result, the same as the bus-free path's."""
    import sim.driver
    from mechanism_service.core.retention import Retention

    forgotten = []
    original = sim.driver.Archive.__call__

    def spy(self, what):
        forgotten.append(what)
        original(self, what)

    monkeypatch.setattr(sim.driver, "SIM_RETENTION", Retention(finished_s=None, finished_jobs=3, rounds=3))
    monkeypatch.setattr(sim.driver.Archive, "__call__", spy)
    spec = TraceSpec(num_jobs=40, jobs_per_hour=4.0, multi_gpu=True)
    trace = generate_trace(spec, CONTEXT.table, np.random.default_rng(11))
    config = RunConfig("max_min_fairness", {"v100": 4, "p100": 2, "k80": 2}, preset("default", "max_min_fairness"), seed=1)
    fast = simulate(trace, config, CONTEXT)
    services = await simulate_services(trace, config, CONTEXT)
    assert sum(len(f.jobs) for f in forgotten) >= 30 and sum(len(f.rounds) for f in forgotten) >= 30
    assert_same_schedule(fast, services)
    assert len(services.solve_times_s) == len(fast.solve_times_s)
    assert services.rejected_job_ids == fast.rejected_job_ids


def test_a_job_the_mechanism_runs_again_after_a_restart_is_active_in_the_result_not_also_ended():
    """A job forgotten into the archive, then taken back by a restarted mechanism's replay (it
    ended after the last snapshot), is one job: the mechanism's active one."""
    from mechanism_service.core.model import JobState, new_state
    from mechanism_service.core.retention import Forgotten
    from sim.archive import Archive
    from sim.fastpath import outcomes

    def job(index, steps_done):
        return JobState(index, f"j{index}", "A3C", 1, 1.0, 100, 0.0, steps_done=steps_done, last_finish_s=50.0)

    archive = Archive()
    archive(Forgotten((job(0, 100), job(1, 100)), (), (), 0, ()))
    state = new_state({"k80": 1})
    state.jobs[1] = job(1, 40)  # taken back: running again from its replayed steps
    rows = outcomes(state, archive.completed(state))
    assert [(r.job_id, r.steps_done, r.completion_s) for r in rows] == [("j0", 100, 50.0), ("j1", 40, None)]
    assert archive.take_ended() == ["j0", "j1"] and archive.take_ended() == []
