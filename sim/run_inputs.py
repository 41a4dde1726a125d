"""What a simulation reads besides its flags, turned into values and checked: the throughput
table and the prices, the trace (a file, one of Gavel's Philly-derived traces by name, or Gavel's
generated jobs) against the table and the cluster, and the estimator's flags. A bad one is refused
in one line naming its flag (exit 2) before any simulated second passes. sim/scenario.py, which
``gavel simulate``, ``gavel sweep`` and ``gavel demo`` import, re-exports every name here.
"""

from __future__ import annotations

import collections
import json
import math
import pathlib
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from common.errors import CommandFailed, ProblemError, TraceError
from common.throughputs import ThroughputTable, throughput_table_from_json
from estimator_service.core.settings import EstimatorSettings
from policy_service.answer import SolveContext
from policy_service.service import shipped_context
from sim.learning import EstimationConfig
from sim.traces import TraceJob, TraceSpec, TraceStreams, generate_trace, read_trace
from sim.traces.philly import parse_name as parse_philly_name
from sim.traces.philly import philly_trace, sized_table

REFERENCE_ACCELERATOR_TYPE = "v100"  # generated run times are sized on it, as in Gavel
MAX_LISTED = 6  # kinds of offending jobs named in one error line


def bad_input(flag: str, message: str) -> CommandFailed:
    return CommandFailed(f"{flag}: {message}", exit_code=2)


def load_context(path: str | None) -> SolveContext:
    """The shipped Gavel table and prices, or another table (Gavel's JSON format) with the
    shipped prices."""
    shipped = shipped_context()
    if path is None:
        return shipped
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise bad_input("--throughputs", f"cannot read {path}: {e.strerror or e}") from None
    try:
        table = throughput_table_from_json(json.loads(text))
    except json.JSONDecodeError as e:
        raise bad_input("--throughputs", f"{path} is not JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except ProblemError as e:
        raise bad_input("--throughputs", f"{path}: {e}") from None
    return SolveContext(table, shipped.prices_per_hour)


def check_prices(cluster: Mapping[str, int], context: SolveContext) -> None:
    """Every type of the cluster needs a price: summary.json reports the runs' cost."""
    prices = context.prices_per_hour or {}
    missing = [w for w in cluster if w not in prices]
    if missing:
        raise bad_input(
            "--cluster",
            f"no price per GPU-hour for {', '.join(missing)} (prices are known for {', '.join(prices) or 'no type'}), "
            "so the runs' cost cannot be reported",
        )


def load_trace(path: str) -> tuple[TraceJob, ...]:
    """A trace file, or one of Gavel's Philly-derived traces shipped with the simulator
    (``philly:VC[:SEED]``, sim/traces/philly.py)."""
    try:
        philly = parse_philly_name(path)
        jobs = philly_trace(*philly) if philly is not None else read_trace(path)
    except TraceError as e:  # it names the file (and line and column): one line, exit 2
        raise bad_input("--trace", str(e)) from None
    if not jobs:
        raise bad_input(f"--trace {path}", "the trace has no jobs")
    return jobs


def trace_context(path: str, jobs: Sequence[TraceJob], context: SolveContext) -> SolveContext:
    """The context a trace runs with: a Philly trace's adds the sizes its gangs need that the table
    lacks (sim/traces/philly.py, sized_table); any other trace's is the context given."""
    if parse_philly_name(path) is None or context.table is None:
        return context
    return SolveContext(sized_table(context.table, jobs), context.prices_per_hour)


def generated_trace(
    num_jobs: int, jobs_per_hour: float | None, multi_gpu: bool, seed: int, table: ThroughputTable,
    **options: object,
) -> tuple[TraceJob, ...]:
    """Gavel's job distribution with Gavel's random streams for the seed (the trace Gavel's
    simulator generates with that seed); ``jobs_per_hour`` None: every job at t = 0. ``options``:
    TraceSpec's other fields (priority_weights, slos, fixed_run_time_s, steady_state_gpus), checked
    by the caller."""
    if num_jobs < 1:
        raise bad_input("--jobs", f"expected a whole number >= 1, got {num_jobs}")
    if jobs_per_hour is not None and not 0 < jobs_per_hour < math.inf:
        raise bad_input("--jobs-per-hour", f"expected a number > 0, got {jobs_per_hour:g}")
    if seed < 0:
        raise bad_input("--trace-seed", f"expected a whole number >= 0, got {seed}")
    spec = TraceSpec(
        num_jobs=num_jobs,
        jobs_per_hour=jobs_per_hour,
        multi_gpu=multi_gpu,
        reference_accelerator_type=REFERENCE_ACCELERATOR_TYPE,
        **options,  # type: ignore[arg-type]
    )
    return generate_trace(spec, table, TraceStreams.gavel(seed))


def check_trace(trace: Sequence[TraceJob], table: ThroughputTable, cluster: Mapping[str, int], source: str) -> None:
    """Refuse a trace with jobs this table and cluster cannot run, naming how many and which.

    The mechanism would refuse each such job at its arrival and the run would go on without it
    (sim/fastpath.py, ``rejected_job_ids``); a measured average over the jobs that happen to be
    runnable is not what the user asked for, so the command stops first.
    """
    total = len(trace)
    unknown = collections.Counter(j.job_type for j in trace if j.job_type not in table.job_types)
    if unknown:
        raise bad_input(
            source,
            f"{sum(unknown.values())} of {total} jobs have a job type the throughput table does not know: "
            + _listing((f"{t!r}", n) for t, n in unknown.most_common()),
        )
    unsized = collections.Counter((j.job_type, j.scale_factor) for j in trace if not table.has_job(j.job_type, j.scale_factor))
    if unsized:
        raise bad_input(
            source,
            f"{sum(unsized.values())} of {total} jobs have a (job type, scale factor) the throughput table cannot size: "
            + _listing((f"{t!r} x{sf}", n) for (t, sf), n in unsized.most_common())
            + "; use a table with those entries (--throughputs) or a trace without those jobs",
        )
    unplaceable = collections.Counter(
        (j.job_type, j.scale_factor) for j in trace if not _placeable(j.job_type, j.scale_factor, table, cluster)
    )
    if unplaceable:
        raise bad_input(
            source,
            f"{sum(unplaceable.values())} of {total} jobs can never run on this cluster (they need more GPUs of one "
            f"type than it has where their type runs): "
            + _listing((f"{t!r} x{sf}", n) for (t, sf), n in unplaceable.most_common())
            + f"; the cluster is {format_cluster(cluster)}",
        )


def _placeable(job_type: str, scale_factor: int, table: ThroughputTable, cluster: Mapping[str, int]) -> bool:
    steps_per_s = table.isolated_steps_per_s
    return any(
        gpus >= scale_factor and steps_per_s.get((job_type, scale_factor, w), 0.0) > 0 for w, gpus in cluster.items()
    )


def _listing(counted: Iterable[tuple[str, int]]) -> str:
    items = list(counted)
    shown = ", ".join(f"{what} ({n} job{'s' if n != 1 else ''})" for what, n in items[:MAX_LISTED])
    rest = len(items) - MAX_LISTED
    return shown + (f" and {rest} more kind{'s' if rest != 1 else ''}" if rest > 0 else "")


def format_cluster(cluster: Mapping[str, int]) -> str:
    return ", ".join(f"{gpus} {w}" for w, gpus in cluster.items())


def parse_estimation(args, table: ThroughputTable, trace: Sequence[TraceJob]) -> EstimationConfig:  # noqa: ANN001
    """--estimator and its options -> EstimationConfig; options that need the learned estimator
    are refused with the oracle (they would be ignored without a word)."""
    learned_only = {
        "--unknown-types": args.unknown_types, "--profiling-share": args.profiling_share,
        "--profiling-percentage": args.profiling_percentage, "--reference-models": args.reference_models,
        "--measurement-noise": args.measurement_noise,
    }
    if args.estimator != "learned":
        given = [flag for flag, value in learned_only.items() if value is not None]
        if given:
            raise bad_input(given[0], "only a learned estimator uses it: add --estimator learned")
        return EstimationConfig()
    unknown = _unknown_types(args.unknown_types, table, trace, args.seed)
    if len(table.job_types) - len(unknown) < 1:
        raise bad_input("--unknown-types", "at least one job type must stay known: the estimator compares new ones with it")
    for flag, value in (("--profiling-share", args.profiling_share), ("--profiling-percentage", args.profiling_percentage)):
        if value is not None and not 0.0 <= value <= 1.0:
            raise bad_input(flag, f"expected a share between 0 and 1, got {value:g}")
    if args.reference_models is not None and args.reference_models < 1:
        raise bad_input("--reference-models", f"expected a whole number >= 1, got {args.reference_models}")
    if args.measurement_noise is not None and not 0.0 <= args.measurement_noise < math.inf:
        raise bad_input("--measurement-noise", f"expected a standard deviation >= 0, got {args.measurement_noise:g}")
    defaults = EstimatorSettings()
    settings = EstimatorSettings(
        profiling_share=defaults.profiling_share if args.profiling_share is None else args.profiling_share,
        profiling_percentage=defaults.profiling_percentage if args.profiling_percentage is None else args.profiling_percentage,
    )
    return EstimationConfig(
        "learned", unknown, args.reference_models, settings, args.measurement_noise or 0.0,
    )


def _unknown_types(text: str | None, table: ThroughputTable, trace: Sequence[TraceJob], seed: int) -> tuple[str, ...]:
    """``N`` (that many of the trace's job types, drawn with the seed) or a comma-separated list
    of job types; none when not given."""
    if text is None:
        return ()
    text = text.strip()
    if text.isdigit():
        count = int(text)
        in_trace = sorted({j.job_type for j in trace})
        if count > len(in_trace):
            raise bad_input("--unknown-types", f"{count} is more than the trace's {len(in_trace)} job types")
        chosen = np.random.default_rng([seed, 13]).choice(len(in_trace), size=count, replace=False)
        return tuple(in_trace[i] for i in sorted(chosen))
    names = [name.strip() for name in text.split(",") if name.strip()]
    missing = [name for name in names if name not in table.job_types]
    if missing:
        raise bad_input("--unknown-types", f"{missing[0]!r} is not a job type of the throughput table (gavel job-types lists them)")
    return tuple(dict.fromkeys(names))
