"""`gavel sweep`'s report once its cells are done (services/cli/sweep_cmd.py): sweep.csv and
sweep_jct.png in the output directory, the table on stdout (one row per policy and rate: the
average JCT over the window, mean over the seeds with min and max) or everything as JSON
(--json), a note on stderr when a trace of --jobs N ran out before the window's jobs finished,
and the exit (1 when a cell failed or the plot could not be drawn).
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
from dataclasses import dataclass

from services.cli.common import CommandFailed, print_json, print_lines, print_table
from sim.sweep_jobs import ON_DEMAND, measured_jobs, saturated_note
from sim.sweep_ledger import CellResult, SweepBook
from sim.sweep_plan import SweepPlan
from sim.sweep_table import TableRow, finite

PLOT_SEEDS_NAMED = 5  # past this many, the plot's settings line counts the seeds instead of naming them


@dataclass(frozen=True, slots=True)
class SweepSetting:
    """What every cell shared, as the report says it."""

    cluster: str  # "36 v100, 36 p100, 36 k80"
    preset: str
    num_jobs: int  # 0: generated until the window's jobs finish (sim/sweep_jobs.py)
    window: tuple[int, int] | None

    @property
    def measured(self) -> str:
        return measured_jobs(self.window)

    def plot_line(self, seeds: tuple[int, ...]) -> str:
        """The plot's line of settings (the seeds named while they are few)."""
        named = f"seeds {', '.join(map(str, seeds))}" if len(seeds) <= PLOT_SEEDS_NAMED else f"{len(seeds)} seeds"
        return f"{self.cluster}, {self.measured}, preset {self.preset}, {named}"


def report(
    args: argparse.Namespace, out: pathlib.Path, book: SweepBook, plan: SweepPlan, setting: SweepSetting
) -> int:
    from services.cli.simulate_report import plots_failed
    from sim.output import write_sweep_csv
    from sim.sweep_table import ran_out, sweep_table

    order = {cell_id: i for i, cell_id in enumerate(book.cells)}
    done = sorted(book.finished.values(), key=lambda r: (order[r.cell.cell_id]))
    rows = [r.row() for r in done]
    # The numbers first: a plot that cannot be drawn must not cost the sweep's results.
    csv_path = write_sweep_csv(rows, out)
    plot_error = None
    png_path = None
    try:
        from sim.plots import (
            plot_sweep,  # matplotlib: only once there is something to draw
        )

        png_path = plot_sweep(rows, out / "sweep_jct.png", setting=setting.plot_line(plan.seeds))
    except Exception as e:  # noqa: BLE001 - matplotlib fails in many ways; the CSV stands without the plot
        plot_error = f"{type(e).__name__}: {e}"
    failures = list(book.failures.values())
    options = plan.options if plan.options != ("",) else ()
    table = sweep_table(done, plan.policies, plan.options)
    if args.json:
        print_json({
            "out_dir": str(out),
            "table": [row.as_json(bool(options)) for row in table],
            "runs": [_run_json(r, bool(options)) for r in done],
            "failed": [_run_json(r, bool(options)) for r in failures],
        })
    else:
        print_sweep_table(table, setting, bool(options))
        print_lines(["", f"wrote {csv_path}" if plot_error else f"wrote {csv_path} and {png_path}"])
    if setting.window is not None and setting.num_jobs != ON_DEMAND and (short := ran_out(done, setting.num_jobs)):
        note = (
            f"sweep: in {short} of {len(done)} cells all {setting.num_jobs} jobs had arrived before {setting.measured} "
            "finished: Gavel draws jobs until they finish, so its runs would have measured them under more arrivals; "
            "leave --jobs out to do the same"
        )
        print_lines([note], sys.stderr)
    from sim.sweep_cells import describe

    if saturated := [r for r in done if r.result.saturated]:
        first = saturated[0]
        note = (
            f"sweep: {len(saturated)} of {len(done)} cells saturated the cluster, recorded as Gavel records a run its "
            f"timeout stops (an infinite average JCT, utilisation 100%); e.g. {describe(first.cell)}: "
            + saturated_note(first.result.jobs_arrived, first.cell.jobs_per_hour, (first.cell.window_start, first.cell.window_end))
        )
        print_lines([note], sys.stderr)
    if failures:

        first = failures[0]
        raise CommandFailed(
            f"{len(failures)} cell(s) failed, e.g. {describe(first.cell)}: {first.result.error}; "
            f"the others are in {csv_path} (the same command again retries the failed ones)"
        )
    if plot_error:
        raise plots_failed(out, plot_error, skip_hint=False)
    return 0


def _run_json(r: CellResult, variants: bool) -> dict[str, object]:
    f = r.figures
    return {
        "policy": r.cell.policy, **({"option": r.cell.option} if variants else {}),
        "jobs_per_hour": r.cell.jobs_per_hour, "seed": r.cell.seed, "avg_jct_s": finite(f.avg_jct_s),
        "saturated": r.result.saturated,
        "cluster_utilization": f.utilization, "jobs_completed": r.result.jobs_completed,
        "jobs_measured": r.result.jobs_measured, "jobs_arrived": r.result.jobs_arrived, "wall_s": r.result.wall_s,
        "simulator": r.result.simulator, **({"error": r.result.error} if r.result.error else {}),
    }


def print_sweep_table(table: tuple[TableRow, ...], setting: SweepSetting, variants: bool) -> None:
    """One row per policy (and variant) and rate: the average JCT of the measured jobs in hours,
    the mean over the seeds, with their min and max when some point has several, and the
    cluster's utilisation (mean over the seeds)."""
    several = any(len(row.seeds) > 1 for row in table)
    lines = []
    for row in table:
        jct = [_hours(row.mean_jct_s), *((_hours(row.min_jct_s), _hours(row.max_jct_s)) if several else ())]
        utilization = "-" if row.mean_utilization is None else f"{row.mean_utilization:.0%}"
        lines.append([row.policy, *([row.option] if variants else []), f"{row.jobs_per_hour:g}", len(row.seeds), *jct, utilization])
    spread = ", mean over the seeds (min, max)" if several else ""
    print_lines([f"average JCT of {setting.measured} in hours{spread}, on {setting.cluster} (preset {setting.preset})"])
    headers = ["policy", *(["variant"] if variants else []), "jobs/hour", "seeds", "avg JCT", *(["min", "max"] if several else []), "utilisation"]
    print_table(headers, lines)


def _hours(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return "saturated" if math.isinf(seconds) else f"{seconds / 3600:.2f}"
