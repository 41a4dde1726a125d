"""Gavel's experiments at their real scale, whole process (issue 27), beside a baseline checkout
and Gavel's own driver.

1. The point: a 5,500-job trace at 1 job/h (Gavel's generator, seed 0), 36:36:36, jobs 4000-4999
   measured, max_min_fairness_perf, seed 0, 360 s rounds: `gavel simulate --trace T --cluster
   36:36:36 --window 4000:5000 --policy max_min_fairness_perf --preset P --no-plots`, exec to exit,
   for both presets (gavel, default). `--baseline DIR` runs the same commands from another checkout
   (a `git worktree` of the commit before the work, e.g. 0a95a86 for issue 27) with the same
   interpreter, PYTHONPATH=DIR and cwd DIR; `--gavel-driver PATH` runs Gavel's trace driver
   (scripts/drivers/simulate_scheduler_with_trace.py of your own checkout of
   stanford-futuredata/gavel at c4fa400, with its own interpreter, ECOS): PATH is an executable
   called with the trace file as its one argument, whose stdout is the driver's (its "Average job
   completion time" line is read). All alternate run by run; medians of --runs (the driver in the
   first --gavel-runs of them: it takes minutes). Checked: jobs.csv byte-identical between this
   tree and the baseline per preset, and the gavel preset's average JCT equal to the driver's.
   Targets: gavel preset >= 10x Gavel's driver, default preset >= 20x.
2. --sweep: Gavel's README sweep (`run_sweep_continuous.py -s 4000 -e 5000 -p max_min_fairness
   max_min_fairness_perf --seeds 0 1 2 -c 36:36:36 -a 0.0 -b 1.0 -n 5`: 2 policies x rates 0.25,
   0.5, 0.75, 1.0 x 3 seeds = 24 points) as `gavel sweep` runs it, once per preset, whole process on
   both cores: `gavel sweep --policies max_min_fairness,max_min_fairness_perf --seeds 0,1,2
   --cluster 36:36:36 --rate-start 0.0 --rate-stop 1.0 --rate-count 5 --window 4000:5000 --jobs N`.
   Gavel's sweep generates each point's jobs in process until jobs 4000-4999 are done; a trace of
   N = 5,500 jobs is never exhausted at these rates (at 1 job/h the window's last job finishes after
   ~5,100 arrivals: part 1 prints the count, and `gavel sweep` notes on stderr a trace that ran out),
   so each cell is Gavel's point. Target <= 180 s per preset. With --baseline the baseline's sweep
   runs too (the gavel preset's took ~35 min before issue 27; --skip-baseline-sweep leaves it out).
3. --large: 20,000 jobs at 4 jobs/h (seed 0) on 120:120:120 under max_min_fairness_packed, default
   preset, every job measured (no window: the issue names none, and stopping at a window would
   leave the trace's tail, the longest stretch of quiet rounds, unsimulated). Target < 60 s.

Times are wall seconds of the whole process; CPU seconds (user + system, with children) are printed
beside them: on a shared machine they are the steadier figure of the work done. Every ratio is
the named reference's median over this tree's.

Usage: python bench/sim_scale.py [--runs 3] [--baseline DIR] [--gavel-driver PATH] [--gavel-runs K]
                                 [--trace FILE] [--presets gavel,default] [--skip-point]
                                 [--sweep] [--sweep-jobs N] [--skip-baseline-sweep]
                                 [--large] [--large-runs K] [--json]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# bench/ is the script's directory, so on sys.path: the whole-process timer is sim_speed's
from sim_speed import ROOT, timed

POINT_JOBS, POINT_RATE_PER_H, POINT_SEED = 5500, 1.0, 0
POINT_FLAGS = ("--cluster", "36:36:36", "--window", "4000:5000", "--policy", "max_min_fairness_perf", "--seed", "0")
POINT_TARGETS = {"gavel": 10.0, "default": 20.0}  # x Gavel's driver, measured beside it
SWEEP_FLAGS = (
    "--policies", "max_min_fairness,max_min_fairness_perf", "--seeds", "0,1,2", "--cluster", "36:36:36",
    "--rate-start", "0.0", "--rate-stop", "1.0", "--rate-count", "5", "--window", "4000:5000",
)
SWEEP_TARGET_S = 180.0
LARGE_JOBS, LARGE_RATE_PER_H, LARGE_SEED = 20000, 4.0, 0
LARGE_FLAGS = ("--cluster", "120:120:120", "--policy", "max_min_fairness_packed", "--preset", "default")
LARGE_TARGET_S = 60.0
DRIVER = "Gavel's driver"
JCT_LINE = re.compile(rb"^Average job completion time: ([0-9.]+) seconds", re.MULTILINE)


def gavel(*args: str) -> list[str]:
    """`gavel ARGS` with this interpreter: from the tree ``in_tree`` names."""
    return [sys.executable, "-m", "services.cli", *args]


def in_tree(tree: Path) -> dict[str, object]:
    """Run from ``tree``: its packages first on the path, its directory the working one."""
    return {"cwd": tree, "env": {**os.environ, "PYTHONPATH": str(tree)}}


def generate(jobs: int, rate_per_h: float, seed: int, path: Path) -> Path:
    """Gavel's trace for ``seed`` (this tree's generator: the same file for every tree)."""
    argv = gavel("trace", "generate", "--jobs", str(jobs), "--jobs-per-hour", str(rate_per_h),
                 "--seed", str(seed), "--output", str(path))
    subprocess.run(argv, stdout=subprocess.DEVNULL, check=True, **in_tree(ROOT))  # type: ignore[call-overload]
    return path


def simulate_run(tree: Path, trace: Path, flags: tuple[str, ...], out: Path) -> dict[str, object]:
    """One `gavel simulate --no-plots` from ``tree``, exec to exit: its times, average JCT, jobs
    arrived and jobs.csv's digest."""
    wall_s, cpu_s = timed(gavel("simulate", "--trace", str(trace), *flags, "--no-plots", "--out", str(out)), **in_tree(tree))
    summary = json.loads((out / "summary.json").read_text())
    return {
        "wall_s": wall_s, "cpu_s": cpu_s, "avg_jct_s": summary["avg_jct_s"], "jobs_total": summary["jobs_total"],
        "jobs_csv_sha256": hashlib.sha256((out / "jobs.csv").read_bytes()).hexdigest(),
    }


def driver_run(driver: Path, trace: Path, tmp: Path) -> dict[str, object]:
    """Gavel's driver on ``trace``, exec to exit; its stdout to a file for its average JCT, its log
    (stderr, tens of MB at this scale) to another, as a user's terminal would take them."""
    stdout, stderr = tmp / "driver.out", tmp / "driver.err"
    try:
        wall_s, cpu_s = timed(["/bin/sh", "-c", 'exec "$0" "$1" >"$2" 2>"$3"', str(driver), str(trace), str(stdout), str(stderr)])
    except subprocess.CalledProcessError as e:
        tail = stderr.read_bytes()[-600:].decode(errors="replace").strip().splitlines()[-3:]
        raise SystemExit(f"sim_scale.py: --gavel-driver {driver} exited with {e.returncode}: " + " | ".join(tail)) from None
    found = JCT_LINE.search(stdout.read_bytes())
    if found is None:
        raise SystemExit(f"sim_scale.py: --gavel-driver {driver} printed no 'Average job completion time' line")
    return {"wall_s": wall_s, "cpu_s": cpu_s, "avg_jct_s": float(found.group(1))}


def medians(runs: list[dict[str, object]]) -> dict[str, object]:
    walls = [float(r["wall_s"]) for r in runs]  # type: ignore[arg-type]
    summary: dict[str, object] = {
        "median_s": statistics.median(walls), "min_s": min(walls),
        "median_cpu_s": statistics.median(float(r["cpu_s"]) for r in runs), "runs_s": walls,  # type: ignore[arg-type]
    }
    for key in ("avg_jct_s", "jobs_total", "jobs_csv_sha256"):
        values = {r[key] for r in runs if key in r}
        if values:  # a run's results never vary between runs; if they did, the report says so
            summary[key] = values.pop() if len(values) == 1 else sorted(values, key=str)
    return summary


def point(args: argparse.Namespace, trees: dict[str, Path], trace: Path) -> dict[str, object]:
    """Part 1: per preset and tree (and Gavel's driver), the runs alternating, their medians."""
    runs: dict[str, list[dict[str, object]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            if args.gavel_driver is not None and run < args.gavel_runs:
                runs.setdefault(DRIVER, []).append(driver_run(args.gavel_driver, trace, Path(tmp)))
            # the trees' order flips each run, so a drift in the machine's load favours none
            order = list(trees.items()) if run % 2 == 0 else list(reversed(trees.items()))
            for preset in args.presets:
                for label, tree in order:
                    out = Path(tmp) / f"{preset}-{label}-{run}"
                    runs.setdefault(f"{preset} {label}", []).append(simulate_run(tree, trace, (*POINT_FLAGS, "--preset", preset), out))
    return {label: medians(r) for label, r in runs.items()}


def sweep(args: argparse.Namespace, trees: dict[str, Path]) -> dict[str, object]:
    """Part 2: the README sweep per preset (and tree), once each."""
    report: dict[str, object] = {}
    for preset in args.presets:
        for label, tree in trees.items():
            if label != "this" and args.skip_baseline_sweep:
                continue
            with tempfile.TemporaryDirectory() as tmp:
                jobs = ("--jobs", str(args.sweep_jobs)) if args.sweep_jobs else ()  # 0: as Gavel, until the window is done
                argv = gavel("sweep", *SWEEP_FLAGS, *jobs, "--preset", preset, "--out", tmp)
                wall_s, cpu_s = timed(argv, **in_tree(tree))
                with (Path(tmp) / "sweep.csv").open(newline="") as f:
                    rows = sorted((r["policy"], float(r["jobs_per_hour"]), int(r["seed"]), r["avg_jct_s"]) for r in csv.DictReader(f))
            report[f"{preset} {label}"] = {"wall_s": wall_s, "cpu_s": cpu_s, "cells": len(rows), "rows": rows}
    return report


def large(args: argparse.Namespace, trees: dict[str, Path], trace: Path) -> dict[str, object]:
    """Part 3: the 20,000-job run per tree, alternating, medians of --large-runs."""
    runs: dict[str, list[dict[str, object]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.large_runs):
            for label, tree in (list(trees.items()) if run % 2 == 0 else list(reversed(trees.items()))):
                runs.setdefault(label, []).append(simulate_run(tree, trace, LARGE_FLAGS, Path(tmp) / f"{label}-{run}"))
    return {label: medians(r) for label, r in runs.items()}


def ratio(reference: dict[str, object] | None, this: dict[str, object]) -> str:
    """'reference / this' on the median wall time (and on CPU time), or '' without a reference."""
    if reference is None:
        return ""
    wall = float(reference["median_s"]) / float(this["median_s"])  # type: ignore[arg-type]
    cpu = float(reference["median_cpu_s"]) / float(this["median_cpu_s"])  # type: ignore[arg-type]
    return f"{wall:.2f}x (CPU {cpu:.2f}x)"


def load_note() -> str:
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


def print_point(report: dict[str, dict[str, object]], args: argparse.Namespace, trace: Path) -> None:
    print(
        f"\n1. the point: {trace} ({POINT_JOBS:,} jobs at {POINT_RATE_PER_H:g}/h, seed {POINT_SEED}), 36:36:36, jobs "
        f"4000-4999, max_min_fairness_perf, seed 0; whole process (--no-plots), median of {args.runs} ({load_note()})"
    )
    driver = report.get(DRIVER)
    print(f"{'':22} {'wall s':>8} {'min s':>8} {'CPU s':>8} {'avg JCT s':>12} {'baseline / this':>24} {'Gavel driver / this':>24}")
    for label, r in report.items():
        base = report.get(label.replace(" this", " baseline")) if label.endswith(" this") else None
        against = ratio(driver, r) if label.endswith(" this") else ""
        print(
            f"{label:22} {float(r['median_s']):8.1f} {float(r['min_s']):8.1f} {float(r['median_cpu_s']):8.1f} "  # type: ignore[arg-type]
            f"{float(r['avg_jct_s']):12.3f} {ratio(base, r):>24} {against:>24}"  # type: ignore[arg-type]
        )
    if driver is not None:
        print(f"(Gavel's driver ran {len(driver['runs_s'])} of the {args.runs} runs)")  # type: ignore[arg-type]
    for preset in args.presets:
        this, base = report[f"{preset} this"], report.get(f"{preset} baseline")
        print(f"{preset} preset: {this['jobs_total']:,} of the trace's {POINT_JOBS:,} jobs arrived before the window's last job finished")
        if base is not None:
            same = this["jobs_csv_sha256"] == base["jobs_csv_sha256"] and isinstance(this["jobs_csv_sha256"], str)
            print(f"{preset} preset: jobs.csv byte-identical to the baseline's: {'yes' if same else 'NO'}")
    if driver is not None and "gavel" in args.presets:
        ours, theirs = float(report["gavel this"]["avg_jct_s"]), float(driver["avg_jct_s"])  # type: ignore[arg-type]
        print(f"gavel preset: average JCT {ours:.3f} s, Gavel's driver {theirs:.3f} s: {'equal' if f'{ours:.3f}' == f'{theirs:.3f}' else 'DIFFERENT'}")
    for preset in args.presets:
        target = POINT_TARGETS[preset]
        if driver is None:
            print(f"target: {preset} preset >= {target:g}x Gavel's driver (not measured: no --gavel-driver)")
            continue
        times = float(driver["median_s"]) / float(report[f"{preset} this"]["median_s"])  # type: ignore[arg-type]
        print(f"target: {preset} preset >= {target:g}x Gavel's driver: {times:.2f}x, {'met' if times >= target else 'NOT met'}")


def print_sweep(report: dict[str, dict[str, object]], args: argparse.Namespace) -> None:
    print(
        f"\n2. Gavel's README sweep as `gavel sweep` runs it (--jobs {args.sweep_jobs}), whole process on all cores, "
        f"once ({load_note()})"
    )
    for label, r in report.items():
        base = report.get(label.replace(" this", " baseline")) if label.endswith(" this") else None
        times = ""
        if base is not None:
            times = f", baseline / this {float(base['wall_s']) / float(r['wall_s']):.2f}x (CPU {float(base['cpu_s']) / float(r['cpu_s']):.2f}x)"  # type: ignore[arg-type]
            times += f", the same average JCTs: {'yes' if base['rows'] == r['rows'] else 'NO'}"
        met = f", target <= {SWEEP_TARGET_S:g} s {'met' if float(r['wall_s']) <= SWEEP_TARGET_S else 'NOT met'}" if label.endswith(" this") else ""  # type: ignore[arg-type]
        print(f"{label:18} {float(r['wall_s']):8.1f} s (CPU {float(r['cpu_s']):.1f} s), {r['cells']} cells{times}{met}")  # type: ignore[arg-type]


def print_large(report: dict[str, dict[str, object]], args: argparse.Namespace, trace: Path) -> None:
    print(
        f"\n3. {trace} ({LARGE_JOBS:,} jobs at {LARGE_RATE_PER_H:g}/h, seed {LARGE_SEED}), 120:120:120, "
        f"max_min_fairness_packed, default preset, every job measured; median of {args.large_runs} ({load_note()})"
    )
    this, base = report["this"], report.get("baseline")
    for label, r in report.items():
        print(f"{label:10} {float(r['median_s']):8.1f} s (CPU {float(r['median_cpu_s']):.1f} s), avg JCT {float(r['avg_jct_s']):.3f} s")  # type: ignore[arg-type]
    if base is not None:
        same = this["jobs_csv_sha256"] == base["jobs_csv_sha256"]
        print(f"baseline / this {ratio(base, this)}; jobs.csv byte-identical: {'yes' if same else 'NO'}")
    met = "met" if float(this["median_s"]) < LARGE_TARGET_S else "NOT met"  # type: ignore[arg-type]
    print(f"target: < {LARGE_TARGET_S:g} s: {met}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of part 1 per tree and preset (median)")
    parser.add_argument("--baseline", type=Path, metavar="DIR", help="the same commands from this checkout too")
    parser.add_argument("--gavel-driver", type=Path, metavar="PATH", help="an executable running Gavel's driver on the trace it is given")
    parser.add_argument("--gavel-runs", type=int, default=None, metavar="K", help="Gavel's driver in the first K runs only (default: all)")
    parser.add_argument("--trace", type=Path, metavar="FILE", help="part 1's trace (default: generated, 5,500 jobs at 1/h, seed 0)")
    parser.add_argument("--presets", default="gavel,default", help="presets of parts 1 and 2 (default gavel,default)")
    parser.add_argument("--skip-point", action="store_true", help="leave part 1 out")
    parser.add_argument("--sweep", action="store_true", help="part 2: Gavel's README sweep")
    parser.add_argument("--sweep-jobs", type=int, default=5500, metavar="N", help="jobs per generated trace of the sweep (default 5500; 0: no --jobs, for a gavel sweep that generates until the window's jobs finish)")
    parser.add_argument("--skip-baseline-sweep", action="store_true", help="part 2 on this tree only")
    parser.add_argument("--large", action="store_true", help="part 3: 20,000 jobs on 360 GPUs")
    parser.add_argument("--large-runs", type=int, default=1, metavar="K")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.presets = [p for p in args.presets.split(",") if p]
    if not set(args.presets) <= set(POINT_TARGETS):
        parser.error(f"--presets: expected some of {', '.join(POINT_TARGETS)}")
    if args.gavel_driver is not None:
        if not (args.gavel_driver.is_file() and os.access(args.gavel_driver, os.X_OK)):
            parser.error(f"--gavel-driver {args.gavel_driver}: not an executable file")
        args.gavel_driver = args.gavel_driver.resolve()
    args.gavel_runs = args.runs if args.gavel_runs is None else args.gavel_runs
    trees = {"this": ROOT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    report: dict[str, object] = {"load_average_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_point:
            trace = args.trace.resolve() if args.trace else generate(POINT_JOBS, POINT_RATE_PER_H, POINT_SEED, Path(tmp) / "point.trace")
            report["point"] = point(args, trees, trace)
            if not args.json:
                print_point(report["point"], args, trace)  # type: ignore[arg-type]
        if args.sweep:
            report["sweep"] = sweep(args, trees)
            if not args.json:
                print_sweep(report["sweep"], args)  # type: ignore[arg-type]
        if args.large:
            large_trace = generate(LARGE_JOBS, LARGE_RATE_PER_H, LARGE_SEED, Path(tmp) / "large.trace")
            report["large"] = large(args, trees, large_trace)
            if not args.json:
                print_large(report["large"], args, large_trace)  # type: ignore[arg-type]
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
