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
services/cli/__init__.py): ``gavel simulate --help`` starts without the solver stack.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import os
import pathlib
import sys
from typing import TYPE_CHECKING

from common.errors import FaultSpecError
from mechanism_service.core.settings import PRESETS
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
from sim.progress import ProgressBar

if TYPE_CHECKING:
    from common.config import Settings
    from common.log import LogFile
    from policy_service.answer import SolveContext
    from sim.faults import FaultSpec
    from sim.metrics import Summary
    from sim.plot_process import PlotProcess
    from sim.results import SimulationResult
    from sim.scenario import Scenario
    from sim.traces import TraceJob

ENGINES = ("fast", "services")
PRESET_NAMES = tuple(PRESETS)
RUN_FILES = ("summary.json", "jobs.csv", "jct_cdf.png", "utilization.png", "queue.png")
ESTIMATION_FILES = ("estimation.csv", "estimation_error.png")  # a learned estimator's error over time
COMPARISON_FILES = ("comparison.txt", "comparison.json", "comparison_jct_cdf.png", "comparison_utilization.png")
PLOT_SUFFIX = ".png"
MAX_VIOLATIONS_SHOWN = 5  # invariant violations printed under a run with faults (faults.json has them all)
LOG_FILE = "simulation.log"  # the services' events during the runs, beside the results
FAULT_FILES = ("faults.json", "gpu_occupancy.csv")  # write_faults, per run


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
    source.add_argument("--trace", metavar="FILE", help="a .trace (Gavel's 10 or 7 columns) or .jsonl trace")
    source.add_argument("--jobs", type=int, metavar="N", help="generate N jobs")
    source.add_argument("--jobs-per-hour", type=float, metavar="R", help="generated: Poisson arrivals at R jobs per hour")
    source.add_argument("--static", action="store_true", help="generated: every job arrives at t = 0")
    source.add_argument("--multi-gpu", action="store_true", help="generated: jobs on 1, 2, 4 or 8 GPUs (70/10/15/5%%)")
    source.add_argument(
        "--trace-seed", type=int, metavar="S", help="generated: the trace Gavel generates with seed S (default: --seed)"
    )
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
    p.add_argument("--out", metavar="DIR", help="output directory (default: ./out/<trace>-<date-time>)")
    add_plots_flag(p)
    p.add_argument("--json", action="store_true", help="print the summary (or the comparison) as JSON on stdout")
    p.set_defaults(run=run)


def add_fault_flags(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("faults (docs/reliability.md; the services engine only)")
    group.add_argument(
        "--faults", metavar="SPEC",
        help="inject seeded faults: mix, or kind=value items such as worker-crash=2,hang=1,slow-gpu=1,job-crash=3,"
        "mechanism-crash=2,policy-crash=1,dup=0.05,reorder=0.05:4,delay=0.02:30,loss=0.02 (implies --engine services)",
    )
    group.add_argument(
        "--fault-seed", type=int, metavar="N", help="the faults' seed (default: --seed); a run replays with the same SPEC and N"
    )


def resolve_faults(args: argparse.Namespace) -> tuple[str, FaultSpec | None]:
    """(engine, fault spec): faults run on the services engine only (the fast path has no bus, no
    workers and no services to break); --engine fast with --faults is refused in one line."""
    from sim.faults import parse_spec
    from sim.scenario import bad_input

    if args.faults is None:
        if args.fault_seed is not None:
            raise bad_input("--fault-seed", "needs --faults")
        return args.engine or "fast", None
    if args.engine == "fast":
        raise bad_input("--faults", "needs --engine services (the fast path has no bus, workers or services to break)")
    try:
        spec = parse_spec(args.faults)
    except FaultSpecError as e:
        raise CommandFailed(str(e), exit_code=2) from None
    return "services", None if spec.empty else spec  # "none" (or all zeros): the plain services run


def add_plots_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-plots", dest="plots", action="store_false",
        help="write the numbers only (summary.json, jobs.csv, ...), no PNG plots: saves the plotting stack's start",
    )


def add_estimator_flags(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("throughput estimation (docs/estimator.md)")
    group.add_argument(
        "--estimator", choices=("oracle", "learned"), default="oracle",
        help="oracle (default): the scheduler knows every true throughput, as Gavel's simulator; learned: it schedules "
        "on the estimator's estimates, learned from profiling runs and measurements",
    )
    group.add_argument(
        "--unknown-types", metavar="N|A,B,...",
        help="learned: job types removed from what the estimator and the mechanism know (they still run at their true "
        "speed): N of the trace's types drawn with --seed, or a list",
    )
    group.add_argument("--profiling-share", type=float, metavar="F", help="learned: at most this share of GPU time for profiling (default 0.1)")
    group.add_argument(
        "--profiling-percentage", type=float, metavar="P",
        help="learned: share of a new type's (type, reference) cells measured packed (Gavel's profiling_percentage; default 0.25)",
    )
    group.add_argument("--reference-models", type=int, metavar="K", help="learned: K reference job types per gang size (default: all)")
    group.add_argument(
        "--measurement-noise", type=float, metavar="SIGMA",
        help="learned: each measurement is the true rate times exp(SIGMA x a standard normal) (default 0)",
    )


def add_policy_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", metavar="NAME", help="the policy to simulate (gavel policy list); this or --policies is required")
    p.add_argument("--policies", metavar="A,B,...", help="several policies, compared side by side")


def add_cluster_flags(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``required``: argparse refuses a missing --cluster (``gavel simulate`` says itself, after
    checking the values it was given, so a missing flag does not hide a wrong one)."""
    p.add_argument(
        "--cluster",
        required=required,
        metavar="SPEC",
        help="required: GPUs per type, v100=36,p100=36,k80=36, or Gavel's 36:36:36 (v100:p100:k80)",
    )
    p.add_argument(
        "--throughputs", metavar="TABLE.json", help="throughput table in Gavel's format (default: the shipped Gavel table)"
    )
    p.add_argument("--round-s", type=float, default=360.0, metavar="S", help="round length in seconds (default 360)")
    p.add_argument("--gpus-per-server", type=int, default=1, metavar="G", help="GPUs per server (default 1)")
    p.add_argument(
        "--preset",
        choices=PRESET_NAMES,
        default="default",
        help="default: ours (docs/mechanism.md); gavel: Gavel's simulator, to reproduce its numbers",
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    with contextlib.ExitStack() as cleanup:  # the plots' process, stopped if the run fails
        return _run(args, cleanup)


def _run(args: argparse.Namespace, cleanup: contextlib.ExitStack) -> int:
    from common.log import logging_into
    from sim.metrics import compare, render_comparison
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
    generating = _check_trace_flags(args)
    loaded = load_trace(args.trace) if args.trace is not None else None
    engine, faults = resolve_faults(args)
    missing = missing_flags(args, generating, policies is None)
    if missing:
        raise CommandFailed("missing " + "; ".join(missing), exit_code=2)
    assert policies is not None and cluster is not None
    trace, source, label = _trace(args, context, loaded)
    check_trace(trace, context.table, cluster, f"--trace {args.trace}" if args.trace else "the generated trace")
    window = parse_window(args.window, len(trace))
    estimation = parse_estimation(args, context.table, trace)
    out = pathlib.Path(args.out) if args.out else default_out(label)
    fault_seed = args.seed if args.fault_seed is None else args.fault_seed
    scenario = Scenario(
        trace, cluster, args.preset, args.round_s, args.gpus_per_server, args.seed, window, engine, estimation,
        faults=faults, fault_seed=fault_seed, fault_journal_dir=out,
        mechanism=() if args.catch_up_ratio is PRESET_VALUE else (("catch_up_ratio", args.catch_up_ratio),),
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
    if plot_error:
        raise plots_failed(out, plot_error)
    return 0


def _check_trace_flags(args: argparse.Namespace) -> bool:
    """Refuse trace flags that contradict each other or are out of range, before anything is
    read or generated; True when the flags ask for a generated trace."""
    from sim.scenario import bad_input

    generating = (
        args.jobs is not None or args.jobs_per_hour is not None or args.static or args.multi_gpu
        or args.trace_seed is not None
    )
    if args.trace is not None and generating:
        raise bad_input(
            "--trace",
            "a trace file and generation options (--jobs, --jobs-per-hour, --static, --multi-gpu, --trace-seed) "
            "exclude each other",
        )
    if args.static and args.jobs_per_hour is not None:
        raise bad_input(
            "--jobs-per-hour", "cannot go with --static (Poisson arrivals at R per hour, or every job at t = 0: one of them)"
        )
    if args.jobs is not None and args.jobs < 1:
        raise bad_input("--jobs", f"expected a whole number >= 1, got {args.jobs}")
    if args.jobs_per_hour is not None and not 0 < args.jobs_per_hour < math.inf:
        raise bad_input("--jobs-per-hour", f"expected a number > 0, got {args.jobs_per_hour:g}")
    seed_flag, seed = ("--seed", args.seed) if args.trace_seed is None else ("--trace-seed", args.trace_seed)
    if generating and seed < 0:  # Gavel's generator seeds numpy with it
        raise bad_input(seed_flag, f"the trace's seed must be a whole number >= 0, got {seed}")
    return generating


def missing_flags(args: argparse.Namespace, generating: bool, no_policy: bool) -> list[str]:
    """What the run still needs, each with what to give, in the order of the help."""
    missing = []
    if args.trace is None and not generating:
        missing.append("the jobs (--trace FILE, or --jobs N with --jobs-per-hour R or --static)")
    if generating and args.jobs is None:
        missing.append("--jobs N (how many jobs to generate)")
    if generating and args.jobs_per_hour is None and not args.static:
        missing.append("--jobs-per-hour R or --static (how the generated jobs arrive: Poisson at R per hour, or all at t = 0)")
    if no_policy:
        missing.append("--policy NAME (gavel policy list; or --policies A,B,... to compare several)")
    if args.cluster is None:
        missing.append("--cluster SPEC (GPUs per type: v100=4,p100=4,k80=4, or Gavel's 4:4:4)")
    return missing


def describe_log(log_file: LogFile, *, faults: bool = False) -> str:
    """Where the services' events went, and how many of each level: a fault run's errors are
    mostly the injected faults, which the services log as they would in production."""
    told = "; the services' account of the injected faults" if faults else ""
    return f"the services' log of the run: {log_file.path} ({log_file.summary()}{told})"


def _trace(
    args: argparse.Namespace, context: SolveContext, loaded: tuple[TraceJob, ...] | None
) -> tuple[tuple[TraceJob, ...], str, str]:
    """(jobs, where they come from for messages, a label for the default output directory);
    ``loaded``: the --trace file's jobs, read already."""
    from sim.scenario import generated_trace

    if loaded is not None:
        return loaded, args.trace, pathlib.Path(args.trace).stem
    seed = args.seed if args.trace_seed is None else args.trace_seed
    rate = None if args.static else args.jobs_per_hour
    trace = generated_trace(args.jobs, rate, args.multi_gpu, seed, context.table)
    arrivals = "static" if rate is None else per_hour(rate)
    multi_gpu = ", multi-GPU" if args.multi_gpu else ""
    source = f"generated, {arrivals}{multi_gpu}, trace seed {seed}"
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
        for policy in results:
            write_run(results[policy], summaries[policy], out / policy, plots=plots, plotter=plotter)
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
    from sim.metrics import compare
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


def replay_flags(args: argparse.Namespace) -> str:
    """The flags besides the faults that a replay of this run needs."""
    parts = [f"--trace {args.trace}" if args.trace else f"--jobs {args.jobs}"]
    if args.trace is None:
        if args.jobs_per_hour is not None:
            parts.append(f"--jobs-per-hour {args.jobs_per_hour:g}")
        if args.static:
            parts.append("--static")
        if args.multi_gpu:
            parts.append("--multi-gpu")
        if args.trace_seed is not None:
            parts.append(f"--trace-seed {args.trace_seed}")
    parts.append(f"--cluster {args.cluster}")
    if args.policy:
        parts.append(f"--policy {args.policy}")
    if args.policies:
        parts.append(f"--policies {args.policies}")
    parts += [f"--preset {args.preset}", f"--round-s {args.round_s:g}", f"--gpus-per-server {args.gpus_per_server}",
              f"--seed {args.seed}"]
    if args.catch_up_ratio is not PRESET_VALUE:
        parts.append(f"--catch-up-ratio {'none' if args.catch_up_ratio is None else f'{args.catch_up_ratio:g}'}")
    if args.window:
        parts.append(f"--window {args.window}")
    if args.throughputs:
        parts.append(f"--throughputs {args.throughputs}")
    if args.estimator != "oracle":
        parts.append(f"--estimator {args.estimator}")
    for flag in ("unknown_types", "profiling_share", "profiling_percentage", "reference_models", "measurement_noise"):
        value = getattr(args, flag)
        if value is not None:
            parts.append(f"--{flag.replace('_', '-')} {value}")
    return " ".join(parts)


def describe_faults(policy: str, result: SimulationResult, rest: str) -> str:
    """A person's account of a run's faults: what was injected by kind, what the system did, and
    the command that replays it."""
    from sim.faults import FaultSpec, parse_spec, replay_command

    report = result.faults
    assert report is not None
    injected = ", ".join(f"{kind} {n}" for kind, n in report.injected.items() if n) or "none"
    unfinished = sum(1 for j in result.jobs if j.completion_s is None and not j.dropped)
    checked = (
        "invariants: not checked (no journal)" if report.invariants_checked is None
        else f"invariants {', '.join(report.invariants_checked)} checked: {len(report.violations)} violation(s)"
    )
    spec: FaultSpec = parse_spec(report.spec)
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
