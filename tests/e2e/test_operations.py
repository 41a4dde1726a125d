"""Operating the services as processes: any start order, status from the command line, health
files, refusals before publishing, submissions kept while the mechanism is down."""

from __future__ import annotations

import subprocess

import pytest

from common.config import BusSettings
from common.messages import ThroughputEstimated
from common.topology import ESTIMATOR_INPUTS
from common.transport.rabbit import RabbitBus
from tests.support.processes import Cluster
from tests.support.waiting import Collector, eventually

pytestmark = pytest.mark.broker




def gavel(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return cluster.gavel(*args, timeout_s=60)


def status(cluster: Cluster, *args: str) -> object:
    return cluster.answer(*args)


@pytest.mark.slow  # ~12 s: services as processes, status commands
async def test_any_start_order_status_commands_and_health(cluster, tmp_path):
    health = tmp_path / "mechanism.health"
    # the mechanism first: no fleet, no policy, no jobs yet
    cluster.start(
        "mechanism", "serve", "mechanism", "--journal", str(tmp_path / "journal.sqlite"), "--health-file", str(health),
        "--time-scale", "1000",
    )
    await eventually(lambda: gavel(cluster, "health", str(health)).returncode == 0, timeout_s=30, poll_s=0.2)
    assert status(cluster, "cluster")["jobs_active"] == 0
    cluster.start("estimator", "serve", "estimator")
    await eventually(lambda: "host_ready" in (tmp_path / "estimator.log").read_text(), timeout_s=30, poll_s=0.2)

    # a job while no policy service and no worker exists: accepted and kept
    out = gavel(cluster, "submit", "--job-type", "ResNet-18 (batch size 64)", "--steps", "2000", "--job-id", "early")
    assert out.returncode == 0 and out.stdout.strip() == "early", out.stderr
    # no worker yet: the job is held, and says why it waits
    def held() -> bool:
        row = next((r for r in status(cluster, "jobs") if r["id"] == "early"), None)
        return row is not None and row["state"] == "held" and "it waits for workers to join" in row["reason"]

    await eventually(held, timeout_s=30, poll_s=0.3)

    # then the rest
    cluster.start("policy", "serve", "policy", "--solving", "inline")
    cluster.start("fleet", "serve", "fleet", "--cluster", "v100=2,p100=2,k80=2", "--time-scale", "1000")

    def completed() -> bool:
        return any(r["id"] == "early" and r["state"] == "completed" for r in status(cluster, "jobs"))

    await eventually(completed, timeout_s=90, poll_s=0.5)
    job = status(cluster, "job", "early")
    assert job["steps_done"] == job["steps_total"] == 2000
    # (what it ran on, per type, is in `gavel job` while the job is active: docs/estimator.md)
    assert job["rounds_run"] >= 1
    assert sum(span["rounds"] for span in job["placements"]) == job["rounds_run"]
    workers = status(cluster, "workers")
    assert sorted(w["worker_id"] for w in workers) == ["k80-0", "k80-1", "p100-0", "p100-1", "v100-0", "v100-1"]
    cluster_view = status(cluster, "cluster")
    assert cluster_view["capacity_gpus"] == {"k80": 2, "p100": 2, "v100": 2}
    assert cluster_view["last_solve_s"] is not None

    # a submission that skipped the command's checks is refused by the mechanism, with the reason
    # (a job type the table lacks is not a reason: it is scheduled from estimates)
    from common.messages import JobSpec, JobSubmitted

    rogue = RabbitBus(BusSettings(kind="amqp", amqp_url=cluster.url, exchange=cluster.exchange), source="rogue")
    await rogue.start()
    await rogue.publish(JobSubmitted(JobSpec("rogue", "A3C", 0)))
    await rogue.close()

    def refused() -> bool:
        rows = status(cluster, "jobs")
        return any(r["id"] == "rogue" and r["state"] == "rejected" and "total_steps" in r["reason"] for r in rows)

    await eventually(refused, timeout_s=30, poll_s=0.3)


def test_bad_submissions_are_refused_before_publishing(cluster):
    for args, message in (
        # (a job type the table lacks is accepted, with a note: tests/cli/test_cli_submit.py)
        (("--job-type", "A3C", "--steps", "10", "--slo-s", "-1"), "--slo-s: must be > 0, got -1"),
        (("--job-type", "A3C", "--steps", "0"), "--steps: must be >= 1, got 0"),
        (
            ("--job-type", "ResNet-50 (batch size 64)", "--steps", "5", "--scale-factor", "64", "--max-gpus", "8"),
            "--scale-factor: 64 GPUs is more than --max-gpus 8",
        ),
        (("--trace", "/no/such.trace"), "--trace: "),
    ):
        out = gavel(cluster, "submit", *args)
        assert out.returncode == 2, (args, out.stderr)
        lines = [line for line in out.stderr.strip().splitlines() if not line.startswith("{")]  # info events aside
        assert len(lines) == 1 and message in lines[0], (args, lines)


def test_status_without_a_mechanism_says_so(cluster):
    out = gavel(cluster, "jobs", "--timeout-s", "2")
    assert out.returncode == 1
    # (the environment asks for info events, which come before the one line that matters)
    assert out.stderr.strip().splitlines()[-1] == "gavel: the mechanism is not running (nothing receives status requests)"


async def test_the_estimator_sees_jobs_submitted_before_it_ever_ran(cluster):
    """`gavel submit` declares every queue of common.topology.SUBMISSION_QUEUES before it publishes:
    with no estimator running (none ever ran on this exchange), the submission waits in the
    estimator's queue, and an estimator started afterwards takes it and estimates the job."""
    out = gavel(cluster, "submit", "--job-type", "A3C", "--steps", "100", "--job-id", "early", "--no-wait")
    assert out.returncode == 0 and out.stdout.strip() == "early", out.stderr
    bus = RabbitBus(BusSettings(kind="amqp", amqp_url=cluster.url, exchange=cluster.exchange), source="observer")
    await bus.start()
    try:
        assert await bus.consumer_count(ESTIMATOR_INPUTS.name) == 0  # declared by the submit, nobody consuming it
        estimates = Collector()
        await bus.subscribe("observer", [ThroughputEstimated.ROUTING_KEY], estimates, durable=False)
        cluster.start("estimator", "serve", "estimator")

        def estimated() -> bool:
            return any(row.job_id == "early" for m in estimates.messages for row in m.jobs)  # type: ignore[attr-defined]

        try:
            await estimates.wait_until(estimated, timeout_s=30)
        except TimeoutError:
            raise AssertionError(f"the estimator never estimated the job submitted before it\n{cluster.logs()}") from None
    finally:
        await bus.close()
        cluster.stop_all()
