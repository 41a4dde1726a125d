"""A sweep cell naming a policy plug-in (sim/sweep_cells.py run_cell): a simulator runs it when it
was started with it (SolveContext.plugins: `gavel serve simulator --policy`) or has it installed,
and answers any other module:Name with the reason, never importing it: a cell is anybody's
message on the bus. The same for a cell's placement, admission or launch named as module:Name. The example package is pip-installed into a temporary directory (~1.5 s).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from policy_service.service import shipped_context
from sim.sweep_cells import SweepSpec, run_cell, table_digest
from tests.support.example_plugins import (
    POLICY_ENTRY_POINT,
    POLICY_REFERENCE,
)

SPEC = SweepSpec(num_jobs=6, multi_gpu=False, cluster={"v100": 2, "p100": 2, "k80": 2}, table_sha256=table_digest(None))


def _contexts(*plugins: str) -> dict[str, object]:
    return {table_digest(None): dataclasses.replace(shipped_context(), plugins=plugins)}


def test_a_cell_runs_a_plugin_the_simulator_serves(on_path: Path) -> None:
    by_reference = run_cell(SPEC.cell(POLICY_REFERENCE, 4.0, 0), _contexts(POLICY_REFERENCE), "sim-a")  # type: ignore[arg-type]
    by_entry_point = run_cell(SPEC.cell(POLICY_ENTRY_POINT, 4.0, 0), _contexts(), "sim-a")  # type: ignore[arg-type]
    assert by_reference.error == by_entry_point.error == ""
    assert by_reference.jobs_completed == 6 and by_reference.avg_jct_s == by_entry_point.avg_jct_s > 0


def test_a_cell_naming_a_module_the_simulator_does_not_serve_is_refused_unimported(
    on_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    marker = tmp_path / "imported"
    (tmp_path / "plugb_cell_side_effect.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass P: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    done = run_cell(SPEC.cell("plugb_cell_side_effect:P", 4.0, 0), _contexts(POLICY_REFERENCE), "sim-a")  # type: ignore[arg-type]
    assert done.error.startswith("PluginError: policy plug-in 'plugb_cell_side_effect:P': not served here")
    # it says what serves a policy on a simulator too, and how to make this one serve it
    assert "a gavel serve simulator answers" in done.error and "(start it with --policy plugb_cell_side_effect:P)" in done.error
    assert not marker.exists() and "plugb_cell_side_effect" not in sys.modules


def test_a_cell_naming_a_seam_by_module_is_refused_unimported(on_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A placement or admission named by entry point runs; by package.module:Name it is refused
    with the reason, its module not imported."""
    marker = tmp_path / "imported"
    (tmp_path / "plugb_seam_side_effect.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass P: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def spec(**mechanism: str) -> SweepSpec:
        return dataclasses.replace(SPEC, scenario_json=json.dumps({"mechanism": [list(kv) for kv in mechanism.items()]}))

    ran = run_cell(spec(placement="fewest_servers", admission="per_entity_jobs").cell("fifo", 4.0, 0), _contexts(), "sim")  # type: ignore[arg-type]
    assert ran.error == "" and ran.jobs_completed == 6
    for seam in ("placement", "admission", "launch"):
        refused = run_cell(spec(**{seam: "plugb_seam_side_effect:P"}).cell("fifo", 4.0, 0), _contexts(), "sim")  # type: ignore[arg-type]
        assert refused.error.startswith(
            f"PluginError: {seam} plug-in 'plugb_seam_side_effect:P': a simulator never imports a module a cell names: "
        ), refused.error
    assert not marker.exists() and "plugb_seam_side_effect" not in sys.modules
    # a local sweep serves the module:Name seams its own flags named (services/cli/sweep_cmd.py)
    served = run_cell(
        spec(placement="gavel_example_plugins.placement:FewestServers").cell("fifo", 4.0, 0),
        _contexts("gavel_example_plugins.placement:FewestServers"), "sim",  # type: ignore[arg-type]
    )
    assert served.error == "" and served.jobs_completed == 6


def test_a_cell_whose_policy_never_answers_is_a_failed_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its jobs would run on the allocation kept in force (degraded mode) and give figures that are
    not the policy's: the cell is answered as failed with the policy's reason, as gavel whatif
    leaves such a replay out."""
    (tmp_path / "plugb_cell_always_raises.py").write_text(
        "class P:\n    name = 'p'\n\n    def allocate(self, problem):\n        raise RuntimeError('no licence')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    done = run_cell(SPEC.cell("plugb_cell_always_raises:P", 4.0, 0), _contexts("plugb_cell_always_raises:P"), "sim-a")  # type: ignore[arg-type]
    assert done.error == (
        "the policy's last solve failed (policy plug-in 'plugb_cell_always_raises:P': allocate raised RuntimeError: "
        "no licence): the run ended on the allocation kept in force"
    )
