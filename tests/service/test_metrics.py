"""Metrics in one process (docs/metrics.md): the policy, the mechanism, the estimator and the
simulated fleet in one host on the in-memory bus in virtual time, one registry served by the
endpoint as `gavel up --metrics-port` serves it; what is scraped moves with what happened."""

from __future__ import annotations

from common.host import ServiceHost
from common.messages import JobProgress, JobSpec, JobSubmitted
from common.metrics import CollectorRegistry, MetricsEndpoint
from common.topology import MECHANISM_SUBMISSIONS
from common.transport.memory import InMemoryBroker, InMemoryBus
from estimator_service.core.oracle import OracleEstimator
from estimator_service.service import EstimatorService
from mechanism_service.config import MechanismConfig
from mechanism_service.core.rounds import type_shuffler
from mechanism_service.core.settings import preset
from mechanism_service.service import MechanismService
from policy_service.service import PolicyService
from sim.clock import VirtualClock
from sim.fleet import SimulatedFleet
from tests.support.scrape import ascrape, total, value
from tests.support.waiting import Collector, until
from tests.support.world import CONTEXT, RESNET, TABLE

POLICY = "max_min_fairness_perf"
JOBS = (JobSpec("a", RESNET, 3000), JobSpec("b", "A3C", 2000), JobSpec("c", RESNET, 1500, scale_factor=2))


async def test_what_is_scraped_moves_with_what_happened() -> None:
    registry = CollectorRegistry(auto_describe=False)
    broker = InMemoryBroker(serialize=True)
    clock = VirtualClock(broker)
    bus = InMemoryBus(broker, clock=clock, source="test")
    mechanism = MechanismService(
        MechanismConfig(
            settings=preset("default", POLICY), policy=POLICY, table=TABLE, shuffle=type_shuffler("default", 0),
            round_timeout_s=None, deadlines=False,
        ),
        clock=clock, registry=registry,
    )
    services = [
        PolicyService(clock=clock, context=CONTEXT, solving="inline", registry=registry),
        mechanism,
        EstimatorService(core=OracleEstimator(TABLE), mode="oracle", registry=registry),
        SimulatedFleet(clock=clock, table=TABLE, cluster={"v100": 2, "k80": 2}, gpus_per_server=2, registry=registry),
    ]
    host = ServiceHost(bus, services, registry=registry, queue_depth_every_s=0.01)
    endpoint = MetricsEndpoint(registry, port=0)
    await endpoint.start()
    await host.start()
    try:
        progress = Collector()
        await bus.subscribe("test.progress", [JobProgress.ROUTING_KEY], progress, durable=False)
        await clock.settle()  # the workers are registered before any job arrives
        for spec in (*JOBS, JOBS[0], JobSpec("huge", RESNET, 100, scale_factor=64)):  # a duplicate, and one refused
            await bus.publish(JobSubmitted(spec))
        await clock.run_until(lambda: len(mechanism.memory.ended_at_s) == len(JOBS) + 1)
        # dead-lettered by both queues it reaches: the mechanism's submissions, the estimator's inputs
        await bus.publish_raw(JobSubmitted.ROUTING_KEY, b"\x00 not a message")
        await clock.settle()

        async def dead_letter_seen() -> bool:
            return value(await ascrape(endpoint.url), "gavel_dead_letter_messages") == 2.0

        await until(dead_letter_seen, timeout_s=20)  # the host reads the depths every 0.01 s
        s = await ascrape(endpoint.url)
    finally:
        await host.stop()
        await endpoint.close()

    memory = mechanism.memory
    for service in ("policy", "mechanism", "estimator", "fleet"):
        assert total(s, "gavel_build_info", service=service) == 1.0, service
    # what happened, counted as it happened
    assert value(s, "gavel_mechanism_submissions_total", outcome="accepted") == 3
    assert value(s, "gavel_mechanism_submissions_total", outcome="duplicate") == 1
    assert value(s, "gavel_mechanism_submissions_total", outcome="rejected") == 1
    assert value(s, "gavel_mechanism_job_ends_total", outcome="completed") == 3
    assert value(s, "gavel_mechanism_job_completion_seconds_count") == 3
    assert value(s, "gavel_mechanism_admission_wait_seconds_count") == 3
    assert value(s, "gavel_mechanism_rounds_total") == memory.round_id > 0
    assert value(s, "gavel_mechanism_round_duration_seconds_count") >= memory.round_id  # type: ignore[operator]
    leases = total(s, "gavel_mechanism_leases_total")
    assert leases >= 3 and value(s, "gavel_mechanism_leases_total", command="run") >= 3  # type: ignore[operator]
    assert total(s, "gavel_worker_leases_total") == leases  # every lease sent was run and reported once
    reports = memory.round_reports  # one a round, made when it settled
    assert leases == sum(r.leases for r in reports)
    assert value(s, "gavel_mechanism_leases_total", command="extend") == sum(r.leases_extended for r in reports)
    round_s = preset("default", POLICY).round_s
    for w in ("v100", "k80"):
        leased = round_s * sum(r.busy_gpus_by_type.get(w, 0) for r in reports)
        assert value(s, "gavel_mechanism_gpu_seconds_total", accelerator_type=w) == leased > 0
    solves = total(s, "gavel_policy_solves_total", policy=POLICY)
    assert solves == value(s, "gavel_policy_solves_total", policy=POLICY, outcome="ok") == len(memory.solve_times_s) > 0
    assert value(s, "gavel_policy_solve_duration_seconds_count", policy=POLICY) == solves
    assert value(s, "gavel_policy_requests_in_flight") == 0
    assert value(s, "gavel_estimator_measurements_total") == len(progress.messages) > 0
    # the fleet runs at the table's speeds, which the oracle estimates: no error
    assert value(s, "gavel_estimator_prediction_error_ratio_count") > 0  # type: ignore[operator]
    assert value(s, "gavel_estimator_prediction_error_ratio_sum") < 1e-9  # type: ignore[operator]
    # what is, read at scrape time
    assert value(s, "gavel_mechanism_jobs", state="completed") == 3
    assert value(s, "gavel_mechanism_jobs", state="rejected") == 1
    assert value(s, "gavel_mechanism_jobs", state="running") == 0
    assert value(s, "gavel_mechanism_gpus", accelerator_type="v100", state="idle") == 2
    assert value(s, "gavel_mechanism_gpus", accelerator_type="v100", state="busy") == 0
    assert value(s, "gavel_mechanism_workers", state="up") == 2
    assert value(s, "gavel_mechanism_policy_degraded") == 0
    assert total(s, "gavel_worker_jobs_running") == 0
    # the host's: what each service refused, what waits
    assert value(s, "gavel_messages_dead_lettered_total", service="mechanism") == 1
    assert value(s, "gavel_messages_dead_lettered_total", service="estimator") == 1
    assert value(s, "gavel_messages_dead_lettered_total", service="policy") == 0
    assert value(s, "gavel_queue_messages", queue=MECHANISM_SUBMISSIONS.name) == 0
