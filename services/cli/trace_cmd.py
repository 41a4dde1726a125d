"""``gavel trace generate | convert | show``: make, translate and inspect job traces.

Formats (sim/traces/formats.py): ``.trace`` is Gavel's 10-column format, ``.jsonl`` JSON Lines;
reading also accepts Gavel's older 7-column Philly-derived traces (detected from the first line).
Exit codes: 0 done; 2 bad input (one line naming the file, line and column, or the flag).
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from common.config import Settings
from common.errors import TraceError
from common.throughputs import ThroughputTable
from services.cli.common import (
    CommandFailed,
    load_table,
    per_hour,
    print_json,
    print_table,
)
from sim.traces import (
    TraceFormat,
    TraceJob,
    TraceSpec,
    TraceStreams,
    TraceSummary,
    generate_trace,
    input_format,
    output_format,
    parse_trace,
    read_trace_text,
    renumbered,
    summarize_trace,
    write_trace,
)

REFERENCE_ACCELERATOR_TYPE = "v100"  # run times, steps and GPU-hours are sized on it (as in Gavel)
_FLAG_OF_FIELD = {
    "num_jobs": "--jobs", "jobs_per_hour": "--jobs-per-hour", "seed": "--seed", "fixed_run_time_s": "--fixed-run-time-s",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="make, convert or describe job trace files")
    trace_sub = p.add_subparsers(dest="trace_command", metavar="TRACE_COMMAND", required=True)

    gen = trace_sub.add_parser(
        "generate",
        help="write a synthetic trace with Gavel's job distribution",
        description=(
            "Job types uniform over the throughput table's templates; run time on a V100 60x10^U(1.5,3) s "
            "(80 percent) or 60x10^U(3,4) s; with --multi-gpu, 1/2/4/8 GPUs at 70/10/15/5 percent. With --rng "
            "gavel (the default) a seed gives the trace Gavel's simulator generates with that seed."
        ),
    )
    gen.add_argument("--jobs", type=int, required=True, metavar="N", help="number of jobs")
    arrivals = gen.add_mutually_exclusive_group(required=True)
    arrivals.add_argument("--jobs-per-hour", type=float, metavar="R", help="Poisson arrivals at R jobs per hour")
    arrivals.add_argument("--static", action="store_true", help="every job arrives at t = 0")
    gen.add_argument("--multi-gpu", action="store_true", help="jobs on 1, 2, 4 or 8 GPUs (70/10/15/5%%)")
    gen.add_argument("--priority-weights", action="store_true", help="20%% of the jobs get priority weight 5")
    gen.add_argument("--slos", action="store_true", help="SLO = run time x 1.2, 2 or 10 (a third each)")
    gen.add_argument(
        "--fixed-run-time-s", type=float, metavar="S", help="every job runs S seconds on a V100 (Gavel's --fixed-job-duration)"
    )
    gen.add_argument(
        "--steady-state", metavar="CLUSTER",
        help="first as many jobs as CLUSTER (v100=4,p100=4,k80=4 or 4:4:4) has GPUs, at t = 0, then the arrivals "
        "(Gavel's --simulate-steady-state)",
    )
    gen.add_argument("--seed", type=int, default=0, help="default 0")
    gen.add_argument(
        "--rng",
        choices=("gavel", "pcg64"),
        default="gavel",
        help="gavel: Mersenne Twister streams seeded as Gavel seeds them (default); pcg64: numpy's default generator",
    )
    gen.add_argument("--throughputs", metavar="TABLE.json", help="throughput table in Gavel's format (default: the shipped one)")
    gen.add_argument("--output", required=True, metavar="FILE", help="FILE.trace (Gavel's 10 columns) or FILE.jsonl")
    gen.set_defaults(run=run_generate)

    conv = trace_sub.add_parser("convert", help="rewrite a trace in another format (chosen by the output file's extension)")
    conv.add_argument("input", metavar="INPUT", help="a .trace (10- or 7-column) or .jsonl trace, or philly:VC[:SEED]")
    conv.add_argument("--output", required=True, metavar="FILE", help="FILE.trace or FILE.jsonl")
    conv.add_argument(
        "--renumber", action="store_true", help="number the jobs 0, 1, 2, ... in file order (needed for .trace when ids differ)"
    )
    conv.set_defaults(run=run_convert)

    show = trace_sub.add_parser("show", help="describe a trace: its jobs, arrival span, job types and GPU counts, GPU-hours on a V100")
    show.add_argument("file", metavar="FILE", help="a .trace (10- or 7-column) or .jsonl trace, or philly:VC[:SEED]")
    show.add_argument("--throughputs", metavar="TABLE.json", help="throughput table for the GPU-hours (default: the shipped one)")
    show.add_argument("--json", action="store_true")
    show.set_defaults(run=run_show)


def _read(path: str) -> tuple[tuple[TraceJob, ...], TraceFormat | None]:
    """A trace file's jobs and format, or a shipped Philly trace's (philly:VC[:SEED])."""
    from sim.traces.philly import parse_name, philly_trace

    try:
        philly = parse_name(path)
    except TraceError as e:
        raise CommandFailed(f"{path}: {e}", exit_code=2) from None
    if philly is not None:
        return philly_trace(*philly), TraceFormat.PHILLY
    text = read_trace_text(path)
    trace_format = input_format(path, text)
    return parse_trace(text, source=path, trace_format=trace_format), trace_format


def run_generate(args: argparse.Namespace, settings: Settings) -> int:
    output_format(args.output)  # a bad extension fails before any work
    table = load_table(args.throughputs)
    steady_state_gpus = _steady_state_gpus(args.steady_state, table)
    try:
        spec = TraceSpec(
            num_jobs=args.jobs,
            jobs_per_hour=None if args.static else args.jobs_per_hour,
            multi_gpu=args.multi_gpu,
            priority_weights=args.priority_weights,
            slos=args.slos,
            reference_accelerator_type=REFERENCE_ACCELERATOR_TYPE,
            fixed_run_time_s=args.fixed_run_time_s,
            steady_state_gpus=steady_state_gpus,
        )
        if args.rng == "gavel":
            streams = TraceStreams.gavel(args.seed)
        else:
            streams = TraceStreams.split(np.random.default_rng(args.seed))
    except TraceError as e:
        raise CommandFailed(f"{_FLAG_OF_FIELD.get(e.column or '', e.column)}: {e.reason}", exit_code=2) from None
    jobs = generate_trace(spec, table, streams)
    written = write_trace(jobs, args.output)
    arrivals = "static" if spec.jobs_per_hour is None else per_hour(spec.jobs_per_hour)
    gpu_hours = summarize_trace(jobs, table, REFERENCE_ACCELERATOR_TYPE).gpu_hours
    print(
        f"wrote {len(jobs)} jobs to {args.output} ({written.value}): {arrivals}, seed {args.seed} ({args.rng}); "
        f"{gpu_hours:,.1f} GPU-hours on {REFERENCE_ACCELERATOR_TYPE}"
    )
    return 0


def _steady_state_gpus(text: str | None, table: ThroughputTable) -> tuple[int, ...]:
    """--steady-state's cluster as GPUs per type in sorted type order (the order Gavel fills)."""
    if text is None:
        return ()
    from sim.scenario import parse_cluster

    try:
        cluster = parse_cluster(text, table)
    except CommandFailed as e:  # its line names --cluster: this command's flag is --steady-state
        raise CommandFailed(str(e).replace("--cluster", "--steady-state", 1), exit_code=2) from None
    return tuple(cluster[w] for w in sorted(cluster))


def run_convert(args: argparse.Namespace, settings: Settings) -> int:
    written_format = output_format(args.output)
    jobs, read_format = _read(args.input)
    if args.renumber:
        jobs = renumbered(jobs)
    elif written_format is TraceFormat.GAVEL:
        misnumbered = next(((i, job) for i, job in enumerate(jobs) if job.job_id != str(i)), None)
        if misnumbered is not None:
            position, job = misnumbered
            raise CommandFailed(
                f"{args.input}: job {job.job_id!r} is at position {position}, and Gavel's 10-column format keeps no ids "
                "(they are 0, 1, 2, ... in file order): pass --renumber to number the jobs that way",
                exit_code=2,
            )
    write_trace(jobs, args.output)
    source = read_format.value if read_format else "empty"
    print(f"converted {len(jobs)} jobs: {args.input} ({source}) -> {args.output} ({written_format.value})")
    return 0


def run_show(args: argparse.Namespace, settings: Settings) -> int:
    jobs, read_format = _read(args.file)
    table = load_table(args.throughputs)
    if read_format is TraceFormat.PHILLY:  # sized as gavel simulate sizes it (sim/traces/philly.py)
        from sim.traces.philly import sized_table

        table = sized_table(table, jobs)
    summary = summarize_trace(jobs, table, REFERENCE_ACCELERATOR_TYPE)
    if args.json:
        print_json(_summary_json(args.file, read_format, summary))
        return 0
    print(f"{args.file}: {summary.num_jobs} jobs ({read_format.value if read_format else 'empty'})")
    if not jobs:
        return 0
    for label, text in _summary_lines(summary):
        print(f"{label:<18}{text}")
    print()
    print_table(
        ["job type", "jobs", "share"],
        [(job_type, n, f"{100 * n / summary.num_jobs:.1f}%") for job_type, n in summary.job_type_counts.items()],
    )
    return 0


def _share(counts: dict, total: int) -> str:
    return ", ".join(f"{key:g}: {n} ({100 * n / total:.0f}%)" for key, n in counts.items())


def _summary_lines(s: TraceSummary) -> list[tuple[str, str]]:
    assert s.first_arrival_s is not None and s.last_arrival_s is not None
    span_s = s.last_arrival_s - s.first_arrival_s
    if span_s == 0:
        arrivals = f"all at {s.first_arrival_s:,.0f} s (static)"
    else:
        assert s.mean_interarrival_s is not None
        arrivals = (
            f"{s.first_arrival_s:,.0f} s to {s.last_arrival_s:,.0f} s ({span_s / 3600:,.1f} h); "
            f"one every {s.mean_interarrival_s:,.0f} s on average ({per_hour(float(f'{3600 / s.mean_interarrival_s:.3g}'))})"
        )
    if not s.arrivals_in_order:
        arrivals += "; NOT in arrival order"
    lines = [
        ("arrivals", arrivals),
        ("scale factors", _share(dict(s.scale_factor_counts), s.num_jobs)),
        ("priority weights", _share(dict(s.priority_weight_counts), s.num_jobs)),
        ("SLOs", f"{s.num_with_slo} jobs" if s.num_with_slo else "none"),
        ("GPU-hours", f"{s.gpu_hours:,.1f} on {s.reference_accelerator_type} (isolated run time x scale factor)"),
        ("job types", f"{len(s.job_type_counts)}"),
    ]
    unsized = sum(s.unsized_job_counts.values())
    if unsized:
        worst = ", ".join(f"{t} x{sf}: {n}" for (t, sf), n in list(s.unsized_job_counts.items())[:3])
        lines.append(
            (
                "not sized",
                f"{unsized} jobs have no {s.reference_accelerator_type} throughput for their scale factor "
                f"in the table, left out of the GPU-hours ({worst}{', ...' if len(s.unsized_job_counts) > 3 else ''})",
            )
        )
    return lines


def _summary_json(path: str, read_format: TraceFormat | None, s: TraceSummary) -> dict:
    rate = None if not s.mean_interarrival_s else 3600 / s.mean_interarrival_s
    return {
        "file": path,
        "format": read_format.value if read_format else None,
        "num_jobs": s.num_jobs,
        "first_arrival_s": s.first_arrival_s,
        "last_arrival_s": s.last_arrival_s,
        "mean_interarrival_s": s.mean_interarrival_s,
        "jobs_per_hour": rate if rate is None or math.isfinite(rate) else None,
        "arrivals_in_order": s.arrivals_in_order,
        "scale_factors": {str(k): n for k, n in s.scale_factor_counts.items()},
        "priority_weights": {f"{k:g}": n for k, n in s.priority_weight_counts.items()},
        "num_with_slo": s.num_with_slo,
        "job_types": dict(s.job_type_counts),
        "reference_accelerator_type": s.reference_accelerator_type,
        "gpu_hours": s.gpu_hours,
        "unsized_jobs": [{"job_type": t, "scale_factor": sf, "jobs": n} for (t, sf), n in s.unsized_job_counts.items()],
    }
