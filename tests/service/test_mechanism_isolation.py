"""No single input stops the cluster (issue 9), in one process on the in-memory bus in virtual
time, with the real policy service and the simulated fleet: a job the policy refuses is set aside
and the rest solved again at once; a gang too large for the cluster is held until workers that
fit it join; a cancel ends a job in one terminal state; a worker that cannot join, or a command
nobody can receive, is said and isolated. The same paths over RabbitMQ, as processes, are in
tests/e2e/test_hardening.py."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from common.messages import (
    AllocationFailed,
    AllocationRequested,
    CancelJob,
    JobCancelled,
    JobFailed,
    JobProgress,
    JobRejected,
    JobSpec,
    JobSubmitted,
    RunJobs,
    SubmissionsSealed,
    WorkerRegistered,
)
from common.transport.memory import InMemoryBroker, InMemoryBus
from mechanism_service.config import MechanismConfig
from mechanism_service.core import status as status_core
from mechanism_service.core.rounds import type_shuffler
from mechanism_service.core.settings import preset
from mechanism_service.service import MechanismService
from policy_service import service as policy_module
from policy_service.service import PolicyService
from sim.clock import VirtualClock
from sim.derived_rates import TableReference
from sim.fleet import SimulatedFleet
from tests.support.waiting import Collector
from tests.support.world import CONTEXT, RESNET, TABLE, simulated_world


async def test_a_job_the_policy_refuses_is_set_aside_and_the_rest_solved_again_at_once(monkeypatch) -> None:
    """The policy refuses the problem because of one job (a fault no check caught): that job is
    rejected with the policy's reason, and the others are solved at the same instant."""
    real_answer = policy_module.answer

    def refusing(request: AllocationRequested, context: object) -> object:
        if any(j.job_id == "bad" for j in request.problem.jobs):
            return AllocationFailed(request.request_id, request.policy, "jobs[1].mystery: out of range", refused_job_ids=("bad",))
        return real_answer(request, context)  # type: ignore[arg-type]

    monkeypatch.setattr(policy_module, "answer", refusing)
    w = await simulated_world("max_min_fairness_perf", fleet={"v100": 1, "k80": 1})
    await w.submit(JobSpec("a", RESNET, 500), JobSpec("bad", RESNET, 500), JobSpec("b", "A3C", 500))
    await w.run_until(lambda: w.completed() == {"a", "b"})

    assert w.job_ids(JobRejected) == ["bad"]
    rejected = next(m for m in w.events.messages if isinstance(m, JobRejected))
    assert rejected.reason == "the policy cannot allocate with this job: jobs[1].mystery: out of range"
    first, retry = (d for d in w.requests.deliveries[:2])
    assert (first.message.request_id, retry.message.request_id) == ("0-1", "0-1.1")  # the same boundary
    assert first.envelope.sent_at_s == retry.envelope.sent_at_s
    assert {j.job_id for j in retry.message.problem.jobs} == {"a", "b"}
    last = w.mechanism.memory.observations.last_solve
    assert last is not None and last["status"] == "optimal"


async def test_with_the_policy_failing_the_last_allocation_is_kept_and_new_jobs_run_on_idle_gpus(monkeypatch) -> None:
    """Degraded mode (issue 13): while every solve fails, the allocation in force is kept, a job
    that arrives meanwhile runs on the GPUs it leaves idle, `gavel cluster` says so; the next
    answer ends it."""
    real_answer = policy_module.answer
    failing = {"on": False}

    def flaky(request: AllocationRequested, context: object) -> object:
        if failing["on"]:
            return AllocationFailed(request.request_id, request.policy, "solver crashed")
        return real_answer(request, context)  # type: ignore[arg-type]

    monkeypatch.setattr(policy_module, "answer", flaky)
    w = await simulated_world("max_min_fairness_perf", fleet={"v100": 2, "k80": 1})
    await w.submit(JobSpec("a", RESNET, 3000))
    await w.run_until(lambda: w.mechanism.memory.observations.allocation_solved_at_s is not None)
    failing["on"] = True
    await w.submit(JobSpec("late", "A3C", 300))
    await w.run_until(lambda: w.mechanism.memory.observations.degraded_since_s is not None)
    obs = w.mechanism.memory.observations
    report = status_core.allocation_report(w.mechanism.state, obs)
    assert report["state"] == "degraded" and report["jobs_without_allocation"] == 1 and "idle" in str(report["note"])
    await w.run_until(lambda: "late" in w.completed())  # it ran on what the kept allocation left idle
    assert w.mechanism.memory.observations.degraded_since_s is not None  # still no answer
    failing["on"] = False
    await w.submit(JobSpec("b", RESNET, 300))
    await w.run_until(lambda: {"a", "b"} <= w.completed())
    assert status_core.allocation_report(w.mechanism.state, obs)["state"] == "current"


async def test_a_job_the_broker_refused_is_rejected_to_those_that_got_it() -> None:
    """A submission the broker refused to the mechanism's full queue still reached the
    estimator's: the seal names it, and the mechanism rejects it (the estimator forgets a
    rejected job) unless it knows the id after all."""
    w = await simulated_world("max_min_fairness_perf", fleet={"v100": 1})
    await w.bus.publish(JobSubmitted(JobSpec("a", RESNET, 300), "batch-1"))
    await w.bus.publish(SubmissionsSealed("batch-1", 1, not_accepted=("dropped", "a")))
    await w.run_until(lambda: "a" in w.completed())
    rejected = [m for m in w.events.messages if isinstance(m, JobRejected)]
    assert [(m.job_id, m.reason) for m in rejected] == [("dropped", "not accepted: the submissions queue was full")]


async def test_a_deadline_no_allocation_can_meet_is_its_jobs_fault_alone() -> None:
    """Under an SLO policy a job whose SLO cannot be met even alone makes every solve infeasible:
    it is set aside (never ran: rejected), and the cluster goes on."""
    policy = "max_sum_throughput_normalized_by_cost_perf_SLOs"
    w = await simulated_world(policy, fleet={"v100": 2, "k80": 2})
    await w.submit(JobSpec("a", RESNET, 2000, slo_s=1e6), JobSpec("hopeless", RESNET, 2000, slo_s=1.0), JobSpec("b", "A3C", 1000))
    await w.run_until(lambda: w.completed() == {"a", "b"})

    assert w.job_ids(JobRejected) == ["hopeless"]
    assert "SLOs infeasible: job 'hopeless' needs" in w.mechanism.memory.observations.rejected["hopeless"]


async def test_a_gang_too_large_for_the_cluster_is_held_until_workers_that_fit_it_join() -> None:
    w = await simulated_world("max_min_fairness_perf", elastic=True, fleet={"k80": 2})
    with capture_logs() as logs:
        await w.submit(
            JobSpec("gang", RESNET, 1000, scale_factor=4), JobSpec("small", RESNET, 1000),
            JobSpec("gang8", RESNET, 1000, scale_factor=8),
        )
        await w.run_until(lambda: w.completed() == {"small"} and len(w.mechanism.memory.held) == 2)
    held_events = [e for e in logs if e["event"] == "jobs_held"]  # one per boundary that held jobs
    assert [r for e in held_events for r in e["reasons"]] == [  # each reason with its own jobs (issue 23)
        {
            "reason": f"needs 4 GPUs of one accelerator type where {RESNET!r} runs (here: k80 2): it waits for workers to join",
            "count": 1, "job_ids": ["gang"],
        },
        {
            "reason": f"needs 8 GPUs of one accelerator type where {RESNET!r} runs (here: k80 2): it waits for workers to join",
            "count": 1, "job_ids": ["gang8"],
        },
    ]
    held = dict((j.job_id, why) for j, why in w.mechanism.memory.held)
    assert held["gang"] == f"needs 4 GPUs of one accelerator type where {RESNET!r} runs (here: k80 2): it waits for workers to join"
    assert w.job_ids(JobRejected) == []  # held, not refused: the cluster may grow

    # four V100s join (a second fleet, on a queue of its own): the gang fits now
    await SimulatedFleet(clock=w.clock, table=TABLE, cluster={"v100": 4}, name="fleet-v100").start(w.bus)
    await w.run_until(lambda: "gang" in w.completed())
    assert [j.job_id for j, _ in w.mechanism.memory.held] == ["gang8"]  # 8 do not fit on 4


@pytest.mark.parametrize("policy", ["max_min_fairness_perf", "max_min_fairness_packed"])
async def test_a_job_type_the_simulated_fleet_lacks_runs_at_its_submitters_figures_or_the_typical_jobs(policy: str) -> None:
    """A user's own job type is accepted and scheduled on priors (issue 23): the simulated hardware
    runs it at the steps/s its submitter gave for the type (carried to the fleet in the lease
    command), and a type nobody gave a figure for as the table's typical job; all complete."""
    w = await simulated_world(policy, fleet={"v100": 1, "k80": 1}, estimates=True)
    said = {"v100": 12.5, "k80": 3.1}  # the README's; the typical job's are 12.31 and 3.66
    await w.submit(
        JobSpec("mine", "MyNet", 1000, throughput_estimate_steps_per_s=said), JobSpec("theirs", "OtherNet", 1000),
        JobSpec("a", RESNET, 3000), JobSpec("b", "A3C", 3000),
    )
    await w.run_until(lambda: w.completed() == {"mine", "theirs", "a", "b"})

    assert w.job_ids(JobFailed) == [] and w.job_ids(JobRejected) == []
    reports = [m for m in w.events.messages if isinstance(m, JobProgress) and m.job_id in ("mine", "theirs")]
    typical = TABLE.typical_isolated(1)
    ran = {(m.job_id, m.accelerator_type, m.throughput_steps_per_s) for m in reports if m.steps_done > 0 and not m.packed_with}
    assert {job_id for job_id, _, _ in ran} == {"mine", "theirs"}
    for job_id, w_type, rate in ran:
        assert rate == (said[w_type] if job_id == "mine" else typical[w_type]), (job_id, w_type, rate)
    assert all(m.outcome == "" for m in reports)


async def test_a_gang_of_a_size_the_table_lacks_runs_at_the_nearest_sizes_figure_scaled() -> None:
    """`--scale-factor 3` of a type the table has on 1, 2, 4 and 8 GPUs: the gang of three V100s
    runs at the 4-GPU figure times (3/4)^0.75 (sim/derived_rates.py) and completes."""
    w = await simulated_world("max_min_fairness_perf", fleet={"v100": 4}, estimates=True)
    await w.submit(JobSpec("trio", RESNET, 2000, scale_factor=3))
    await w.run_until(lambda: w.completed() == {"trio"})

    reports = [m for m in w.events.messages if isinstance(m, JobProgress) and m.steps_done > 0]
    assert reports and {m.accelerator_type for m in reports} == {"v100"}
    expected = TABLE.isolated_steps_per_s[(RESNET, 4, "v100")] * (3 / 4) ** 0.75  # 7.62 steps/s
    assert [m.throughput_steps_per_s for m in reports] == pytest.approx([expected] * len(reports))
    assert w.job_ids(JobFailed) == []


async def test_a_packed_lease_with_a_job_the_table_lacks_runs_both_at_the_typical_packed_fraction() -> None:
    """A packed lease of a job its table lacks with one it knows (the estimator's colocation prior
    can ask for one): each member at its rate alone times the fraction the table's pairs keep on
    that type (sim/derived_rates.py); nothing crashes."""
    broker = InMemoryBroker(serialize=True)
    clock = VirtualClock(broker)
    bus = InMemoryBus(broker, clock=clock, source="test")
    await bus.start()
    reports = Collector()
    await bus.subscribe("test.progress", [JobProgress.ROUTING_KEY], reports, durable=False)
    await SimulatedFleet(clock=clock, table=TABLE, cluster={"v100": 1}).start(bus)
    said = ({"v100": 12.5}, {})
    await bus.publish(RunJobs(
        "v100-0", 0, "lease-1", 0, ("mine", "a"), (0,), 360.0, (10**6, 10**6), ("MyNet", "A3C"),
        throughput_estimates_steps_per_s=said,
    ))
    await clock.run_until(lambda: len(reports.messages) == 2, max_time_s=1_000.0)

    fraction = TableReference(TABLE).packed_fraction(1, "v100")  # 0.60
    by_job = {m.job_id: m for m in reports.messages}  # type: ignore[attr-defined]
    mine, a = by_job["mine"], by_job["a"]
    assert (mine.outcome, a.outcome, mine.packed_with, a.packed_with) == ("", "", ("a",), ("mine",))
    assert mine.throughput_steps_per_s == pytest.approx(12.5 * fraction)
    assert a.throughput_steps_per_s == pytest.approx(TABLE.isolated_steps_per_s[("A3C", 1, "v100")] * fraction)
    assert (mine.steps_done, a.steps_done) == (int(12.5 * fraction * 360.0), int(a.throughput_steps_per_s * 360.0))


async def test_a_cancelled_job_ends_once_whether_it_waited_or_ran() -> None:
    w = await simulated_world("max_min_fairness_perf", fleet={"v100": 1})
    await w.submit(JobSpec("long", RESNET, 10**7), JobSpec("later", RESNET, 1000, scale_factor=1))
    # "long" has run (the short "later" may run first: a short job that waits falls behind the
    # fastest; core/catch_up.py), so it has steps to keep when it is cancelled
    await w.run_until(lambda: w.mechanism.state is not None and any(
        j.job_id == "long" and j.steps_done > 0 for j in w.mechanism.state.jobs.values()
    ))
    await w.bus.publish(CancelJob("long", "not needed"))
    await w.bus.publish(CancelJob("long", "asked twice"))
    await w.run_until(lambda: "later" in w.completed() and "long" in w.mechanism.memory.observations.cancelled)

    cancels = [m for m in w.events.messages if isinstance(m, JobCancelled)]
    assert [(m.job_id, m.reason) for m in cancels] == [("long", "not needed")] * len(cancels) and cancels
    assert len({d.envelope.message_id for d in w.events.deliveries if isinstance(d.message, JobCancelled)}) == 1
    row = w.mechanism.memory.observations.cancelled["long"]
    assert row["state"] == "cancelled" and int(row["steps_done"]) > 0  # its steps so far are kept
    assert all(j.job_id != "long" for j in w.mechanism.state.jobs.values())  # type: ignore[union-attr]


async def test_a_worker_that_cannot_join_is_refused_with_a_reason_and_the_rest_runs() -> None:
    w = await simulated_world("max_min_fairness_perf", fleet={"v100": 1})
    await w.bus.publish(WorkerRegistered("odd", "k80", 0, "odd"))
    await w.bus.publish(WorkerRegistered("skewed", "k80", 1, "skewed", clock="scaled x100"))
    await w.submit(JobSpec("a", RESNET, 1000))
    await w.run_until(lambda: w.completed() == {"a"})
    refused = w.mechanism.memory.refused_workers
    assert set(refused) == {"odd"}  # a virtual clock has nothing to compare, so 'skewed' joined
    assert "has 0 GPUs" in refused["odd"]


@pytest.mark.parametrize("worker_clock", ["wall", "scaled x10"])
def test_a_worker_on_another_clock_is_refused(worker_clock: str) -> None:
    from mechanism_service.clocks import ScaledClock

    mechanism = MechanismService(
        MechanismConfig(settings=preset("default", "fifo"), policy="fifo", table=TABLE, shuffle=type_shuffler("default", 0)),
        clock=ScaledClock(100.0),
    )
    problem = mechanism.workers.problem(WorkerRegistered("v100-0", "v100", 1, clock=worker_clock))
    assert problem == (
        f"worker 'v100-0' runs on the {worker_clock} clock and this mechanism on the scaled x100 clock, so its "
        "leases would never end when rounds do: start both with the same --time-scale (or both with --lockstep, or neither)"
    )
    assert mechanism.workers.problem(WorkerRegistered("v100-0", "v100", 1, clock="scaled x100")) == ""
    assert mechanism.workers.problem(WorkerRegistered("v100-0", "v100", 1)) == ""  # an older worker: not checked


async def test_a_command_nobody_can_receive_is_said_and_does_not_stop_the_mechanism() -> None:
    """A worker whose queue is gone (registered, then vanished): its run command is unroutable.
    Raising would stop the round loop, and a restart would republish the same command and stop
    again; instead it is logged and the lease counts as no progress."""
    from structlog.testing import capture_logs

    from tests.support.clock import SteppedClock
    from tests.support.world import live_mechanism

    bus = InMemoryBus(InMemoryBroker(), source="test")
    await bus.start()
    mechanism = live_mechanism(None, SteppedClock())
    await PolicyService(clock=SteppedClock(), context=CONTEXT, solving="inline").start(bus)
    with capture_logs() as logs:
        await mechanism.start(bus)
        await bus.publish(WorkerRegistered("ghost", "v100", 1, "ghost"))
        await bus.publish(JobSubmitted(JobSpec("a", RESNET, 1000)))
        from tests.support.waiting import eventually

        await eventually(lambda: any(e["event"] == "worker_unreachable" for e in logs), timeout_s=20)
    unreachable = next(e for e in logs if e["event"] == "worker_unreachable")
    assert unreachable["worker_id"] == "ghost" and unreachable["action"] == "its lease counts as no progress"
    assert not mechanism.crashed.is_set() and not mechanism.stopped.is_set()
    await mechanism.stop()
    await bus.close()


def test_a_snapshot_from_before_these_fields_is_upgraded_on_load() -> None:
    """A journal written by the previous version: its memory lacks the fields added since."""
    import pickle

    from mechanism_service.core.memory import Memory, upgraded

    old = Memory()
    for name in ("held", "intake", "cancelling", "refused_workers", "policy", "preset"):
        del vars(old)[name]
    vars(old)["known_jobs"] = {"a", "b"}
    vars(old)["sealed"] = 3
    del vars(old.observations)["cancelled"]
    memory = upgraded(pickle.loads(pickle.dumps(old)))
    assert memory.held == [] and memory.cancelling == {} and memory.policy == ""
    assert memory.intake.known == {"a": None, "b": None}  # accepted before specs were kept: absorbed as retries
    assert memory.observations.cancelled == {} and "known_jobs" not in vars(memory)
