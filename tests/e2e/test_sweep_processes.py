"""Issue 26's distributed sweep, as processes on a real broker: 24 cells over RabbitMQ with two
`gavel serve simulator` processes, one SIGKILLed while it holds a cell (the broker hands that
cell to the other), the sweep itself SIGKILLed midway and started again with the same arguments
(it redoes no cell its ledger has); the table equals the local sweep's, line for line. About
15-45 s on 2 shared cores, as loaded (the cells are 20 jobs each; every wait is on a condition: a result in
the ledger, a cell started in a simulator's log, a process's exit)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sim.sweep_cells import SweepSpec, table_digest
from tests.support.broker import delete_topology
from tests.support.processes import Cluster, logged
from tests.support.waiting import eventually

pytestmark = pytest.mark.broker

GRID = (
    "--policies", "fifo_perf,max_min_fairness_perf", "--rates", "2,4,8", "--seeds", "0,1,2,3",
    "--jobs", "20", "--cluster", "2:2:2",
)  # 2 x 3 x 4 = 24 cells
SWEEP_ID = SweepSpec(20, False, {"v100": 2, "p100": 2, "k80": 2}, table_digest(None)).sweep_id  # GRID's


def ledger(out: Path) -> list[dict[str, object]]:
    path = out / "cells.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def holds_a_cell(log: Path) -> bool:
    """The simulator has started a cell it has not finished (with prefetch 1, the one it holds)."""
    return len(logged(log, "cell_started")) > len(logged(log, "cell_finished")) + len(logged(log, "cell_failed"))


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie nobody reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def events_after(log: Path, offset: int, event: str) -> list[dict[str, object]]:
    text = log.read_bytes()[offset:].decode()
    records = (json.loads(line) for line in text.splitlines() if line.startswith("{"))
    return [r for r in records if r.get("event") == event]


@pytest.mark.slow  # ~15-45 s (the machine's load): three sweeps (two over RabbitMQ, one local) of 24 cells of 20 jobs
async def test_a_sweep_over_rabbitmq_survives_a_killed_simulator_and_its_own_restart(cluster: Cluster, tmp_path):
    out = tmp_path / "amqp"
    try:
        cluster.start("simA", "serve", "simulator", "--name", "simA")
        cluster.start("simB", "serve", "simulator", "--name", "simB")
        sweep = cluster.start("sweep1", "sweep", "--bus", "amqp", *GRID, "--out", str(out))

        # a simulator killed while it holds a cell: the broker gives that cell to the other
        await eventually(lambda: len(ledger(out)) >= 4 and holds_a_cell(tmp_path / "simA.log"), timeout_s=60, poll_s=0.02)
        cell_process = children(cluster.processes["simA"].pid)  # the child that runs its cells
        assert cell_process
        cluster.kill("simA")
        await eventually(lambda: not any(alive(pid) for pid in cell_process), timeout_s=10)  # it died with it
        # the sweep killed midway: what its ledger holds is what a restart must not redo
        await eventually(lambda: len(ledger(out)) >= 10, timeout_s=60, poll_s=0.02)
        cluster.kill("sweep1")
        assert sweep.returncode is not None and len(ledger(out)) < 24
        finished_before = {str(entry["cell_id"]) for entry in ledger(out)}
        b_log = tmp_path / "simB.log"
        b_offset = b_log.stat().st_size

        restarted = await asyncio.to_thread(cluster.gavel, "sweep", "--bus", "amqp", *GRID, "--out", str(out), timeout_s=120)
        assert restarted.returncode == 0, restarted.stderr + cluster.logs()
        assert f"{len(finished_before)} cell(s) of this sweep already in the ledger: not run again" in restarted.stderr

        # no cell of the ledger ran again; every cell once in the ledger; the killed cell redelivered
        again = {str(e["cell_id"]) for e in events_after(b_log, b_offset, "cell_started")}
        assert not again & finished_before
        cells = [str(entry["cell_id"]) for entry in ledger(out)]
        assert len(cells) == len(set(cells)) == 24 and {e["sweep_id"] for e in ledger(out)} == {SWEEP_ID}
        assert any(e["redelivered"] for e in logged(b_log, "cell_started"))

        # the same table as the local sweep
        local = await asyncio.to_thread(cluster.gavel, "sweep", *GRID, "--out", str(tmp_path / "local"), timeout_s=120)
        assert local.returncode == 0, local.stderr
        assert (out / "sweep.csv").read_text() == (tmp_path / "local" / "sweep.csv").read_text()
        assert restarted.stdout.splitlines()[:7] == local.stdout.splitlines()[:7]  # the printed table
    finally:
        cluster.stop_all()
        await delete_topology(cluster.url, cluster.exchange, ("sweep.cells", f"sweep.results.{SWEEP_ID}"))
