"""A run's directory (summary.json, jobs.csv, plots), a comparison's, and a sweep's (issue 4,
item 5). The shell around sim/metrics.py and sim/plots.py: values in, files out, paths back.

Files:

- ``summary.json``: the run's settings (policy, preset, cluster, round_s, seed, wall_s,
  jobs_total) followed by every Summary field, one flat object, so ``jq .avg_jct_s`` works.
  Undefined statistics are null.
- ``jobs.csv``: one row per job of the run, in the result's order; columns JOB_COLUMNS, then one
  ``gpu_seconds_<type>`` column per accelerator type (the cluster's, then any other a job used),
  then ``dropped`` and ``measured`` (true/false), then, where an admission policy ran
  (docs/mechanism.md, "Seams"), ``admitted_s``. An unknown value (None) is an empty cell.
- ``jct_cdf.png``, ``utilization.png``, ``queue.png``.
- A comparison: ``comparison.json`` (the table's rows and each run's summary.json object),
  ``comparison.txt`` (the table), ``comparison_jct_cdf.png``, ``comparison_utilization.png``.
- A sweep: ``sweep.csv`` (policy, jobs_per_hour, seed, avg_jct_s; option, the variant's label,
  when it has variants) and ``sweep_jct.png``.

``plots=False`` writes the numbers only. sim/plots.py (matplotlib) is imported when a plot is
drawn, not with this module: a run without plots never pays for the plotting stack's import.
``plotter``: a child process that draws them (sim/plot_process.py; `gavel simulate` starts one
before its runs, so that matplotlib's import overlaps the simulation).
"""

from __future__ import annotations

import csv
import json
import os
import pathlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from sim.comparison import compare, render_comparison
from sim.metrics import Summary
from sim.sweep_lines import SweepRow
from sim.results import SimulationResult

if TYPE_CHECKING:
    from sim.plot_process import PlotProcess

JOB_COLUMNS = (
    "job_id",
    "job_type",
    "scale_factor",
    "priority_weight",
    "arrival_s",
    "start_s",
    "completion_s",
    "jct_s",
    "total_steps",
    "steps_done",
)
SWEEP_COLUMNS = ("policy", "jobs_per_hour", "seed", "avg_jct_s")


def run_record(result: SimulationResult, summary: Summary) -> dict[str, object]:
    """What summary.json holds: the run's settings, then the summary's fields."""
    return {
        "policy": result.policy,
        "preset": result.preset,
        "cluster": dict(result.cluster),
        "round_s": result.round_s,
        "seed": result.seed,
        "wall_s": result.wall_s,
        "estimator": result.estimator,
        "unknown_types": list(result.unknown_types),
        "jobs_total": len(result.jobs),
        **summary.as_dict(),
    }


def write_run(
    result: SimulationResult, summary: Summary, out_dir: str | os.PathLike[str], *, plots: bool = True,
    plotter: PlotProcess | None = None,
) -> tuple[pathlib.Path, ...]:
    """Write summary.json, jobs.csv and (with ``plots``) the run's three plots into out_dir
    (created if needed); returns the paths in that order. With a ``plotter`` the plots are
    queued on it (sim/plot_process.py) and exist once its ``finish`` has returned."""
    out = _directory(out_dir)
    written: tuple[pathlib.Path, ...] = (
        _write_json(out / "summary.json", run_record(result, summary)),
        write_jobs_csv(result, out / "jobs.csv"),
    )
    if plots:
        written += (
            _plot(plotter, "plot_jct_cdf", result, out / "jct_cdf.png"),
            _plot(plotter, "plot_utilization", result, out / "utilization.png"),
            _plot(plotter, "plot_queue", result, out / "queue.png"),
        )
    if result.estimation:  # a learned estimator: its error over time, as numbers and as a plot
        written += (write_estimation_csv(result, out / "estimation.csv"),)
        if plots:
            written += (_plot(plotter, "plot_estimation_error", result, out / "estimation_error.png"),)
    return written


def _plot(plotter: PlotProcess | None, name: str, *args: object) -> pathlib.Path:
    """sim.plots.<name>(*args): queued on the plotter, or drawn now."""
    if plotter is not None:
        return plotter.add(name, *args)
    import sim.plots as plots  # noqa: PLC0415 - matplotlib only where plots are drawn

    return getattr(plots, name)(*args)


def write_estimation_csv(result: SimulationResult, path: str | os.PathLike[str]) -> pathlib.Path:
    """One row per solve: time, mean absolute percentage errors alone and packed, and how many
    figures each averages."""
    path = pathlib.Path(path)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(("time_s", "isolated_mape", "colocated_mape", "isolated_figures", "colocated_figures"))
        for s in result.estimation:
            writer.writerow((s.time_s, _cell(s.isolated_mape), _cell(s.colocated_mape), s.isolated_figures, s.colocated_figures))
    return path


def write_comparison(
    results: Mapping[str, SimulationResult],
    summaries: Mapping[str, Summary],
    out_dir: str | os.PathLike[str],
    *,
    plots: bool = True,
    plotter: PlotProcess | None = None,
) -> tuple[pathlib.Path, ...]:
    """Write comparison.json, comparison.txt and (with ``plots``) the two overlay plots into
    out_dir for runs keyed by label (usually the policy name; the same keys in both mappings);
    returns the paths. ``plotter``: as write_run's."""
    if list(results) != list(summaries):
        raise ValueError(f"results and summaries have different keys: {list(results)} vs {list(summaries)}")
    out = _directory(out_dir)
    rows = compare(summaries)
    record = {
        "rows": [row.as_dict() for row in rows],
        "runs": {label: run_record(results[label], summaries[label]) for label in results},
    }
    text_path = out / "comparison.txt"
    text_path.write_text(render_comparison(rows), encoding="utf-8")
    written = (_write_json(out / "comparison.json", record), text_path)
    if not plots:
        return written
    return (
        *written,
        _plot(plotter, "plot_jct_cdf_overlay", dict(results), out / "comparison_jct_cdf.png"),
        _plot(plotter, "plot_utilization_overlay", dict(results), out / "comparison_utilization.png"),
    )


def write_sweep(rows: Iterable[SweepRow], out_dir: str | os.PathLike[str]) -> tuple[pathlib.Path, ...]:
    """Write sweep.csv and sweep_jct.png into out_dir; returns the paths."""
    from sim.plots import plot_sweep

    rows = list(rows)
    csv_path = write_sweep_csv(rows, out_dir)
    return csv_path, plot_sweep(rows, csv_path.parent / "sweep_jct.png")


def write_sweep_csv(rows: Iterable[SweepRow], out_dir: str | os.PathLike[str]) -> pathlib.Path:
    """Write sweep.csv into out_dir (its plot apart: ``write_sweep``); returns its path. The
    ``option`` column (the variant's label) only when the rows have variants, last: a sweep
    without them writes the file it always did, and a reader by position finds its columns."""
    rows = list(rows)
    columns = SWEEP_COLUMNS + (("option",) if any(row.option for row in rows) else ())
    out = _directory(out_dir)
    csv_path = out / "sweep.csv"
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows([_cell(getattr(row, c)) for c in columns] for row in rows)
    return csv_path


def write_jobs_csv(result: SimulationResult, path: str | os.PathLike[str]) -> pathlib.Path:
    """jobs.csv (columns in the module docstring)."""
    path = pathlib.Path(path)
    types = list(result.cluster)
    types += sorted({w for job in result.jobs for w in job.gpu_seconds_by_type} - set(types))
    measured = set(result.measured_job_ids)
    # when each job left the admission queue: only where an admission policy ran (a default
    # run's file stays as it was)
    admitted = any(job.admitted_s is not None for job in result.jobs)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow([
            *JOB_COLUMNS, *(f"gpu_seconds_{w}" for w in types), "dropped", "measured", *(["admitted_s"] if admitted else []),
        ])
        for job in result.jobs:
            writer.writerow(
                [
                    *(_cell(getattr(job, c)) for c in JOB_COLUMNS),
                    *(_cell(float(job.gpu_seconds_by_type.get(w, 0.0))) for w in types),
                    _cell(job.dropped),
                    _cell(job.job_id in measured),
                    *([_cell(job.admitted_s)] if admitted else []),
                ]
            )
    return path


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _directory(out_dir: str | os.PathLike[str]) -> pathlib.Path:
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _write_json(path: pathlib.Path, record: Mapping[str, object]) -> pathlib.Path:
    # allow_nan=False: a NaN that slipped through is a bug to see, not invalid JSON to ship.
    path.write_text(json.dumps(record, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return path
