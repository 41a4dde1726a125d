"""``gavel sweep``: every (policy, input rate, seed) on a generated trace, spread over the cores;
average JCT against input rate (Gavel's Figure 8).

Each seed s generates the trace Gavel generates with seed s at each rate (the same jobs, only the
arrivals stretch or shrink) and seeds the scheduler with s, as Gavel's sweeps do. Runs use the
bus-free path in worker processes (spawned: a fork would copy the parent's solver state).
Files: sweep.csv (policy, jobs_per_hour, seed, avg_jct_s) and sweep_jct.png (sim/output.py).
Exit codes: 0 done; 1 the plot could not be drawn (sweep.csv is written); 2 bad input (one line
naming the flag).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import multiprocessing
import os
import pathlib
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from services.cli.common import CommandFailed, print_json, print_table
from services.cli.simulate_cmd import add_cluster_flags

# The simulator and the policies are imported by the functions that run (services/cli/__init__.py).
if TYPE_CHECKING:
    from common.config import Settings
    from policy_service.answer import SolveContext
    from sim.metrics import SweepRow
    from sim.scenario import Scenario


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="simulate each policy at several arrival rates and seeds (on all cores) and plot average job completion time against the rate",
        description=(
            "Run every (policy, jobs/hour, seed) on the trace Gavel generates with that seed and rate, on all cores, "
            "and plot average JCT against input rate. Exit codes: 0 done; 1 the plot could not be drawn; 2 bad input."
        ),
    )
    p.add_argument("--policies", required=True, metavar="A,B,...", help="policies to compare (gavel policy list)")
    p.add_argument("--rates", required=True, metavar="R1,R2,...", help="input rates in jobs per hour")
    p.add_argument("--seeds", default="0", metavar="S1,S2,...", help="trace and scheduler seeds (default 0)")
    p.add_argument("--jobs", type=int, required=True, metavar="N", help="jobs per generated trace")
    p.add_argument("--multi-gpu", action="store_true", help="jobs on 1, 2, 4 or 8 GPUs (70/10/15/5%%)")
    add_cluster_flags(p)
    p.add_argument(
        "--window", metavar="START:END", help="measure only the jobs at positions START..END-1 (Gavel's steady state)"
    )
    p.add_argument("--out", metavar="DIR", help="output directory (default: ./out/sweep-<date-time>)")
    p.add_argument("--processes", type=int, metavar="P", help=f"worker processes (default: one per core, {os.cpu_count()})")
    p.add_argument("--json", action="store_true", help="print the runs as JSON on stdout")
    p.set_defaults(run=run)


@dataclass(frozen=True, slots=True)
class SweepRun:
    policy: str
    jobs_per_hour: float
    seed: int
    scenario: Scenario


@dataclass(frozen=True, slots=True)
class SweepOutcome:
    row: SweepRow
    jobs_completed: int
    jobs_measured: int
    wall_s: float


def run(args: argparse.Namespace, settings: Settings) -> int:
    from services.cli.simulate_cmd import plots_failed
    from sim.output import write_sweep_csv
    from sim.scenario import (
        Scenario,
        bad_input,
        check_mechanism_flags,
        check_policies,
        check_prices,
        check_solvers,
        check_trace,
        format_cluster,
        generated_trace,
        load_context,
        parse_cluster,
        parse_numbers,
        parse_window,
        positive_rate,
        seed_number,
    )

    # 1. every input, checked before any process starts
    policies = check_policies("--policies", [n.strip() for n in args.policies.split(",")])
    check_solvers(policies, args.preset)
    rates = parse_numbers("--rates", args.rates, positive_rate, "a number of jobs per hour > 0")
    seeds = parse_numbers("--seeds", args.seeds, seed_number, "a whole number >= 0")
    check_mechanism_flags(args.round_s, args.gpus_per_server)
    if args.processes is not None and args.processes < 1:
        raise bad_input("--processes", f"expected a whole number >= 1, got {args.processes}")
    context = load_context(args.throughputs)
    assert context.table is not None
    cluster = parse_cluster(args.cluster, context.table, args.gpus_per_server)
    check_prices(cluster, context)
    if args.jobs < 1:
        raise bad_input("--jobs", f"expected a whole number >= 1, got {args.jobs}")
    window = parse_window(args.window, args.jobs)
    runs = []
    for seed in seeds:
        for rate in rates:
            trace = generated_trace(args.jobs, rate, args.multi_gpu, seed, context.table)
            check_trace(trace, context.table, cluster, f"the trace generated with seed {seed} at {rate:g} jobs/hour")
            scenario = Scenario(trace, cluster, args.preset, args.round_s, args.gpus_per_server, seed, window)
            runs.extend(SweepRun(policy, rate, seed, scenario) for policy in policies)
    out = pathlib.Path(args.out) if args.out else pathlib.Path("out") / f"sweep-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    processes = min(args.processes or os.cpu_count() or 1, len(runs))

    # 2. the runs, on all cores; one line on stderr as each finishes
    print(
        f"sweep: {len(policies)} policies x {len(rates)} rates x {len(seeds)} seeds = {len(runs)} runs of {args.jobs} jobs "
        f"on {format_cluster(cluster)} (preset {args.preset}), {processes} processes",
        file=sys.stderr,
    )
    outcomes = run_sweep(runs, context, processes)

    # 3. files and the table (runs in grid order, whatever order they finished in)
    rows = [outcomes[i].row for i in range(len(runs))]
    # The numbers first: a plot that cannot be drawn must not cost the sweep's results.
    csv_path = write_sweep_csv(rows, out)
    plot_error = None
    try:
        from sim.plots import plot_sweep  # matplotlib: only once there is something to draw

        png_path = plot_sweep(rows, out / "sweep_jct.png")
    except Exception as e:  # noqa: BLE001 - matplotlib fails in many ways; the CSV stands without the plot
        plot_error = f"{type(e).__name__}: {e}"
    if args.json:
        print_json(
            {
                "out_dir": str(out),
                "runs": [
                    {
                        "policy": o.row.policy,
                        "jobs_per_hour": o.row.jobs_per_hour,
                        "seed": o.row.seed,
                        "avg_jct_s": o.row.avg_jct_s,
                        "jobs_completed": o.jobs_completed,
                        "jobs_measured": o.jobs_measured,
                        "wall_s": o.wall_s,
                    }
                    for o in (outcomes[i] for i in range(len(runs)))
                ],
            }
        )
        if plot_error:
            raise plots_failed(out, plot_error, skip_hint=False)
        return 0
    print_sweep_table(rows, policies, len(seeds))
    print()
    print(f"wrote {csv_path}" if plot_error else f"wrote {csv_path} and {png_path}")
    if plot_error:
        raise plots_failed(out, plot_error, skip_hint=False)
    return 0


def run_sweep(runs: list[SweepRun], context: SolveContext, processes: int) -> dict[int, SweepOutcome]:
    """Run each SweepRun in a worker process; outcomes keyed by the run's index."""
    outcomes: dict[int, SweepOutcome] = {}
    started_s = time.perf_counter()
    executor = concurrent.futures.ProcessPoolExecutor(
        max_workers=processes,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(context,),
    )
    try:
        futures = {executor.submit(_run_one, run): i for i, run in enumerate(runs)}
        for future in concurrent.futures.as_completed(futures):
            i = futures[future]
            try:
                outcome = future.result()  # a worker's GavelError comes back here: one line, exit 2
            except concurrent.futures.process.BrokenProcessPool as e:
                raise CommandFailed(f"a sweep worker process died ({e}); try fewer --processes", exit_code=1) from None
            outcomes[i] = outcome
            row = outcome.row
            jct = "-" if row.avg_jct_s is None else f"{row.avg_jct_s / 3600:.2f} h"
            print(
                f"[{len(outcomes)}/{len(runs)}] {row.policy} at {row.jobs_per_hour:g} jobs/h, seed {row.seed}: "
                f"avg JCT {jct}, {outcome.jobs_completed}/{outcome.jobs_measured} done "
                f"({outcome.wall_s:.1f} s; {time.perf_counter() - started_s:.0f} s elapsed)",
                file=sys.stderr,
                flush=True,
            )
    finally:
        # On an error or Ctrl-C, drop the runs not started yet instead of finishing them.
        executor.shutdown(wait=True, cancel_futures=True)
    return outcomes


_context: SolveContext | None = None


def _init_worker(context: SolveContext) -> None:
    global _context
    _context = context


def _run_one(run: SweepRun) -> SweepOutcome:
    from sim.metrics import SweepRow
    from sim.scenario import run_policy

    assert _context is not None, "the worker was not initialised"
    result, summary = run_policy(run.policy, run.scenario, _context)
    return SweepOutcome(
        SweepRow(run.policy, run.jobs_per_hour, run.seed, summary.avg_jct_s),
        summary.jobs_completed,
        summary.jobs_measured,
        result.wall_s,
    )


def print_sweep_table(rows: list[SweepRow], policies: tuple[str, ...], num_seeds: int) -> None:
    """Average JCT in hours, one row per rate, one column per policy: the mean over the seeds,
    with the range when there are several."""
    from sim.metrics import sweep_lines

    lines = {line.policy: line for line in sweep_lines(rows)}
    rates = sorted({row.jobs_per_hour for row in rows})
    table = []
    for rate in rates:
        cells: list[object] = [f"{rate:g}"]
        for policy in policies:
            line = lines[policy]
            at = [k for k, r in enumerate(line.jobs_per_hour) if r == rate]
            if not at:
                cells.append("-")
                continue
            k = at[0]
            cell = f"{line.mean_jct_h[k]:.2f}"
            if num_seeds > 1:
                cell += f" ({line.min_jct_h[k]:.2f}-{line.max_jct_h[k]:.2f})"
            cells.append(cell)
        table.append(cells)
    print("average JCT in hours" + (f", mean over {num_seeds} seeds (min-max)" if num_seeds > 1 else ""))
    print_table(["jobs/hour", *policies], table)
