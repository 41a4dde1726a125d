"""``gavel sweep``: every (policy, input rate, seed[, variant]) on a generated trace, on the cores of this
machine or on ``gavel serve simulator`` processes over RabbitMQ (``--bus amqp``); average JCT
against input rate (Gavel's Figure 8).

Each seed s generates the trace Gavel generates with seed s at each rate (the same jobs, only the
arrivals stretch or shrink) and seeds the scheduler with s, as Gavel's sweeps do. With --window
START:END and no --jobs, as many jobs as Gavel's run would draw before the window's jobs finish
(sim/sweep_jobs.py); --jobs N measures a trace of N jobs instead. Each run is a
cell (sim/sweep_cells.py) that carries everything it needs, so a cell runs the same in a local
worker process and on another machine. The rates: ``--rates``, Gavel's evenly spaced interval
(``--rate-start/--rate-stop/--rate-count``) or its search for saturation (``--until-saturated``),
limited by ``--cutoffs`` (sim/sweep_plan.py). ``--variant LABEL=FLAGS`` (repeatable) adds the
option axis: each cell once per variant, with the sweep's run flags and the variant's over them
(services/cli/sweep_variants.py).
Files: sweep.csv (policy, jobs_per_hour, seed, avg_jct_s; option with variants) and sweep_jct.png (sim/output.py), and
cells.jsonl, the ledger of results kept as they arrive: the same command with the same --out
again runs only the cells without a result (sim/sweep_ledger.py).
Exit codes: 0 done; 1 a cell failed, or the plot could not be drawn (sweep.csv is written); 2 bad
input (one line naming the flag).
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import sys
from typing import TYPE_CHECKING

from services.cli.common import print_lines
from services.cli.module_flags import add_module_flags
from services.cli.simulate_cmd import add_cluster_flags
from services.cli.simulate_flags import add_job_option_flags
from services.cli.sweep_variants import add_ideal_flag, add_variant_flag

# The simulator and the policies are imported by the functions that run (services/cli/__init__.py).
if TYPE_CHECKING:
    from common.config import Settings
    from sim.sweep_plan import SweepPlan


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="simulate each policy at several arrival rates and seeds (on all cores, or on simulators over RabbitMQ) "
        "and plot average job completion time against the rate",
        description=(
            "Run every (policy, jobs/hour, seed) on the trace Gavel generates with that seed and rate, on all cores "
            "or on `gavel serve simulator` processes (--bus amqp), and plot average JCT against input rate. The same "
            "command with the same --out again runs only the cells without a result. "
            "Exit codes: 0 done; 1 a cell failed or the plot could not be drawn; 2 bad input."
        ),
    )
    p.add_argument(
        "--policies", required=True, nargs="+", metavar="POLICY",
        help="policies to compare (gavel policy list), by commas or, as Gavel's -p, by spaces",
    )
    rates = p.add_argument_group("rates: one of --rates, --rate-start/--rate-stop, --until-saturated (docs/simulator.md)")
    rates.add_argument("--rates", metavar="R1,R2,...", help="input rates in jobs per hour")
    rates.add_argument("--rate-start", type=float, metavar="A", help="evenly spaced rates from A jobs/hour (Gavel's -a)")
    rates.add_argument("--rate-stop", type=float, metavar="B", help="... to B jobs/hour, included (Gavel's -b)")
    rates.add_argument("--rate-count", type=int, metavar="N", help="... N of them (Gavel's -n; default 20); a first rate of 0 is left out")
    rates.add_argument(
        "--until-saturated", type=float, nargs="?", const=0.98, metavar="U",
        help="Gavel's automatic sweep (-u): per policy and seed, double the rate until the cluster's utilisation "
        "reaches U (default 0.98), find the knee, then go past it until the average JCT spreads tenfold",
    )
    rates.add_argument(
        "--cutoffs", metavar="FILE",
        help='Gavel\'s cutoff file, {"36:36:36": {"POLICY": JOBS_PER_HOUR}}: a policy is not run at or above its '
        "cutoff rate on this cluster",
    )
    p.add_argument(
        "--seeds", nargs="+", default=["0"], metavar="SEED",
        help="trace and scheduler seeds, by commas or, as Gavel's --seeds, by spaces (default 0)",
    )
    p.add_argument(
        "--jobs", type=int, metavar="N",
        help="jobs per generated trace; leave it out with --window to generate jobs until the window's jobs finish, as Gavel does",
    )
    p.add_argument("--multi-gpu", action="store_true", help="jobs on 1, 2, 4 or 8 GPUs (70/10/15/5%%)")
    add_job_option_flags(p)
    add_ideal_flag(p)
    add_cluster_flags(p)
    add_module_flags(p)
    add_variant_flag(p)
    p.add_argument(
        "--window", metavar="START:END",
        help="measure only the jobs at positions START..END-1 (Gavel's -s START -e END: its job ids, from 0)",
    )
    p.add_argument("--out", metavar="DIR", help="output directory (default: ./out/sweep-<date-time>); again: resume")
    p.add_argument(
        "--bus", choices=("local", "amqp"), default="local",
        help="local (default): worker processes here; amqp: publish the cells to RabbitMQ (GAVEL_AMQP_URL) for "
        "`gavel serve simulator` processes on any machines",
    )
    p.add_argument("--amqp", metavar="URL", help="--bus amqp: the broker (default: GAVEL_AMQP_URL)")
    p.add_argument("--processes", type=int, metavar="P", help=f"local worker processes (default: one per core, {os.cpu_count()})")
    p.add_argument("--json", action="store_true", help="print the runs as JSON on stdout")
    p.set_defaults(run=run)


async def run(args: argparse.Namespace, settings: Settings) -> int:
    from services.cli.sweep_report import SweepSetting, report
    from services.cli.sweep_variants import (
        cell_fields,
        naming,
        parse_variants,
        plugins_named,
        run_settings,
    )
    from sim.scenario import (
        bad_input,
        check_policies,
        check_prices,
        format_cluster,
        load_context,
        parse_cluster,
        parse_numbers,
        seed_number,
        serving,
    )
    from sim.sweep_cells import SweepSpec, cell_scenario, table_digest
    from sim.sweep_jobs import ON_DEMAND
    from sim.sweep_ledger import LedgerFile, SweepBook

    # 1. every input, checked before any cell runs
    policies = check_policies("--policies", [n.strip() for n in ",".join(args.policies).split(",")])
    seeds = parse_numbers("--seeds", ",".join(args.seeds), seed_number, "a whole number >= 0")
    # the sweep's own run flags, then each variant's (the sweep's with its flags over them)
    modules = run_settings(args, policies)
    variants = []
    for label, ns in parse_variants(args):
        with naming(label):
            variants.append((label, ns, run_settings(ns, policies)))
    if args.processes is not None and args.processes < 1:
        raise bad_input("--processes", f"expected a whole number >= 1, got {args.processes}")
    if args.amqp and args.bus != "amqp":
        raise bad_input("--amqp", "names the broker of --bus amqp; add --bus amqp")
    if args.processes is not None and args.bus == "amqp":
        raise bad_input("--processes", "with --bus amqp the cells run on `gavel serve simulator` processes: start as many as you want")
    # a local sweep's cells run the plug-ins named here: its policies, and its seams' module:Name
    seams = [*plugins_named(modules), *(name for _, _, m in variants for name in plugins_named(m))]
    named = [*policies, *seams]
    if args.bus == "amqp" and seams:
        # A simulator serves a policy's package.module:Name it was started with, but a seam's only
        # as an entry point: every cell would fail on every simulator; say so once, before any is
        # published
        raise bad_input(
            "--bus", f"amqp: {seams[0]} names a module, and a simulator never imports a module a cell names for an "
            "admission, placement or launch; install it as an entry point of gavel.admission, gavel.placement or "
            "gavel.launch on the simulators and name it so (docs/extending.md), or run the sweep here (--bus local)",
        )
    context = serving(load_context(args.throughputs), named)
    assert context.table is not None
    cluster = parse_cluster(args.cluster, context.table, args.gpus_per_server)
    check_prices(cluster, context)
    window, num_jobs = jobs_and_window(args.jobs, args.window)
    shared = cell_fields("", args, modules, cluster)  # what every cell carries (without variants)
    cells = tuple(cell_fields(label, ns, m, cluster) for label, ns, m in variants)
    plan = sweep_plan(args, policies, seeds, cluster, context.table, tuple(v.label for v in cells) or ("",))
    digest = table_digest(_table_text(args.throughputs))
    spec = SweepSpec(
        num_jobs, args.multi_gpu, cluster, digest, args.preset, args.round_s, args.gpus_per_server, window,
        trace_json=shared.trace_json, scenario_json=shared.scenario_json, variants=cells,
    )
    rate = plan.rates[0] if plan.rates else 1.0
    for option in plan.options:
        for seed in seeds:  # the jobs are the same at every rate: one check per seed, of the trace its cells generate
            with naming(option or None):
                cell_scenario(spec.cell(policies[0], rate, seed, option), context)
    out = pathlib.Path(args.out) if args.out else pathlib.Path("out") / f"sweep-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    ledger = LedgerFile(out)
    kept = ledger.read(spec.sweep_id)
    book = SweepBook(spec.sweep_id)
    total = None if plan.until_utilization is not None else len(plan.needed({}))
    cut = plan.cut()
    if cut:
        print_lines([f"sweep: --cutoffs leaves out {len(cut)} (policy, rate): " + ", ".join(f"{p} at {r:g}" for p, r in cut)], sys.stderr)
    where = f"{format_cluster(cluster)} (preset {args.preset})"
    setting = SweepSetting(format_cluster(cluster), args.preset, num_jobs, window)
    jobs = f" of {num_jobs} jobs" if num_jobs != ON_DEMAND else f", jobs drawn until {setting.measured} finish (as Gavel's),"
    what = f"{len(policies)} policies x {len(seeds)} seeds x " + (f"{len(cells)} variants x " if cells else "") + (
        f"{len(plan.rates)} rates = {total} cells" if total is not None else f"a search until utilisation {plan.until_utilization:g}"
    )

    # 2. the cells, here or on the simulators; a line on stderr as each finishes
    if args.bus == "amqp":
        from services.cli.sweep_run import run_amqp

        await run_amqp(plan, spec, book, ledger, kept, settings, args.amqp, f"sweep: {what}{jobs} on {where}", total)
    else:
        from services.cli.sweep_run import run_local

        processes = max(1, min(args.processes or os.cpu_count() or 1, total or os.cpu_count() or 1))
        header = f"sweep: {what}{jobs} on {where}, {processes} processes"
        await run_local(plan, spec, book, ledger, kept, {digest: context}, processes, header, total)

    # 3. files and the table (cells in plan order, whatever order they finished in)
    return report(args, out, book, plan, setting)


def sweep_plan(
    args: argparse.Namespace, policies: tuple[str, ...], seeds: tuple[int, ...], cluster, table, options: tuple[str, ...] = ("",)
) -> SweepPlan:
    """The range flags into the plan: exactly one way of choosing the rates, and the cutoffs;
    ``options``: the variants' labels."""
    from sim.scenario import (
        bad_input,
        format_cluster,
        parse_cluster,
        parse_numbers,
        positive_rate,
    )
    from sim.sweep_plan import RangeError, SweepPlan, evenly_spaced_rates, parse_cutoffs

    interval = args.rate_start is not None or args.rate_stop is not None or args.rate_count is not None
    given = [flag for flag, on in (("--rates", args.rates is not None), ("--rate-start", interval),
                                   ("--until-saturated", args.until_saturated is not None)) if on]
    if len(given) != 1:
        raise bad_input(
            given[1] if len(given) > 1 else "--rates",
            f"{' and '.join(given)} exclude each other" if len(given) > 1
            else "say which rates: --rates R1,R2,..., --rate-start A --rate-stop B [--rate-count N], or --until-saturated [U]",
        )
    try:
        cutoffs = None
        if args.cutoffs is not None:
            try:
                text = pathlib.Path(args.cutoffs).read_text(encoding="utf-8")
            except OSError as e:
                raise bad_input("--cutoffs", f"cannot read {args.cutoffs}: {e.strerror or e}") from None
            cutoffs = parse_cutoffs(text, cluster, lambda key: parse_cluster(key, table, args.gpus_per_server))
            if not set(cutoffs) & set(policies):  # entries of other clusters are ignored, as Gavel does: say so
                where = format_cluster(cluster)
                print_lines([f"sweep: --cutoffs has no cutoff for {', '.join(policies)} on this cluster ({where}): nothing is left out"], sys.stderr)
        if args.until_saturated is not None:
            if not 0 < args.until_saturated <= 1:
                raise bad_input("--until-saturated", f"expected a utilisation in (0, 1], got {args.until_saturated:g}")
            return SweepPlan(policies, seeds, until_utilization=args.until_saturated, cutoffs=cutoffs, options=options)
        if interval:
            if args.rate_start is None or args.rate_stop is None:
                raise bad_input("--rate-start" if args.rate_start is None else "--rate-stop", "an interval needs --rate-start A and --rate-stop B")
            rates = evenly_spaced_rates(args.rate_start, args.rate_stop, 20 if args.rate_count is None else args.rate_count)
        else:
            rates = parse_numbers("--rates", args.rates, positive_rate, "a number of jobs per hour > 0")
    except RangeError as e:
        raise bad_input(e.flag, e.reason) from None
    plan = SweepPlan(policies, seeds, rates=tuple(rates), cutoffs=cutoffs, options=options)
    if not plan.needed({}):
        raise bad_input("--cutoffs", "every rate is at or above its policy's cutoff: nothing to run")
    return plan


def _table_text(path: str | None) -> bytes | None:
    return None if path is None else pathlib.Path(path).read_bytes()  # load_context read it already


def jobs_and_window(jobs: int | None, window_text: str | None) -> tuple[tuple[int, int] | None, int]:
    """--window START:END (Gavel's -s/-e: job ids START..END-1, the first job 0) and --jobs N
    into (the window, the trace's size); without --jobs, a window's trace is generated until its
    jobs finish (sim/sweep_jobs.py's ON_DEMAND), as Gavel's sweep does. Each wrong combination
    is one line naming the flag."""
    from sim.scenario import bad_input
    from sim.sweep_jobs import ON_DEMAND

    if jobs is not None and jobs < 1:
        raise bad_input("--jobs", f"expected a whole number >= 1, got {jobs}")
    if window_text is None:
        if jobs is None:
            raise bad_input(
                "--jobs", "say how many jobs each trace has (--jobs N), or measure a window (--window START:END, Gavel's "
                "-s/-e) and the jobs are generated until its jobs finish, as Gavel does",
            )
        return None, jobs
    start_text, sep, end_text = window_text.partition(":")
    if not (sep and start_text.isdecimal() and end_text.isdecimal() and int(start_text) < int(end_text)):
        raise bad_input(
            f"--window {window_text}", "expected START:END, job positions from 0 with START < END, END excluded (Gavel's -s START -e END)"
        )
    start, end = int(start_text), int(end_text)
    if jobs is not None and jobs < end:
        raise bad_input(
            "--jobs", f"{jobs} jobs end before the window {start}:{end} does (its last job is {end - 1}): give --jobs >= {end}, "
            "or leave --jobs out to generate jobs until the window's jobs finish, as Gavel does",
        )
    return (start, end), ON_DEMAND if jobs is None else jobs
