"""`gavel sweep --bus amqp --variant ...` as processes on a real broker: each cell carries its
variant's options to a `gavel serve simulator`, which runs a built-in admission policy as `gavel
simulate` does; a variant naming a placement as package.module:Name, which no simulator would run
(it never imports a module a cell names: tests/sim/test_sweep_cell_plugins.py), is refused before
any cell is published. About 5-15 s on 2 shared cores (a simulator and two sweep processes start;
one cell of 8 jobs)."""

from __future__ import annotations

import asyncio
import json

import pytest

from services.cli import main
from sim.sweep_cells import SweepSpec, table_digest
from tests.support.broker import delete_topology
from tests.support.processes import Cluster

pytestmark = pytest.mark.broker

GRID = ("--policies", "fifo", "--rates", "4", "--jobs", "8", "--cluster", "v100=1,k80=1")
SWEEP_ID = SweepSpec(8, False, {"v100": 1, "k80": 1}, table_digest(None)).sweep_id  # variants leave it as it is
LOAD = ("--admission", "load", "--admission-param", "max_load=0.5")
BY_MODULE = "mechanism_service.core.seams.placement_builtins:Spread"  # importable here, not served by the simulator


@pytest.mark.slow  # ~5-15 s (the machine's load): a simulator process, a sweep process of 2 cells of 8 jobs, two runs in-process
async def test_an_amqp_sweeps_cells_carry_their_variants_options(cluster: Cluster, tmp_path, capsys):
    try:
        cluster.start("simA", "serve", "simulator", "--name", "simA")
        refused = await asyncio.to_thread(
            cluster.gavel, "sweep", "--bus", "amqp", *GRID, "--variant", f"load05={' '.join(LOAD)}",
            "--variant", f"module=--placement {BY_MODULE}", "--out", str(tmp_path / "refused"), "--json", timeout_s=120,
        )
        assert (refused.returncode, refused.stdout) == (2, ""), refused.stderr
        assert refused.stderr.strip().endswith(
            f"--bus: amqp: {BY_MODULE} names a module, and a simulator never imports a module a cell names for an "
            "admission, placement or launch; install it as an entry point of gavel.admission, gavel.placement or "
            "gavel.launch on the simulators and name it so (docs/extending.md), or run the sweep here (--bus local)"
        ), refused.stderr
        done = await asyncio.to_thread(
            cluster.gavel, "sweep", "--bus", "amqp", *GRID, "--variant", f"load05={' '.join(LOAD)}",
            "--out", str(tmp_path / "out"), "--json", timeout_s=120,
        )
        assert done.returncode == 0, done.stderr + cluster.logs()
        answer = json.loads(done.stdout)
        (ran,) = answer["runs"]
        assert (ran["option"], ran["simulator"], answer["failed"]) == ("load05", "simA", [])

        simulated = {}
        for name, flags in (("load", LOAD), ("default", ())):
            code = main(["simulate", "--jobs", "8", "--jobs-per-hour", "4", *GRID[-2:], "--policy", "fifo", *flags,
                         "--no-plots", "--out", str(tmp_path / name), "--json"])
            assert code == 0
            simulated[name] = json.loads(capsys.readouterr().out)["avg_jct_s"]
        # the cell ran what simulate runs with the variant's flags, which is not the default run
        assert ran["avg_jct_s"] == pytest.approx(simulated["load"], rel=1e-12) and simulated["load"] != simulated["default"]
    finally:
        cluster.stop_all()
        await delete_topology(cluster.url, cluster.exchange, ("sweep.cells", f"sweep.results.{SWEEP_ID}"))
