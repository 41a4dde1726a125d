"""The policy service on every bus: answers, expiry, bad input, replicas, solving off the loop."""

from __future__ import annotations

import numpy as np
import pytest

from common.bus import Delivery
from common.clock import WallClock
from common.messages import (
    AllocationComputed,
    AllocationFailed,
    AllocationRequested,
    EntitySpec,
    PolicyJob,
    PolicyProblem,
    SolveStatus,
)
from policy_service.service import PolicyService, shipped_context
from tests.support.harness import BusHarness
from tests.support.messages import submitted
from tests.support.waiting import Collector, eventually

CONTEXT = shipped_context()
JOB_TYPES = sorted(CONTEXT.table.job_types)  # type: ignore[union-attr]


def problem(n: int, *, seed: int = 0, gpus_per_type: int = 8) -> PolicyProblem:
    rng = np.random.default_rng(seed)
    jobs = []
    for i in range(n):
        sf = int(rng.choice([1, 2, 4, 8], p=[0.7, 0.1, 0.15, 0.05]))
        candidates = [t for t in JOB_TYPES if CONTEXT.table.has_job(t, sf)]  # type: ignore[union-attr]
        jobs.append(
            PolicyJob(
                job_id=str(i),
                job_type=str(rng.choice(candidates)),
                scale_factor=sf,
                priority_weight=1.0,
                steps_remaining=int(rng.integers(1_000, 100_000)),
                time_since_arrival_s=float(rng.uniform(0, 10_000)),
            )
        )
    return PolicyProblem({"v100": gpus_per_type, "p100": gpus_per_type, "k80": gpus_per_type}, tuple(jobs))


def request(request_id: str, policy: str, p: PolicyProblem, *, deadline_s: float = 1e12) -> AllocationRequested:
    return AllocationRequested(request_id, policy, p, deadline_s)


async def start_replica(harness, name: str, solving: str = "inline") -> PolicyService:
    service = PolicyService(clock=WallClock(), context=CONTEXT, solving=solving, name=name)  # type: ignore[arg-type]
    await service.start(await harness.connect(name))
    return service


async def test_a_request_is_answered_with_a_feasible_allocation_correlated_to_it(harness):
    await start_replica(harness, "policy")
    mechanism = await harness.connect("mechanism")
    answers = Collector()
    await mechanism.subscribe("mechanism.allocations", ["allocation.computed", "allocation.failed"], answers)
    p = problem(12)
    message_id = await mechanism.publish(request("r1", "max_min_fairness_packed", p))
    (d,) = await answers.wait_for_count(1)
    reply = d.message
    assert isinstance(reply, AllocationComputed)
    assert (reply.request_id, reply.policy, reply.status) == ("r1", "max_min_fairness_packed", SolveStatus.OPTIMAL)
    assert d.envelope.correlation_id == message_id and d.envelope.source == "policy"
    time_per_job = dict.fromkeys((j.job_id for j in p.jobs), 0.0)
    for entry in reply.entries:
        for job in entry.job_ids:
            time_per_job[job] += sum(entry.fractions.values())
    assert set(time_per_job) == {j.job_id for j in p.jobs}
    assert max(time_per_job.values()) <= 1 + 1e-6 and min(time_per_job.values()) > 0


async def test_an_expired_request_is_answered_not_solved(harness):
    await start_replica(harness, "policy")
    mechanism = await harness.connect("mechanism")
    answers = Collector()
    await mechanism.subscribe("mechanism.allocations", ["allocation.computed", "allocation.failed"], answers)
    await mechanism.publish(request("old", "max_min_fairness_perf", problem(4), deadline_s=WallClock().now_s() - 5))
    (d,) = await answers.wait_for_count(1)
    assert isinstance(d.message, AllocationFailed)
    assert d.message.expired and d.message.request_id == "old" and d.message.reason.startswith("expired: received")


@pytest.mark.parametrize(
    ("policy", "p", "reason"),
    [
        ("max_min_fairnes", problem(3), "unknown policy 'max_min_fairnes'; known policies:"),
        (
            "max_min_fairness_perf",
            PolicyProblem({"v100": 1}, (PolicyJob("9", "GPT-9", 1, 1.0, 10, 0.0),)),
            "jobs[0].job_type: unknown job type 'GPT-9'",
        ),
        (
            "max_min_fairness_water_filling_perf",
            PolicyProblem({"v100": 1}, (PolicyJob("9", "A3C", 1, 1.0, 10, 0.0, entity="nobody"),), entities=(EntitySpec("team"),)),
            "jobs[0].entity",
        ),
    ],
)
async def test_bad_requests_are_answered_with_the_reason(harness, policy, p, reason):
    await start_replica(harness, "policy")
    mechanism = await harness.connect("mechanism")
    answers = Collector()
    await mechanism.subscribe("mechanism.allocations", ["allocation.computed", "allocation.failed"], answers)
    await mechanism.publish(request("bad", policy, p))
    (d,) = await answers.wait_for_count(1)
    assert isinstance(d.message, AllocationFailed) and not d.message.expired
    assert d.message.reason.startswith(reason), d.message.reason


async def test_replicas_share_the_request_queue(harness):
    for name in ("policy-a", "policy-b"):
        await start_replica(harness, name)
    mechanism = await harness.connect("mechanism")
    answers = Collector()
    await mechanism.subscribe("mechanism.allocations", ["allocation.computed"], answers)
    for i in range(12):
        await mechanism.publish(request(f"r{i}", "max_min_fairness_perf", problem(20, seed=i)))
    await answers.wait_for_count(12, timeout_s=60)
    by_replica: dict[str, list[str]] = {}
    for d in answers.deliveries:
        by_replica.setdefault(d.envelope.source, []).append(d.message.request_id)  # type: ignore[attr-defined]
    assert set(by_replica) == {"policy-a", "policy-b"}  # both took a share
    assert sorted(sum(by_replica.values(), [])) == sorted(f"r{i}" for i in range(12))  # each once


@pytest.mark.slow  # ~10-19 s: a large problem solved in a worker process
async def test_the_event_loop_keeps_answering_while_a_large_problem_solves():
    """With solving in a worker process, another handler in the same process runs during a
    2048-job solve; with inline solving it could not run until the solve was over. (The event
    loop is the same whatever the bus, so one in-memory run covers it.)"""
    harness = BusHarness("memory")
    service = await start_replica(harness, "policy", solving="process")
    try:
        mechanism = await harness.connect("mechanism")
        events: list[str] = []

        async def on_answer(d: Delivery) -> None:
            events.append(f"answer:{type(d.message).__name__}")

        async def on_ping(d: Delivery) -> None:
            events.append("ping")

        await mechanism.subscribe("mechanism.allocations", ["allocation.computed", "allocation.failed"], on_answer)
        await mechanism.subscribe("mechanism.pings", ["job.submitted"], on_ping)
        await mechanism.publish(request("big", "finish_time_fairness_packed", problem(2048, gpus_per_type=512)))
        await mechanism.publish(submitted(1))
        await eventually(lambda: len(events) == 2, timeout_s=120)
        assert events == ["ping", "answer:AllocationComputed"]
    finally:
        await service.stop()
        await harness.close()
