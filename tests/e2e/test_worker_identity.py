"""Issue 23's first finding on a live cluster of processes over RabbitMQ: a worker started with the
id of a live one (`gavel serve worker --type v100 --worker-id k80-0` while the fleet's k80-0 runs)
is refused with one line and exit 2, the mechanism records the attempt, no phantom V100 is
counted, and the journal keeps every invariant through it (check-journal, I1-I4); a fleet killed
and started again takes its workers' places at once. About 35 s (the scaled clock: 1000x)."""

from __future__ import annotations

import json

import pytest

from tests.support.processes import Cluster, logged, the_line
from tests.support.waiting import eventually

pytestmark = pytest.mark.broker

SCALE = ("--time-scale", "1000")
JOBS = ("one", "two", "three", "four")
STEPS = 20_000


def workers_up(cluster: Cluster) -> int:
    out = cluster.gavel("workers", "--json", "--timeout-s", "2")
    return len(json.loads(out.stdout)) if out.returncode == 0 else -1  # -1: the mechanism is not up yet


def states(cluster: Cluster) -> dict[str, str]:
    return {str(row["id"]): str(row["state"]) for row in cluster.answer("jobs")}  # type: ignore[union-attr]


@pytest.mark.slow  # ~30 s: services as processes, a fleet killed and restarted
async def test_a_live_worker_id_cannot_be_taken_and_a_restart_takes_its_place(cluster, tmp_path):
    journal = tmp_path / "journal.sqlite"
    cluster.start("policy", "serve", "policy", "--solving", "inline")
    cluster.start("mechanism", "serve", "mechanism", "--journal", str(journal), *SCALE)
    cluster.start("fleet", "serve", "fleet", "--cluster", "k80=2", *SCALE)
    await eventually(lambda: workers_up(cluster) == 2, timeout_s=60, poll_s=0.3)

    second = cluster.gavel(
        "serve", "worker", "--type", "v100", "--gpus", "1", "--worker-id", "k80-0", "--checkpoint-dir", str(tmp_path / "ckpt"),
        timeout_s=60,
    )
    assert second.returncode == 2, second.stderr
    assert the_line(second.stderr).startswith(
        "gavel: service 'worker-k80-0' failed to start: worker id 'k80-0' is in use by another live worker process"
    )
    await eventually(lambda: logged(tmp_path / "mechanism.log", "worker_refused"), timeout_s=20, poll_s=0.2)
    report = cluster.answer("cluster")
    assert report["capacity_gpus"] == {"k80": 2}, report  # type: ignore[index]  # no phantom V100
    assert any(key.startswith("k80-0 (another process") for key in report["workers_refused"])  # type: ignore[index, union-attr]

    # the fleet dies while jobs run and is started again: its workers' new processes take their
    # places at once. The jobs are submitted only now, each ~6 s of wall time at x1000 (A3C on a
    # K80), so that they still run when a `gavel jobs` of a busy machine looks (a worker's refusal
    # above can take longer than shorter jobs).
    for job_id in JOBS:
        cluster.run("submit", "--job-type", "A3C", "--steps", str(STEPS), "--job-id", job_id)
    await eventually(lambda: "running" in states(cluster).values(), timeout_s=60, poll_s=0.3)
    cluster.kill("fleet")
    cluster.start("fleet", "serve", "fleet", "--cluster", "k80=2", *SCALE)
    await eventually(lambda: len(logged(tmp_path / "mechanism.log", "worker_restarted")) == 2, timeout_s=60, poll_s=0.3)
    await eventually(lambda: set(states(cluster).values()) == {"completed"}, timeout_s=120, poll_s=0.5)

    check = cluster.gavel("check-journal", str(journal), "--finished", "--json", timeout_s=60)
    assert check.returncode == 0, check.stdout + check.stderr
