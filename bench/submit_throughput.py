"""Job submissions through RabbitMQ: `gavel submit --trace` of 10,000 jobs, and how fast the
mechanism takes them in (consumed, checked for duplicates, journaled, then acknowledged).

Each run (median of 3 reported) uses a private exchange and two scenarios:
- live: a mechanism process (journal on) is up; `gavel submit --trace` publishes the jobs
  (persistent, publisher confirms, a window in flight) while the mechanism ingests them, both
  sharing the machine with the broker. submissions/s = jobs / the publishing phase (and / the
  whole command, process start included); ingest/s = jobs / (all journaled - submit started).
- backlog: the mechanism is down while the trace is submitted (the durable queue keeps it), then
  starts; ingest/s = jobs / (all journaled - first journaled).
"Journaled" is seen by polling the journal every 5 ms (its stamps are arrival times, which keep
the trace's spacing). The command runs with --no-wait: it publishes and returns, as before the
mechanism answered what it made of a batch.

Target (issue 5): >= 5,000 submissions/s.
Usage: python bench/submit_throughput.py [--jobs 10000] [--runs 3] [--amqp URL] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.config import DEFAULT_AMQP_URL  # noqa: E402

TARGET_PER_S = 5_000


POLL_S = 0.005


def journaled(path: Path) -> int:
    """Jobs the mechanism has journaled (committed) so far."""
    try:
        with sqlite3.connect(path) as db:
            return int(db.execute("SELECT COUNT(*) FROM events WHERE kind = 'submitted'").fetchone()[0])
    except sqlite3.Error:
        return 0


def start_mechanism(env: dict[str, str], journal: Path, health: Path, *, wait_ready: bool = True) -> subprocess.Popen[bytes]:
    health.unlink(missing_ok=True)
    mechanism = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "serve", "mechanism", "--journal", str(journal), "--health-file", str(health)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    if not wait_ready:
        return mechanism
    deadline = time.monotonic() + 60
    while not (health.exists() and json.loads(health.read_text() or "{}").get("ready")):
        if time.monotonic() > deadline or mechanism.poll() is not None:
            mechanism.kill()
            raise RuntimeError("the mechanism did not become ready")
        time.sleep(0.05)
    return mechanism


def wait_journaled(journal: Path, jobs: int, timeout_s: float = 120.0) -> tuple[float, float]:
    """(when the first job was journaled, when the last was), Unix seconds, to within POLL_S."""
    deadline = time.monotonic() + timeout_s
    first_s: float | None = None
    while True:
        count = journaled(journal)
        now_s = time.time()
        if count and first_s is None:
            first_s = now_s
        if count >= jobs:
            return first_s or now_s, now_s
        if time.monotonic() > deadline:
            raise RuntimeError(f"the mechanism journaled only {count} of {jobs}")
        time.sleep(POLL_S)


def submit(trace: Path, env: dict[str, str]) -> tuple[float, float]:
    """(the command's wall time, its publishing phase) in seconds."""
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "services.cli", "submit", "--trace", str(trace), "--json", "--no-wait"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    )
    return time.monotonic() - started, float(json.loads(out.stdout)["publish_s"])


def one_run(trace: Path, jobs: int, url: str, workdir: Path) -> dict[str, float]:
    exchange = f"gavel-bench-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "GAVEL_AMQP_URL": url, "GAVEL_EXCHANGE": exchange, "GAVEL_LOG_LEVEL": "warning"}
    health = workdir / f"{exchange}.health"
    mechanism = None
    try:
        live = workdir / f"{exchange}-live.sqlite"
        mechanism = start_mechanism(env, live, health)
        submit_started_s = time.time()
        command_s, publish_s = submit(trace, env)
        _, last_s = wait_journaled(live, jobs)
        mechanism.terminate()
        mechanism.wait(timeout=30)

        # the mechanism's state is per journal: a fresh one for the backlog
        backlog = workdir / f"{exchange}-backlog.sqlite"
        _, backlog_publish_s = submit(trace, env)
        # watched from its start: a backlog is taken in faster than the process reports ready
        mechanism = start_mechanism(env, backlog, health, wait_ready=False)
        first_s, backlog_last_s = wait_journaled(backlog, jobs)
        return {
            "command_per_s": jobs / command_s,
            "publish_per_s": jobs / publish_s,
            "ingest_live_per_s": jobs / (last_s - submit_started_s),
            "publish_no_consumer_per_s": jobs / backlog_publish_s,
            "ingest_backlog_per_s": jobs / (backlog_last_s - first_s),
        }
    finally:
        if mechanism is not None and mechanism.poll() is None:
            mechanism.terminate()
            mechanism.wait(timeout=30)
        from tests.support.broker import delete_topology
        from tests.support.processes import SERVICE_QUEUES

        asyncio.run(delete_topology(url, exchange, SERVICE_QUEUES))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--amqp", default=os.environ.get("GAVEL_AMQP_URL", DEFAULT_AMQP_URL))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from common.config import LogSettings
    from common.log import configure_logging

    configure_logging(LogSettings(level="warning"))  # the cleanup's connection notes are noise here
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        trace = workdir / "trace.trace"
        subprocess.run(
            [sys.executable, "-m", "services.cli", "trace", "generate", "--jobs", str(args.jobs), "--jobs-per-hour", "4",
             "--seed", "0", "--output", str(trace)],
            cwd=ROOT, check=True, capture_output=True,
        )
        runs = [one_run(trace, args.jobs, args.amqp, workdir) for _ in range(args.runs)]
    report = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    report.update(jobs=args.jobs, runs=runs, target_per_s=TARGET_PER_S)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    def verdict(per_s: float) -> str:
        return f">= {TARGET_PER_S:,} " + ("ok" if per_s >= TARGET_PER_S else "MISSED")

    print(f"gavel submit --trace of {args.jobs:,} jobs through RabbitMQ, median of {args.runs}")
    print("  backlog: submitted while the mechanism is down, then taken in")
    print(f"    submissions/s, publishing (persistent, confirmed):   {report['publish_no_consumer_per_s']:>9,.0f}  "
          f"{verdict(report['publish_no_consumer_per_s'])}")
    print(f"    mechanism ingest/s of the backlog:                   {report['ingest_backlog_per_s']:>9,.0f}")
    print("  live: the mechanism ingesting on the same machine while the trace is published")
    print(f"    submissions/s, publishing (persistent, confirmed):   {report['publish_per_s']:>9,.0f}  "
          f"{verdict(report['publish_per_s'])}")
    print(f"    submissions/s, whole command (process start too):    {report['command_per_s']:>9,.0f}")
    print(f"    mechanism ingest/s (consumed, journaled, acked):     {report['ingest_live_per_s']:>9,.0f}")
    print(f"  ({os.cpu_count()} CPUs shared by the broker, the submitter and, when live, the mechanism)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
