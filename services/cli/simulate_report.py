"""What ``gavel simulate`` writes and prints once its runs are done: the files of each run and of
a comparison (sim/output.py), the plots through the plots' process, the JSON answer, the faults'
files and accounts, the estimation's error, where the files and the services' log went.
"""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING

from services.cli.common import CommandFailed

if TYPE_CHECKING:
    from common.log import LogFile
    from sim.metrics import Summary
    from sim.plot_process import PlotProcess
    from sim.results import SimulationResult

RUN_FILES = ("summary.json", "jobs.csv", "jct_cdf.png", "utilization.png", "queue.png")
ESTIMATION_FILES = ("estimation.csv", "estimation_error.png")  # a learned estimator's error over time
COMPARISON_FILES = ("comparison.txt", "comparison.json", "comparison_jct_cdf.png", "comparison_utilization.png")
PLOT_SUFFIX = ".png"
MAX_VIOLATIONS_SHOWN = 5  # invariant violations printed under a run with faults (faults.json has them all)
FAULT_FILES = ("faults.json", "gpu_occupancy.csv")  # write_faults, per run


def describe_log(log_file: LogFile, *, faults: bool = False) -> str:
    """Where the services' events went, and how many of each level: a fault run's errors are
    mostly the injected faults, which the services log as they would in production."""
    told = "; the services' account of the injected faults" if faults else ""
    return f"the services' log of the run: {log_file.path} ({log_file.summary()}{told})"


def degraded_notes(results: dict[str, SimulationResult]) -> list[str]:
    """A line for each run whose policy's last solve failed: it ended on the allocation kept in
    force (degraded mode), so its figures are that fallback's as much as the policy's."""
    return [
        f"gavel: note: {policy}: its last solve failed ({result.policy_error}); the run ended on the allocation "
        "kept in force, so its figures are not the policy's alone (simulation.log: allocation_degraded)"
        for policy, result in results.items() if result.policy_error
    ]


def write_results(
    results: dict[str, SimulationResult], summaries: dict[str, Summary], out: pathlib.Path, *, plots: bool = True,
    plotter: PlotProcess | None = None,
) -> str | None:
    """The runs' files; with a ``plotter``, its child draws the plots (all written on return).
    Returns why the plots could not be drawn, or None: the other files stand without them, so
    the caller reports the results first and the failure after."""
    from sim.output import write_comparison, write_run
    from sim.plot_process import PlotProcess

    if plots and plotter is None:
        plotter = PlotProcess(None)  # no child: drawn here, at the end, where a failure is caught
    if len(results) == 1:
        (policy,) = results
        write_run(results[policy], summaries[policy], out, plots=plots, plotter=plotter)
    else:
        for policy, result in results.items():
            write_run(result, summaries[policy], out / policy, plots=plots, plotter=plotter)
        write_comparison(results, summaries, out, plots=plots, plotter=plotter)
    if plotter is None:
        return None
    try:
        plotter.finish()
    except Exception as e:  # noqa: BLE001 - matplotlib fails in many ways; the results stand without the plots
        return f"{type(e).__name__}: {e}"
    return None


def plots_failed(out: pathlib.Path, reason: str, *, skip_hint: bool = True) -> CommandFailed:
    """The one line a run whose plots could not be drawn ends with (exit 1); ``skip_hint``: the
    command has --no-plots."""
    hint = " (--no-plots skips the plots)" if skip_hint else ""
    return CommandFailed(f"the plots could not be drawn ({reason}); the other files are in {out}{hint}")


def results_json(
    results: dict[str, SimulationResult], summaries: dict[str, Summary], out: pathlib.Path
) -> dict[str, object]:
    """One policy: summary.json's object; several: comparison.json's; with the output directory."""
    from sim.comparison import compare
    from sim.output import run_record

    def record(policy: str) -> dict[str, object]:
        faults = results[policy].faults
        return run_record(results[policy], summaries[policy]) | ({"faults": faults.as_dict()} if faults is not None else {})

    if len(results) == 1:
        (policy,) = results
        return {"out_dir": str(out), **record(policy)}
    return {
        "out_dir": str(out),
        "rows": [row.as_dict() for row in compare(summaries)],
        "runs": {policy: record(policy) for policy in results},
    }


def write_faults(results: dict[str, SimulationResult], out: pathlib.Path) -> None:
    """faults.json (what was injected, when; the dead letters) and gpu_occupancy.csv (the workers'
    own account of their GPUs), per run, beside summary.json."""
    import csv
    import dataclasses
    import json

    for policy, result in results.items():
        report = result.faults
        if report is None:
            continue
        directory = out if len(results) == 1 else out / policy
        directory.mkdir(parents=True, exist_ok=True)
        record = report.as_dict() | {"events": [dataclasses.asdict(e) for e in report.events]}
        (directory / "faults.json").write_text(json.dumps(record, indent=2) + "\n")
        with open(directory / "gpu_occupancy.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["worker_id", "gpu_index", "lease_id", "round_id", "start_s", "end_s", "ended"])
            for o in report.occupancy:
                writer.writerow([o.worker_id, o.gpu_index, o.lease_id, o.round_id, repr(o.start_s), repr(o.end_s), o.ended])


def describe_faults(policy: str, result: SimulationResult, rest: str) -> str:
    """A person's account of a run's faults: what was injected by kind, what the system did, and
    the command that replays it."""
    from sim.faults import parse_spec, replay_command

    report = result.faults
    assert report is not None
    injected = ", ".join(f"{kind} {n}" for kind, n in report.injected.items() if n) or "none"
    unfinished = sum(1 for j in result.jobs if j.completion_s is None and not j.dropped)
    checked = (
        "invariants: not checked (no journal)" if report.invariants_checked is None
        else f"invariants {', '.join(report.invariants_checked)} checked: {len(report.violations)} violation(s)"
    )
    spec = parse_spec(report.spec)
    return (
        f"{policy}: faults injected: {injected} ({sum(report.injected.values())} in all); mechanism restarts "
        f"{report.mechanism_restarts}" + (f" (journal {report.journal_path})" if report.journal_path else "")
        + f", policy restarts {report.policy_restarts}; dead letters {len(report.dead_letters)}; "
        f"jobs unfinished {unfinished}; {checked}\n"
        + "".join(f"  violated: {v}\n" for v in report.violations[:MAX_VIOLATIONS_SHOWN])
        + f"  replay: {replay_command(spec, report.seed, rest)}"
    )


def describe_estimation(policy: str, summary: Summary) -> str:
    """One line per policy: the estimates' error over the run and at its end."""
    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:.1%}"

    return (
        f"{policy}: estimates the policy used were off by {pct(summary.estimation_isolated_mape)} alone and "
        f"{pct(summary.estimation_colocated_mape)} packed on average (mean absolute percentage error over the solves; "
        f"last tenth: {pct(summary.estimation_isolated_mape_end)} and {pct(summary.estimation_colocated_mape_end)})"
    )


def describe_files(
    out: pathlib.Path, policies: tuple[str, ...], learned: bool = False, plots: bool = True, faults: bool = False
) -> str:
    def kept(names: tuple[str, ...]) -> str:
        return ", ".join(n for n in names if plots or not n.endswith(PLOT_SUFFIX))

    files = RUN_FILES + (ESTIMATION_FILES if learned else ()) + (FAULT_FILES if faults else ())
    if len(policies) == 1:
        return f"wrote {out}/: {kept(files)}"
    return (
        f"wrote {out}/: {kept(COMPARISON_FILES)}\n"
        f"  and per policy, in {out}/<policy>/: {kept(files)}"
    )
