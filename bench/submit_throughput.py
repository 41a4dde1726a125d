"""Job submissions through RabbitMQ: `gavel submit --trace` of 10,000 jobs, and how fast a running
mechanism takes them in (consumed, checked for duplicates, journaled before acknowledging).

For each of 3 runs (median reported), on a private exchange:
1. a mechanism process (journal on, live mode) is started and given time to attach;
2. `gavel submit --trace` publishes the 10,000 jobs (persistent, publisher confirms, many in
   flight); submissions/s = jobs / the command's wall time, process start included, and jobs /
   its publishing phase alone;
3. the mechanism's ingest rate = jobs / the time until its journal holds all of them.

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
QUEUES = (
    "mechanism.workers", "mechanism.submissions", "mechanism.progress", "mechanism.allocations",
    "mechanism.throughputs", "mechanism.status",
)


def journaled(path: Path) -> int:
    try:
        with sqlite3.connect(path) as db:
            return int(db.execute("SELECT COUNT(*) FROM events WHERE kind = 'submitted'").fetchone()[0])
    except sqlite3.Error:
        return 0


def one_run(trace: Path, jobs: int, url: str, workdir: Path) -> dict[str, float]:
    exchange = f"gavel-bench-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "GAVEL_AMQP_URL": url, "GAVEL_EXCHANGE": exchange, "GAVEL_LOG_LEVEL": "warning"}
    journal = workdir / f"{exchange}.sqlite"
    health = workdir / f"{exchange}.health"
    mechanism = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "serve", "mechanism", "--journal", str(journal), "--health-file", str(health)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (health.exists() and json.loads(health.read_text() or "{}").get("ready")):
            if time.monotonic() > deadline:
                raise RuntimeError("the mechanism did not become ready")
            time.sleep(0.1)
        started = time.monotonic()
        submit = subprocess.run(
            [sys.executable, "-m", "services.cli", "submit", "--trace", str(trace), "--json"],
            cwd=ROOT, env=env, capture_output=True, text=True, check=True,
        )
        submitted = time.monotonic()
        while journaled(journal) < jobs:
            if time.monotonic() - submitted > 120:
                raise RuntimeError(f"the mechanism journaled only {journaled(journal)} of {jobs}")
            time.sleep(0.02)
        ingested = time.monotonic()
        publish_s = json.loads(submit.stdout)["publish_s"]
        return {
            "command_per_s": jobs / (submitted - started),
            "publish_per_s": jobs / publish_s,
            "ingest_per_s": jobs / (ingested - started),
        }
    finally:
        mechanism.terminate()
        mechanism.wait(timeout=30)
        from tests.support.broker import delete_topology

        asyncio.run(delete_topology(url, exchange, QUEUES))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--amqp", default=os.environ.get("GAVEL_AMQP_URL", DEFAULT_AMQP_URL))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
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
    print(f"gavel submit --trace of {args.jobs:,} jobs through RabbitMQ, median of {args.runs}")
    print(f"  submissions/s, whole command (process start included): {report['command_per_s']:>9,.0f}")
    ok = "ok" if report["publish_per_s"] >= TARGET_PER_S else "MISSED"
    print(f"  submissions/s, publishing (persistent, confirmed):     {report['publish_per_s']:>9,.0f}  >= {TARGET_PER_S:,} {ok}")
    print(f"  mechanism ingest/s (consumed, journaled, acked):       {report['ingest_per_s']:>9,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
