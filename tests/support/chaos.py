"""Faults for the real-broker chaos test (issue 13, tests/e2e/test_chaos.py): a seeded schedule of
faults, service processes killed, stopped and restarted (the broker restart is
tests/support/rabbit_node.py's), and what the run looked like from outside (every job's end as published, deduplicated by message id)."""

from __future__ import annotations

import json
import random
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from common.bus import Delivery
from common.messages import JobCancelled, JobCompleted, JobFailed, JobRejected
from tests.support.processes import Cluster, logged

# Events a service logs when part of it died; a process may live on after some of them.
CRASH_EVENTS = ("service_crashed", "service_start_failed", "round_loop_crashed", "worker_watch_crashed")
ENDS = (JobCompleted, JobFailed, JobCancelled, JobRejected)


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault: ``kind`` done to ``target`` after ``calm_s`` wall seconds of calm (counted from
    the previous fault's recovery); the target stays down (killed, stopped, or the broker's app
    stopped) for ``down_s`` wall seconds."""

    kind: str  # "kill" (SIGKILL, then restart), "stop" (SIGSTOP, then SIGCONT), "broker" (stop_app, start_app)
    target: str  # a process name, or "broker"
    calm_s: float
    down_s: float

    def __str__(self) -> str:
        what = "restart the broker" if self.kind == "broker" else f"{self.kind} {self.target}"
        return f"{what} after {self.calm_s:.2f} s calm, down {self.down_s:.2f} s"


def fault_schedule(
    seed: int, *, policies: Sequence[str], fleets: Sequence[str], grace_s: float, broker: bool,
) -> list[Fault]:
    """One of each fault, in a seeded order at seeded moments: SIGKILL and restart of the
    mechanism, of one policy replica, of the estimator and of one fleet; SIGSTOP of one fleet for
    longer than the mechanism's grace (so that it is declared lost), then SIGCONT; with
    ``broker``, a broker restart. The same seed gives the same schedule (the wall-clock moments
    the processes meet them at still vary with the machine's load)."""
    rng = random.Random(seed)
    kinds = [
        ("kill", "mechanism"), ("kill", rng.choice(policies)), ("kill", "estimator"),
        ("kill", rng.choice(fleets)), ("stop", rng.choice(fleets)),
    ]
    if broker:
        kinds.append(("broker", "broker"))
    rng.shuffle(kinds)
    faults = []
    for kind, target in kinds:
        calm_s = rng.uniform(0.5, 4.0)
        if kind == "stop":
            down_s = grace_s + rng.uniform(2.0, 4.0)  # past the grace, whatever the heartbeat's phase
        elif kind == "broker":
            down_s = rng.uniform(0.5, 3.0)
        else:
            down_s = rng.uniform(0.0, 2.0)
        faults.append(Fault(kind, target, round(calm_s, 3), round(down_s, 3)))
    return faults


class ChaosCluster(Cluster):
    """A Cluster that remembers how it started each process, to restart it the same way."""

    def __init__(self, url: str, workdir: Path) -> None:
        super().__init__(url, workdir)
        self.argv: dict[str, tuple[str, ...]] = {}
        self.restarts: dict[str, int] = {}

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        self.argv[name] = args
        return super().start(name, *args)

    def restart(self, name: str) -> subprocess.Popen[bytes]:
        self.restarts[name] = self.restarts.get(name, 0) + 1
        return self.start(name, *self.argv[name])

    def signal(self, name: str, sig: signal.Signals) -> None:
        self.processes[name].send_signal(sig)

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def events(self, name: str, event: str) -> int:
        return len(logged(self.log(name), event))

    def dead(self) -> dict[str, int]:
        """Processes that should be running and are not (name -> exit code)."""
        return {name: p.returncode for name, p in self.processes.items() if p.poll() is not None}

    def crashes(self) -> dict[str, list[str]]:
        """Crash events in every process's log (name -> events)."""
        found: dict[str, list[str]] = {}
        for name in self.argv:
            for event in CRASH_EVENTS:
                if self.events(name, event):
                    found.setdefault(name, []).append(event)
        return found

    def resume_all(self) -> None:
        """SIGCONT to every process (a stopped process would not stop at the end of a failed test)."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)


@dataclass
class Ends:
    """Every job's end as the mechanism published it. The mechanism publishes a job's end under
    one message id (``job-end:<id>``), and again after a restart that re-does the boundary: a
    repeat with the same id and the same body is one end; anything else is a second end."""

    by_job: dict[str, set[tuple[str, str, str]]] = field(default_factory=dict)  # job -> {(message id, kind, body)}
    deliveries: int = 0

    async def __call__(self, d: Delivery) -> None:
        m = d.message
        if not isinstance(m, ENDS):
            return
        self.deliveries += 1
        body = json.dumps({k: getattr(m, k) for k in m.__dataclass_fields__}, sort_keys=True, default=str)  # type: ignore[attr-defined]
        self.by_job.setdefault(m.job_id, set()).add((d.envelope.message_id, type(m).__name__, body))  # type: ignore[attr-defined]

    def completed(self) -> set[str]:
        return {job for job, ends in self.by_job.items() if any(kind == "JobCompleted" for _, kind, _ in ends)}

    def not_exactly_once(self) -> dict[str, list[tuple[str, str, str]]]:
        """Jobs with more than one distinct end, or an end that is not a completion."""
        return {
            job: sorted(ends) for job, ends in self.by_job.items()
            if len(ends) != 1 or next(iter(ends))[1] != "JobCompleted"
        }


def chaos_trace(seed: int, jobs: int, span_s: float) -> list[dict[str, object]]:
    """A small trace: ``jobs`` jobs arriving over ``span_s`` seconds (a third of them at once, at
    the start), each 1 to 4 hours of work on one V100 (a few 2-GPU gangs), so that the cluster is
    busy while the faults come."""
    rng = random.Random(seed * 7919 + 1)
    # (job type, GPUs, steps/s on one V100: the shipped table, rounded)
    kinds = [
        ("A3C", 1, 7.2), ("ResNet-18 (batch size 64)", 1, 24.1), ("LM (batch size 20)", 1, 64.7),
        ("Transformer (batch size 64)", 1, 8.6), ("Recommendation (batch size 2048)", 1, 7.5),
        ("ResNet-50 (batch size 64)", 1, 4.4), ("CycleGAN", 1, 4.4), ("ResNet-18 (batch size 64)", 2, 24.1),
    ]
    rows = []
    for n in range(jobs):
        job_type, gpus, rate = kinds[rng.randrange(len(kinds))]
        work_s = rng.uniform(3600.0, 4 * 3600.0)
        arrival_s = 0.0 if n < jobs // 3 else rng.uniform(0.0, span_s)
        rows.append({
            "job_id": f"c{n:02d}", "job_type": job_type, "scale_factor": gpus,
            "total_steps": max(1, int(rate * work_s)), "arrival_time_s": round(arrival_s, 1),
        })
    return sorted(rows, key=lambda r: (r["arrival_time_s"], r["job_id"]))
