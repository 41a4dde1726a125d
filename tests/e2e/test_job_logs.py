"""`gavel logs` on a running cluster over RabbitMQ (issue 25, item 6): the policy, the mechanism on
the wall clock with 3 s rounds and two real workers as processes; the job is
tests/support/jobs/talker.py (standard library only), which says what it does line by line.

`gavel logs JOB --follow` starts before the job runs, waits for it, and prints it to its end; the
job moves while it runs (its first worker is stopped after its 20th step, and started again once
the job runs on the other one), and `gavel logs JOB` shows both attempts in order, each under its
worker's header, and every step exactly once across them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.broker import delete_topology
from tests.support.processes import ROOT, Cluster
from tests.support.waiting import eventually

pytestmark = pytest.mark.broker

STEPS = 150
TALKER = f"{sys.executable} {ROOT / 'tests/support/jobs/talker.py'} --step-s 0.1"


def start_worker(cluster: Cluster, tmp_path: Path, worker_id: str, accelerator_type: str) -> None:
    cluster.start(
        worker_id, "serve", "worker", "--type", accelerator_type, "--gpus", "1", "--worker-id", worker_id,
        "--checkpoint-dir", str(tmp_path / "ckpt"), "--run-dir", str(tmp_path / f"run-{worker_id}"),
        "--log-dir", str(tmp_path / f"logs-{worker_id}"), "--heartbeat-s", "0.5", "--kill-grace-s", "10",
    )


def logs(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return cluster.gavel("logs", "talk", *args, timeout_s=60)


def step_lines(text: str) -> list[int]:
    return [int(m.group(1)) for m in re.finditer(r"^step (\d+)$", text, re.MULTILINE)]


@pytest.mark.slow  # ~40 s: two worker processes (torch checked at start), 3 s rounds, a worker stopped, lost and started again
async def test_gavel_logs_follows_a_job_that_moves_and_shows_every_attempt(cluster: Cluster, tmp_path: Path) -> None:
    try:
        cluster.start("policy", "serve", "policy", "--solving", "inline")
        cluster.start("mechanism", "serve", "mechanism", "--round-s", "3", "--worker-grace-s", "3")
        start_worker(cluster, tmp_path, "v100-a", "v100")
        await eventually(lambda: '"v100-a"' in cluster.gavel("workers", "--json", "--timeout-s", "2").stdout, 90, poll_s=0.3)

        # nothing ran: one line, exit 1
        never = cluster.gavel("logs", "talk", "--wait-s", "1")
        assert never.returncode == 1 and never.stderr.strip().splitlines()[-1].startswith(
            "gavel: no worker holds output of job 'talk'"
        ), never.stderr

        cluster.run("submit", "--job-type", "A3C", "--steps", str(STEPS), "--job-id", "talk", "--command", TALKER)
        follow_out = (tmp_path / "follow.out").open("w")
        follower = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "logs", "talk", "--follow"], cwd=ROOT, env=cluster.env,
            stdout=follow_out, stderr=subprocess.PIPE, text=True,
        )
        # the job steps on v100-a, the only worker; once past its 20th step that worker stops
        await eventually(lambda: any(n >= 20 for n in step_lines(logs(cluster).stdout)), 60, poll_s=0.3)
        start_worker(cluster, tmp_path, "k80-a", "k80")
        cluster.stop("v100-a")
        # it resumes on k80-a (v100-a is lost after its grace); v100-a comes back meanwhile
        await eventually(lambda: "on k80-a, attempt 1" in logs(cluster).stdout, 90, poll_s=0.3)
        start_worker(cluster, tmp_path, "v100-a", "v100")

        _, err = follower.communicate(timeout=120)
        follow_out.close()
        assert follower.returncode == 0, err
        followed = (tmp_path / "follow.out").read_text()
        shown = logs(cluster)
        assert shown.returncode == 0, shown.stderr
        # every step once, in order, across the attempts; the job said hello at each start
        assert step_lines(shown.stdout) == list(range(1, STEPS + 1)), shown.stdout
        # followed: as it came (the stopped worker's last lines after the next attempt began)
        assert sorted(step_lines(followed)) == list(range(1, STEPS + 1)), followed
        for text in (followed, shown.stdout):
            assert f"bye {STEPS}" in text and text.count("hello talk") >= 2
        headers = [line for line in shown.stdout.splitlines() if line.startswith("==>")]
        assert headers[0].startswith("==> talk on v100-a, attempt 1: started ") and "stopped: the worker is shutting down" in headers[0]
        assert any(h.startswith("==> talk on k80-a, attempt 1: started ") for h in headers[1:]), headers
        # one attempt finished, and it is the last to end (attempts are shown by their start: the
        # returning v100-a may start a lease of a round already over, stopped at once, after it)
        ended = {h: h.split(", ended ")[1][:23] for h in headers}  # the UTC time each attempt ended
        finished = [h for h in headers if h.endswith("finished <==")]
        assert len(finished) == 1 and ended[finished[0]] == max(ended.values()), headers
        # the followed output says when each attempt ended, as it came
        assert re.search(r"^==> talk on v100-a, attempt 1: .*running <==$", followed, re.MULTILINE), followed
        assert re.search(r"^==> talk on .*: ended .*: finished <==$", followed, re.MULTILINE), followed

        tail = logs(cluster, "--tail", "2")
        assert tail.returncode == 0 and tail.stdout.splitlines()[1:] == [f"checkpoint {STEPS}", f"bye {STEPS}"], tail.stdout
    finally:
        cluster.stop_all()
        await delete_topology(cluster.url, cluster.exchange, ("worker.v100-a", "worker.k80-a"))
