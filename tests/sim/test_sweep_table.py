"""A sweep's result table (sim/sweep_table.py): a row per (policy, variant, rate) in the order the
sweep named them, each seed's figures, their mean, min and max; the plot's line and band are the
same numbers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from common.messages import SweepCellFinished
from sim.sweep_lines import sweep_lines
from sim.sweep_cells import SweepSpec, table_digest
from sim.sweep_ledger import CellResult
from sim.sweep_plan import Figures
from sim.sweep_table import ran_out, sweep_table
from tests.support.plots import band

SPEC = SweepSpec(0, False, {"v100": 2, "p100": 2, "k80": 2}, table_digest(None), window=(2, 6))


def finished(policy: str, rate: float, seed: int, jct_s: float, option: str = "", arrived: int = 40) -> CellResult:
    cell = SPEC.cell(policy, rate, seed, option)
    result = SweepCellFinished(cell.sweep_id, cell.cell_id, "local", jct_s, 0.5 + seed / 10, 4, 4, 1.0, jobs_arrived=arrived)
    return CellResult(cell, result)


# Gavel's -p b a --seeds 0 1 2 -a 0 -b 1 -n 3: rates 0.5 and 1.0; finished in any order
RESULTS = [
    finished(policy, rate, seed, 3600.0 * (10 * k + 4 * rate + seed))
    for seed in (2, 0, 1)
    for rate in (1.0, 0.5)
    for k, policy in enumerate(("a", "b"))
]


def test_a_row_per_policy_and_rate_in_the_sweeps_order_with_each_seed():
    table = sweep_table(RESULTS, policies=("b", "a"))
    assert [(row.policy, row.jobs_per_hour, [s.seed for s in row.seeds]) for row in table] == [
        ("b", 0.5, [0, 1, 2]), ("b", 1.0, [0, 1, 2]), ("a", 0.5, [0, 1, 2]), ("a", 1.0, [0, 1, 2]),
    ]
    row = table[0]  # b at 0.5: 12, 13, 14 hours
    assert (row.mean_jct_s, row.min_jct_s, row.max_jct_s) == (3600.0 * 13, 3600.0 * 12, 3600.0 * 14)
    assert row.mean_utilization == pytest.approx(0.6)
    assert row.as_json(variants=False) == {
        "policy": "b", "jobs_per_hour": 0.5,
        "mean_avg_jct_s": 46800.0, "min_avg_jct_s": 43200.0, "max_avg_jct_s": 50400.0,
        "mean_cluster_utilization": pytest.approx(0.6), "saturated_seeds": [],
        "seeds": [
            {"seed": 0, "avg_jct_s": 43200.0, "cluster_utilization": 0.5, "jobs_arrived": 40, "saturated": False},
            {"seed": 1, "avg_jct_s": 46800.0, "cluster_utilization": 0.6, "jobs_arrived": 40, "saturated": False},
            {"seed": 2, "avg_jct_s": 50400.0, "cluster_utilization": 0.7, "jobs_arrived": 40, "saturated": False},
        ],
    }


def test_a_seed_with_no_measured_job_completed_is_listed_and_left_out_of_the_mean():
    none_done = finished("a", 1.0, 3, -1.0)  # -1: no measured job completed
    (row,) = [r for r in sweep_table([*RESULTS, none_done], ("a", "b")) if (r.policy, r.jobs_per_hour) == ("a", 1.0)]
    assert [s.avg_jct_s for s in row.seeds] == [3600.0 * 4, 3600.0 * 5, 3600.0 * 6, None]
    assert (row.mean_jct_s, row.min_jct_s, row.max_jct_s) == (3600.0 * 5, 3600.0 * 4, 3600.0 * 6)


def test_a_saturated_seed_counts_as_gavel_counts_it_an_infinite_jct_the_plot_leaves_out():
    cell = SPEC.cell("a", 1.0, 3)
    saturated = CellResult(cell, SweepCellFinished(cell.sweep_id, cell.cell_id, "local", jobs_arrived=676, saturated=True))
    assert saturated.figures == Figures(math.inf, 1.0) and saturated.row().avg_jct_s == math.inf
    (row,) = [r for r in sweep_table([*RESULTS, saturated], ("a", "b")) if (r.policy, r.jobs_per_hour) == ("a", 1.0)]
    assert (row.mean_jct_s, row.min_jct_s, row.max_jct_s) == (math.inf, 3600.0 * 4, math.inf)
    assert row.mean_utilization == pytest.approx((0.5 + 0.6 + 0.7 + 1.0) / 4)
    as_json = row.as_json(variants=False)  # JSON has no infinity: null, and the seed named
    assert (as_json["mean_avg_jct_s"], as_json["min_avg_jct_s"], as_json["max_avg_jct_s"]) == (None, 3600.0 * 4, None)
    assert as_json["saturated_seeds"] == [3] and as_json["seeds"][-1]["saturated"] is True
    json.dumps(as_json, allow_nan=False)  # strict JSON: raises on an infinity left in
    (line,) = [line for line in sweep_lines(r.row() for r in [*RESULTS, saturated]) if line.policy == "a"]
    assert line.max_jct_h[line.jobs_per_hour.tolist().index(1.0)] == pytest.approx(6.0)  # the finite seeds only


def test_variants_are_rows_of_their_own_in_the_order_given():
    results = [finished("a", 1.0, 0, 3600.0 * k, option) for k, option in ((1, "x"), (2, "y"))]
    table = sweep_table(results, ("a",), ("y", "x"))
    assert [(row.option, row.mean_jct_s) for row in table] == [("y", 7200.0), ("x", 3600.0)]
    assert table[0].as_json(variants=True)["option"] == "y"


def test_the_plot_draws_the_tables_mean_min_and_max():
    table = sweep_table(RESULTS, ("a", "b"))
    lines = {line.policy: line for line in sweep_lines(r.row() for r in RESULTS)}
    for policy in ("a", "b"):
        rows = [row for row in table if row.policy == policy]
        line = lines[policy]
        assert line.jobs_per_hour.tolist() == [row.jobs_per_hour for row in rows]
        for drawn, of_table in ((line.mean_jct_h, "mean_jct_s"), (line.min_jct_h, "min_jct_s"), (line.max_jct_h, "max_jct_s")):
            assert drawn == pytest.approx(np.array([getattr(row, of_table) / 3600 for row in rows]))


def test_cells_whose_trace_of_n_jobs_ran_out_are_counted():
    results = [finished("a", 1.0, 0, 3600.0, arrived=30), finished("a", 2.0, 0, 3600.0, arrived=29)]
    assert ran_out(results, 30) == 1


def test_the_figures_band_runs_from_the_tables_min_to_its_max_at_each_rate():
    from sim.plots import sweep_figure

    setting = "2 v100, 2 p100, 2 k80, jobs 2-5, preset default, seeds 0, 1, 2"
    fig = sweep_figure([r.row() for r in RESULTS], setting=setting)
    (ax,) = fig.axes
    table = sweep_table(RESULTS, ("a", "b"))
    for i, policy in enumerate(("a", "b")):
        rows = [row for row in table if row.policy == policy]
        assert ax.get_lines()[i].get_ydata().tolist() == pytest.approx([row.mean_jct_s / 3600 for row in rows])
        assert band(ax, i) == {row.jobs_per_hour: (row.min_jct_s / 3600, row.max_jct_s / 3600) for row in rows}
    assert ax.get_xticks().tolist() == [0.5, 1.0]  # Gavel's points, each at a tick
    assert setting in fig.get_suptitle()
