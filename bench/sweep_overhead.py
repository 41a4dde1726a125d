"""What a sweep over RabbitMQ costs against the local sweep (issue 26, item 6).

The same grid twice, as a user runs it: `gavel sweep` on P local worker processes (the baseline),
then `gavel sweep --bus amqp` with P `gavel serve simulator` processes already running (started
first, on a private exchange; their start-up is not counted, as a researcher's simulators wait for
sweeps). Small cells by default, so what is measured is the protocol's cost per cell (publish,
confirm, start, result, ledger) rather than the simulations'. Printed: each run's wall time, per
cell, the ratio to the local sweep, and whether both wrote the same sweep.csv. The exchange and
queues are deleted afterwards.

Usage: python bench/sweep_overhead.py [--jobs 10] [--seeds 6] [--processes 2] [--amqp URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.config import DEFAULT_AMQP_URL
from sim.sweep_cells import SweepSpec, table_digest
from tests.support.broker import delete_topology

POLICIES = "fifo_perf,max_min_fairness_perf"
RATES = "2,4"
CLUSTER = "2:2:2"


def gavel(env: dict[str, str], *argv: str) -> float:
    """Run one gavel command to its end; its wall time in seconds."""
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "services.cli", *argv], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"gavel {' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - began


def ready(log: Path) -> bool:
    return log.exists() and any('"simulator_ready"' in line for line in log.read_text().splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10, help="jobs per cell (default 10: small cells)")
    parser.add_argument("--seeds", type=int, default=6, help="seeds (default 6: 2 policies x 2 rates x 6 = 24 cells)")
    parser.add_argument("--processes", type=int, default=2, help="local workers, and simulators (default 2)")
    parser.add_argument("--amqp", default=os.environ.get("GAVEL_AMQP_URL", DEFAULT_AMQP_URL))
    args = parser.parse_args()
    seeds = ",".join(str(s) for s in range(args.seeds))
    cells = 2 * 2 * args.seeds
    grid = ("--policies", POLICIES, "--rates", RATES, "--seeds", seeds, "--jobs", str(args.jobs), "--cluster", CLUSTER)
    exchange = f"bench-sweep-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="sweep-overhead-"))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GAVEL_")},
        "GAVEL_AMQP_URL": args.amqp, "GAVEL_EXCHANGE": exchange, "GAVEL_LOG_FORMAT": "json",
        "GAVEL_LOG_LEVEL": "info", "XDG_STATE_HOME": str(work),
    }
    simulators: list[subprocess.Popen[bytes]] = []
    try:
        local_s = gavel(env, "sweep", *grid, "--processes", str(args.processes), "--out", str(work / "local"))
        logs = [work / f"sim{i}.log" for i in range(args.processes)]
        for i, log in enumerate(logs):
            simulators.append(subprocess.Popen(
                [sys.executable, "-m", "services.cli", "serve", "simulator", "--name", f"sim{i}"],
                cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
            ))
        deadline = time.monotonic() + 120
        while not all(ready(log) for log in logs):  # the simulators' own word that they consume
            if time.monotonic() > deadline:
                raise SystemExit("the simulators did not start within 120 s")
            time.sleep(0.1)
        amqp_s = gavel(env, "sweep", "--bus", "amqp", *grid, "--out", str(work / "amqp"))
        same = (work / "local" / "sweep.csv").read_text() == (work / "amqp" / "sweep.csv").read_text()
        report = {
            "cells": cells, "jobs_per_cell": args.jobs, "processes": args.processes,
            "local_s": round(local_s, 2), "amqp_s": round(amqp_s, 2),
            "local_per_cell_s": round(local_s / cells, 3), "amqp_per_cell_s": round(amqp_s / cells, 3),
            "ratio_to_local": round(amqp_s / local_s, 2), "same_sweep_csv": same,
        }
        print(f"{cells} cells of {args.jobs} jobs, {args.processes} local workers vs {args.processes} simulators")
        print(f"local sweep (baseline)       {local_s:6.2f} s  ({local_s / cells:.3f} s a cell)")
        print(f"sweep --bus amqp             {amqp_s:6.2f} s  ({amqp_s / cells:.3f} s a cell)  {amqp_s / local_s:.2f}x the local sweep")
        print(f"same sweep.csv: {same}")
        print(json.dumps(report))
    finally:
        for p in simulators:
            p.terminate()
        for p in simulators:
            p.wait(timeout=30)
        sweep_id = SweepSpec(args.jobs, False, {"v100": 2, "p100": 2, "k80": 2}, table_digest(None)).sweep_id
        asyncio.run(delete_topology(args.amqp, exchange, ("sweep.cells", f"sweep.results.{sweep_id}")))


if __name__ == "__main__":
    main()
