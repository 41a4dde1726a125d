"""``gavel simulate``: replay a trace (a file, or one generated with Gavel's job distribution)
through the scheduler in simulated time, under one policy or several side by side.

Files (sim/output.py): one policy writes summary.json, jobs.csv, jct_cdf.png, utilization.png and
queue.png into the output directory; several write those into DIR/<policy>/ and the comparison
(comparison.txt, comparison.json, comparison_jct_cdf.png, comparison_utilization.png) into DIR.
A generated trace is saved as DIR/trace.trace, so the run can be repeated with --trace.
``--no-plots`` writes the numbers only (no PNG, and matplotlib is never imported). With plots, a
child process started once the inputs are checked imports matplotlib while the runs go on and
draws the plots at the end (sim/plot_process.py): the whole command's wall time, not its CPU
time, is what that saves.
Exit codes: 0 done; 1 the plots could not be drawn (the other files are written); 2 bad input (one
line naming the flag or file).

The simulator, the policies and the plots are imported by the functions that run (see
services/cli/__init__.py): ``gavel simulate --help`` starts without the solver stack. The flags'
groups and checks are in simulate_flags.py, what a finished run writes and prints in
simulate_report.py.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import pathlib
import sys
from typing import TYPE_CHECKING

from services.cli.common import (
    CATCH_UP_HELP,
    PRESET_VALUE,
    CommandFailed,
    above_one_number,
    or_none,
    per_hour,
    print_json,
    print_lines,
)
from services.cli.simulate_flags import (  # noqa: F401 - ENGINES, PRESET_NAMES: re-exported (demo, sweep)
    ENGINES,
    PRESET_NAMES,
    add_cluster_flags,
    add_estimator_flags,
    add_fault_flags,
    add_job_option_flags,
    add_plots_flag,
    add_quiet_rounds_flag,
    add_policy_flags,
    check_trace_flags,
    given_job_options,
    job_options,
    missing_flags,
    replay_flags,
)
from services.cli.simulate_options import add_run_option_flags, checkpoint_spec, resolve_engine
from services.cli.module_flags import add_module_flags, check_quota_entities, module_settings
from services.cli.simulate_report import (  # noqa: F401 - the file names: re-exported (demo)
    COMPARISON_FILES,
    RUN_FILES,
    degraded_notes,
    describe_estimation,
    describe_faults,
    describe_files,
    describe_log,
    plots_failed,
    results_json,
    write_faults,
    write_results,
)
from sim.progress import ProgressBar

if TYPE_CHECKING:
    from common.config import Settings
    from common.log import LogFile
    from policy_service.answer import SolveContext
    from sim.metrics import Summary
    from sim.results import SimulationResult
    from sim.scenario import Scenario
    from sim.traces import TraceJob

LOG_FILE = "simulation.log"  # the services' events during the runs, beside the results


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="replay a trace through the scheduler in simulated time, under one policy or several",
        description=(
            "Replay a trace (--trace) or a generated one (--jobs with --jobs-per-hour or --static) on a simulated "
            "cluster and report job completion times, utilisation, lease extensions, solve times, cost and "
            "finish-time fairness. Exit codes: 0 done; 1 the plots could not be drawn (the rest is written); "
            "2 bad input."
        ),
    )
    source = p.add_argument_group("the jobs: a trace file, or a generated trace with Gavel's job distribution")
    source.add_argument(
        "--trace", metavar="FILE",
        help="a .trace (Gavel's 10 or 7 columns) or .jsonl trace, or philly:VC[:SEED], Gavel's Philly-derived trace of a "
        "virtual cluster (docs/simulator.md; Gavel ran them on --cluster 300:300:300 or 500:0:0)",
    )
    source.add_argument("--jobs", type=int, metavar="N", help="generate N jobs")
    source.add_argument("--jobs-per-hour", type=float, metavar="R", help="generated: Poisson arrivals at R jobs per hour")
    source.add_argument("--static", action="store_true", help="generated: every job arrives at t = 0")
    source.add_argument("--multi-gpu", action="store_true", help="generated: jobs on 1, 2, 4 or 8 GPUs (70/10/15/5%%)")
    source.add_argument(
        "--trace-seed", type=int, metavar="S", help="generated: the trace Gavel generates with seed S (default: --seed)"
    )
    add_job_option_flags(source)
    add_policy_flags(p)
    add_cluster_flags(p, required=False)
    p.add_argument("--catch-up-ratio", type=or_none(above_one_number), default=PRESET_VALUE, metavar="R|none", help=CATCH_UP_HELP)
    p.add_argument(
        "--window",
        metavar="START:END",
        help="measure only the jobs at trace positions START..END-1 (Gavel's job ids); the run stops when they are done",
    )
    p.add_argument("--seed", type=int, default=0, help="the scheduler's seed (random policies, agnostic type order); default 0")
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default=None,
        help="fast: the bus-free path (default); services: the real services on the in-memory bus (same schedule, slower; "
        "the default with --faults)",
    )
    add_fault_flags(p)
    add_estimator_flags(p)
    add_module_flags(p)
    add_run_option_flags(p)
    p.add_argument("--out", metavar="DIR", help="output directory (default: ./out/<trace>-<date-time>)")
    add_plots_flag(p)
    add_quiet_rounds_flag(p)
    p.add_argument("--json", action="store_true", help="print the summary (or the comparison) as JSON on stdout")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    with contextlib.ExitStack() as cleanup:  # the plots' process, stopped if the run fails
        return _run(args, cleanup)


def _run(args: argparse.Namespace, cleanup: contextlib.ExitStack) -> int:
    from common.log import logging_into
    from sim.comparison import compare, render_comparison
    from sim.scenario import (
        Scenario,
        check_mechanism_flags,
        check_prices,
        check_solvers,
        check_trace,
        format_cluster,
        load_context,
        load_trace,
        parse_cluster,
        parse_estimation,
        parse_policies,
        parse_window,
        trace_context,
    )
    from sim.traces import write_trace

    # 1. every input, checked before any work: first each value given, reported as itself (a
    # wrong --cluster is news whether or not --policy is there), then every flag still missing,
    # in one line; then what needs several of them (the trace against the table and cluster)
    policies = parse_policies(args.policy, args.policies)
    check_solvers(policies or (), args.preset)
    check_mechanism_flags(args.round_s, args.gpus_per_server)
    context = load_context(args.throughputs)
    assert context.table is not None
    cluster = None if args.cluster is None else parse_cluster(args.cluster, context.table, args.gpus_per_server)
    if cluster is not None:
        check_prices(cluster, context)
    generating = check_trace_flags(args)
    loaded = load_trace(args.trace) if args.trace is not None else None
    if loaded is not None:  # a Philly trace adds the sizes its gangs need to the table
        context = trace_context(args.trace, loaded, context)
    engine, faults = resolve_engine(args)
    missing = missing_flags(args, generating, policies is None)
    if missing:
        raise CommandFailed("missing " + "; ".join(missing), exit_code=2)
    assert policies is not None and cluster is not None
    trace, source, label = _trace(args, context, loaded, cluster)
    check_trace(trace, context.table, cluster, f"--trace {args.trace}" if args.trace else "the generated trace")
    check_quota_entities(args, {job.entity or "" for job in trace}, f"--trace {args.trace}" if args.trace else "the generated trace")
    window = parse_window(args.window, len(trace))
    estimation = parse_estimation(args, context.table, trace)
    out = pathlib.Path(args.out) if args.out else default_out(label)
    fault_seed = args.seed if args.fault_seed is None else args.fault_seed
    scenario = Scenario(
        trace, cluster, args.preset, args.round_s, args.gpus_per_server, args.seed, window, engine, estimation,
        faults=faults, fault_seed=fault_seed, fault_journal_dir=out, checkpoint=checkpoint_spec(args, engine, policies),
        mechanism=(() if args.catch_up_ratio is PRESET_VALUE else (("catch_up_ratio", args.catch_up_ratio),))
        + module_settings(args),
        skip_quiet_rounds=args.skip_quiet_rounds,
    )
    make_out_dir(out)
    plotter = None
    if args.plots:
        from sim.plot_process import PlotProcess

        # Once the inputs are good (a bad one exits at once, without it): the child imports
        # matplotlib on the other core while the runs go on, and draws the plots at the end.
        plotter = cleanup.enter_context(PlotProcess.start())

    # 2. the runs, one after the other (gavel sweep spreads runs over the cores)
    if not args.json:
        print(
            f"{len(trace)} jobs ({source}) on {format_cluster(cluster)}; preset {args.preset}, rounds of "
            f"{args.round_s:g} s, seed {args.seed}, {engine} engine"
            + (f"; faults {faults.text} (fault seed {fault_seed})" if faults is not None else "")
            + (f"; measured: jobs {window[0]} to {window[1] - 1}" if window else "")
            + (
                f"; learned estimator, {len(estimation.unknown_types)} job type(s) unknown to it"
                + (f", measurement noise {estimation.measurement_noise:g}" if estimation.measurement_noise else "")
                if estimation.learned else ""
            ),
            flush=True,
        )
    # The services' events (every injected fault's among them) go to a file, not over the progress
    # bar; the end of the output says where, and how many.
    log_file: LogFile | None = None
    try:
        with logging_into(out / LOG_FILE) as log_file:
            results, summaries = run_all(policies, scenario, context)
    except BaseException:
        if log_file is not None and log_file.by_level:  # what led to the failure is there
            print_lines([f"gavel: {describe_log(log_file)}"], stream=sys.stderr)
        raise
    assert log_file is not None

    # 3. files, then what the user reads
    if args.trace is None:
        out.mkdir(parents=True, exist_ok=True)
        write_trace(trace, out / "trace.trace")
    plot_error = write_results(results, summaries, out, plots=args.plots, plotter=plotter)
    if faults is not None:
        write_faults(results, out)
    if args.json:
        print_json(results_json(results, summaries, out))
        if log_file.by_level:
            print_lines([describe_log(log_file, faults=faults is not None)], stream=sys.stderr)
        print_lines(degraded_notes(results), stream=sys.stderr)
        if plot_error:
            raise plots_failed(out, plot_error)
        return 0
    print()
    print(render_comparison(compare(summaries)), end="")
    if estimation.learned:
        print()
        for policy, summary in summaries.items():
            print(describe_estimation(policy, summary))
    print()
    if faults is not None:
        for policy, result in results.items():
            print(describe_faults(policy, result, replay_flags(args)))
        print()
    print(describe_files(
        out, policies, learned=estimation.learned, plots=args.plots and not plot_error, faults=faults is not None
    ))
    if log_file.by_level:
        print(describe_log(log_file, faults=faults is not None))
    sys.stdout.flush()
    print_lines(degraded_notes(results), stream=sys.stderr)
    if plot_error:
        raise plots_failed(out, plot_error)
    return 0


def _trace(
    args: argparse.Namespace, context: SolveContext, loaded: tuple[TraceJob, ...] | None, cluster: dict[str, int]
) -> tuple[tuple[TraceJob, ...], str, str]:
    """(jobs, where they come from for messages, a label for the default output directory);
    ``loaded``: the --trace file's jobs, read already; ``cluster``: what --steady-state fills."""
    from sim.scenario import generated_trace

    if loaded is not None:
        return loaded, args.trace, pathlib.Path(args.trace).stem
    seed = args.seed if args.trace_seed is None else args.trace_seed
    rate = None if args.static else args.jobs_per_hour
    trace = generated_trace(args.jobs, rate, args.multi_gpu, seed, context.table, **job_options(args, cluster))
    arrivals = "static" if rate is None else per_hour(rate)
    multi_gpu = ", multi-GPU" if args.multi_gpu else ""
    options = "".join(f", {flag.lstrip('-')}" for flag in given_job_options(args))
    source = f"generated, {arrivals}{multi_gpu}{options}, trace seed {seed}"
    label = "-".join(
        [f"n{args.jobs}", "static" if rate is None else f"r{rate:g}", *(["multigpu"] if args.multi_gpu else []), f"s{seed}"]
    )
    return trace, source, label


def make_out_dir(out: pathlib.Path) -> None:
    """Make the output directory now, after every other check and before the runs: an output
    path that cannot be written must fail in a second, not after the whole simulation. (Only
    making it tells for sure: as root, permission checks say yes to /proc.)"""
    from sim.scenario import bad_input

    if out.exists() and not out.is_dir():
        raise bad_input("--out", f"{out} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        file = next((p for p in reversed(out.parents) if p.exists() and not p.is_dir()), None)
        why = f"{file} exists and is not a directory" if file is not None else (e.strerror or str(e))
        raise bad_input("--out", f"cannot create {out}: {why}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise bad_input("--out", f"{out} is not writable")


def default_out(label: str) -> pathlib.Path:
    return pathlib.Path("out") / f"{label}-{datetime.datetime.now():%Y%m%d-%H%M%S}"


def run_all(
    policies: tuple[str, ...], scenario: Scenario, context: SolveContext
) -> tuple[dict[str, SimulationResult], dict[str, Summary]]:
    from sim.scenario import run_policy

    results: dict[str, SimulationResult] = {}
    summaries: dict[str, Summary] = {}
    width = max(len(p) for p in policies)
    for policy in policies:
        bar = ProgressBar(policy.ljust(width))
        try:
            results[policy], summaries[policy] = run_policy(policy, scenario, context, progress=bar)
        finally:
            bar.close()
    return results, summaries
