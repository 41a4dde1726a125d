"""Services as OS processes for end-to-end tests: start, stop, kill, read their logs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Every durable queue the services declare (below their exchange): what a run leaves to clean up.
SERVICE_QUEUES = (
    "mechanism.workers", "mechanism.submissions", "mechanism.progress", "mechanism.allocations",
    "mechanism.throughputs", "mechanism.status", "policy.allocation-requests", "estimator.inputs",
    "fleet.commands",
)


class Cluster:
    """Processes of one test, on a private exchange; all killed and cleaned up at the end."""

    def __init__(self, url: str, workdir: Path) -> None:
        self.url = url
        self.exchange = f"gavel-e2e-{uuid.uuid4().hex[:8]}"
        self.workdir = workdir
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("GAVEL_")},
            "GAVEL_AMQP_URL": url,
            "GAVEL_EXCHANGE": self.exchange,
            "GAVEL_LOG_FORMAT": "json",
            "GAVEL_LOG_LEVEL": "info",
            # the mechanism's default journal (and any other default state) under the test's
            # directory, never in the home directory of whoever runs the tests
            "XDG_STATE_HOME": str(workdir),
        }

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(
            [sys.executable, "-m", "services.cli", *args], cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        self.processes[name] = process
        return process

    def gavel(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        """The `gavel` command as a user runs it against this cluster."""
        return subprocess.run(
            [sys.executable, "-m", "services.cli", *args], cwd=ROOT, env=self.env, capture_output=True, text=True,
            timeout=timeout_s,
        )

    def run(self, *args: str) -> str:
        done = self.gavel(*args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def answer(self, *args: str) -> object:
        """A command's ``--json`` answer (it must succeed)."""
        return json.loads(self.run(*args, "--json"))

    def stop(self, name: str) -> None:
        """SIGTERM, and wait: a graceful stop."""
        process = self.processes.pop(name)
        process.terminate()
        process.wait(timeout=30)

    def kill(self, name: str) -> None:
        process = self.processes.pop(name)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)

    def stop_all(self) -> None:
        for process in self.processes.values():
            process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
        self.processes.clear()

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.workdir.glob("*.log")))


def logged(path: Path, event: str) -> list[dict[str, object]]:
    """The JSON events named ``event`` in a service's log (empty if it has none yet)."""
    if not path.exists():
        return []
    records = (json.loads(line) for line in path.read_text().splitlines() if line.startswith("{"))
    return [r for r in records if r.get("event") == event]


def the_line(stderr: str) -> str:
    """A command's one line (the e2e environment asks for info events, which are JSON lines)."""
    lines = [line for line in stderr.strip().splitlines() if not line.startswith("{")]
    assert len(lines) == 1, stderr
    return lines[0]


TRACE_LINE = "{job_type}\tpython3 run.py\tdir\t--num_steps\t1\t{steps}\t1\t1\t-1.000000\t0.000000\n"  # Gavel's 10 columns


async def run_jobs(cluster: Cluster, trace: Path, jobs: list[tuple[str, int]], prefix: str, *, timeout_s: float = 180) -> None:
    """Write ``jobs`` (job type, steps) as a Gavel trace, submit it under ``prefix`` and wait until
    every one has completed (the jobs and the services' logs if not)."""
    import asyncio  # noqa: PLC0415 - only the async tests need it

    from tests.support.waiting import eventually  # noqa: PLC0415

    trace.write_text("".join(TRACE_LINE.format(job_type=t, steps=s) for t, s in jobs))
    await asyncio.to_thread(cluster.run, "submit", "--trace", str(trace), "--id-prefix", prefix, "--no-wait")

    def completed() -> bool:
        rows = cluster.answer("jobs")
        return sum(r["state"] == "completed" for r in rows) == len(jobs)  # type: ignore[union-attr]

    try:
        await eventually(completed, timeout_s=timeout_s, poll_s=0.5)
    except TimeoutError:
        raise AssertionError(f"jobs: {cluster.answer('jobs')}\n{cluster.logs()}") from None
