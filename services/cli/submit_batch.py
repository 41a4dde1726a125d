"""What ``gavel submit`` sends, built and checked before anything is published: one job from its
flags or every job of a trace (its ids under the trace's own namespace), each checked field by
field as the policy checks it (common/job_checks.py: one line naming the flag, or the trace's
job, exit 2), and the notes a user should read about job types and throughputs the table does
not have (accepted: the estimator starts them from a prior). services/cli/submit_cmd.py
publishes the Batch."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import hashlib
import pathlib
import re
import uuid
from typing import TYPE_CHECKING

from common.errors import JobFieldError, TraceError
from common.job_checks import check_job, check_number
from services.cli.common import CommandFailed, load_table

# The messages and the trace readers are imported where they are used: `gavel submit --help`
# starts without them (services/cli/__init__.py).
if TYPE_CHECKING:
    from common.messages import JobSpec
    from common.throughputs import ThroughputTable
    from sim.traces import TraceJob

FLAG_OF_FIELD = {
    "job_id": "--job-id", "job_type": "--job-type", "total_steps": "--steps", "scale_factor": "--scale-factor",
    "priority_weight": "--priority-weight", "slo_s": "--slo-s", "entity": "--entity", "command": "--command",
    "working_dir": "--working-dir",
}
ACCELERATOR_TYPE = re.compile(r"[A-Za-z0-9_-]+")  # a --throughput type: what a worker's --type is likely to be
UNKNOWN_SHOWN = 5  # job types of a trace named in the note about types the table does not have


@dataclasses.dataclass(frozen=True)
class Batch:
    batch_id: str  # one per invocation: the mechanism's answer is about what this one sent
    specs: list[JobSpec]
    offsets_s: list[float]  # arrival after the mechanism receives the batch (live clusters)
    notes: tuple[str, ...] = ()  # for the user, on stderr: accepted, but worth knowing


def _trace(path: str) -> tuple[tuple[TraceJob, ...], str]:
    """The trace's jobs, and its namespace ``<stem>-<6 hex of its content>``: the same file always
    gets the same ids (a retry is absorbed), another trace other ids. The file is read once."""
    from sim.traces import input_format, parse_trace, read_trace_text

    try:
        text = read_trace_text(path)
        jobs = parse_trace(text, source=path, trace_format=input_format(path, text))
    except TraceError as e:
        raise CommandFailed(f"--trace: {e}", exit_code=2) from None
    if not jobs:
        raise CommandFailed(f"--trace {path}: the trace has no jobs", exit_code=2)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:6]
    return jobs, f"{pathlib.Path(path).stem}-{digest}"


def batch_from_args(args: argparse.Namespace) -> Batch:
    from common.messages import JobSpec

    table = load_table(args.throughputs)
    if args.allow_new_types and args.throughput is None:
        raise CommandFailed("--allow-new-types: only with --throughput (it keeps an estimate for types the table lacks)", exit_code=2)
    if args.trace:
        # a trace gives each job its own: a flag for one job would be ignored without a word
        for flag in ("steps", "scale_factor", "priority_weight", "slo_s", "entity", "job_id", "command", "working_dir", "throughput"):
            if getattr(args, flag) is not None:
                raise CommandFailed(f"--{flag.replace('_', '-')}: only with --job-type (a trace gives each job's own)", exit_code=2)
        jobs, namespace = _trace(args.trace)
        prefix = f"{namespace}/" if args.id_prefix is None else args.id_prefix
        first_s = min(j.arrival_time_s for j in jobs)
        specs = [
            # A trace's own commands are Gavel's (its workloads directory, %s placeholders) and run
            # nowhere here: real workers run the catalog's workload for each job type instead.
            JobSpec(
                prefix + j.job_id, j.job_type, j.total_steps, j.scale_factor, j.priority_weight, j.slo_s, None,
                "", 0.0 if args.now else j.arrival_time_s,
            )
            for j in jobs
        ]
        offsets = [0.0 if args.now else j.arrival_time_s - first_s for j in jobs]
        batch = Batch(f"trace:{namespace}:{uuid.uuid4().hex[:12]}", specs, offsets)
    else:
        if args.steps is None:
            raise CommandFailed("--steps: required with --job-type", exit_code=2)
        if args.id_prefix is not None or args.now:
            raise CommandFailed(f"{'--id-prefix' if args.id_prefix is not None else '--now'}: only with --trace", exit_code=2)
        if args.working_dir is not None and not args.command:
            raise CommandFailed("--working-dir: only with --command (catalog workloads run in the worker's --work-dir)", exit_code=2)
        if args.command is not None and not args.command.strip():
            raise CommandFailed("--command: empty; leave it out to run the catalog's workload for --job-type", exit_code=2)
        estimate = parse_throughput(args.throughput) if args.throughput is not None else None
        job_id = args.job_id or uuid.uuid4().hex[:12]
        spec = JobSpec(
            job_id, args.job_type, args.steps, 1 if args.scale_factor is None else args.scale_factor,
            1.0 if args.priority_weight is None else args.priority_weight, args.slo_s, args.entity, args.command or "", 0.0,
            working_dir=str(pathlib.Path(args.working_dir).absolute()) if args.working_dir else "",
            throughput_estimate_steps_per_s=estimate,
        )
        batch = Batch(f"job:{job_id}:{uuid.uuid4().hex[:12]}", [spec], [0.0])
    for spec in batch.specs:
        check_spec(spec, args.max_gpus, trace=bool(args.trace))
    if not args.trace:
        check_own_type(batch.specs[0], table)
    notes = (
        *throughput_notes(batch.specs, table, allow_new=args.allow_new_types),
        *unknown_notes(batch.specs, table, trace=bool(args.trace)),
    )
    return dataclasses.replace(batch, notes=notes)


def parse_throughput(values: list[str]) -> dict[str, float]:
    """``--throughput v100=12.5,k80=3.1`` (the flag may be repeated: its lists are joined) -> a
    map of accelerator type to steps/s, each finite and >= 0 (0: the job cannot run there), each
    type once. The types are not checked against the table: a user's cluster may have others."""
    out: dict[str, float] = {}
    for item in (part.strip() for value in values for part in value.split(",")):
        name, sep, raw = item.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep or not name or not raw:
            raise CommandFailed(f"--throughput: expected TYPE=STEPS_PER_S[,TYPE=STEPS_PER_S...], got {item!r}", exit_code=2)
        if not ACCELERATOR_TYPE.fullmatch(name):
            raise CommandFailed(f"--throughput: an accelerator type is letters, digits, '_' and '-', got {name!r}", exit_code=2)
        if name in out:
            raise CommandFailed(f"--throughput: {name} given twice", exit_code=2)
        try:
            number = float(raw)
        except ValueError:
            raise CommandFailed(f"--throughput: {name}: expected a number of steps/s, got {raw!r}", exit_code=2) from None
        try:
            out[name] = check_number(number, name)  # finite and >= 0: all the estimator takes
        except JobFieldError as e:
            raise CommandFailed(f"--throughput: {e.field}: {e.reason}", exit_code=2) from None
    return out


def throughput_notes(specs: list[JobSpec], table: ThroughputTable, *, allow_new: bool = False) -> list[str]:
    """A --throughput type the table does not name is kept (a user's cluster may have it), but an
    estimator built on that table has nowhere to put it: say so, since a typo ("V100") would
    otherwise be dropped without a word. When no type given is one the table has, the estimate
    would count on no type the system knows: refused (exit 2), unless ``allow_new`` (the user
    says those types exist: workers of a type the table lacks, the mechanism uses the figure)."""
    given = {w for spec in specs for w in (spec.throughput_estimate_steps_per_s or {})}
    real = [w for w in table.accelerator_types if not w.endswith("_unconsolidated")]  # Gavel's pseudo-types: no worker has one
    for spec in specs:
        estimate = spec.throughput_estimate_steps_per_s or {}
        if estimate and not any(estimate.values()) and set(real) <= set(estimate):
            # 0 says "cannot run there": on every type the cluster can have, the job would be held for ever
            raise CommandFailed(
                f"--throughput: 0 steps/s on every accelerator type ({', '.join(real)}): the job could run nowhere; "
                "give the types it runs on, and leave out a type you do not know",
                exit_code=2,
            )
    unknown = sorted(given - set(real))
    if not unknown or allow_new:
        return []
    known = ", ".join(real)
    if len(unknown) == len(given):
        raise CommandFailed(
            f"--throughput: no accelerator type of the throughput table ({known}) in it: {', '.join(unknown)}; "
            "a typo? If the cluster has (or will have) workers of that type, --allow-new-types keeps the estimate",
            exit_code=2,
        )
    return [
        f"gavel: note: --throughput: not an accelerator type of the throughput table ({known}): {', '.join(unknown)}; "
        "an estimator on that table ignores the estimate there"
    ]


def unknown_notes(specs: list[JobSpec], table: ThroughputTable, *, trace: bool) -> list[str]:
    """One note for jobs whose type (or gang size) the reference table does not have: they are
    accepted, and scheduled from the estimator's figures, which start from a prior (a typical job
    of that size, or the user's --throughput) until the first measurements arrive."""
    unknown = [spec for spec in specs if not table.has_job(spec.job_type, spec.scale_factor)]
    if not unknown:
        return []
    what = "it is" if len(unknown) == 1 else "they are"
    then = f"{what} scheduled from estimates that start from a prior until the first measurements arrive"
    if not trace:
        [spec] = unknown
        if spec.job_type in table.job_types:
            sizes = ", ".join(str(sf) for t, sf in sorted(table.job_keys) if t == spec.job_type)
            subject = f"{spec.job_type!r} on {spec.scale_factor} GPUs is not in the reference throughput table (it has {sizes})"
        else:
            subject = f"job type {spec.job_type!r} is not in the reference throughput table{did_you_mean(spec.job_type, table)}"
        hint = "" if spec.throughput_estimate_steps_per_s else " (--throughput TYPE=STEPS_PER_S,... gives a better start)"
        return [f"gavel: note: {subject}: {then}{hint}"]
    keys = list(dict.fromkeys((spec.job_type, spec.scale_factor) for spec in unknown))  # in the trace's order
    named = ", ".join(repr(t) if sf == 1 else f"{t!r} on {sf} GPUs" for t, sf in keys[:UNKNOWN_SHOWN])
    more = f" and {len(keys) - UNKNOWN_SHOWN} more" if len(keys) > UNKNOWN_SHOWN else ""
    return [
        f"gavel: note: {len(unknown)} of the trace's jobs are of job types not in the reference throughput table "
        f"({named}{more}): {then}"
    ]


def check_own_type(spec: JobSpec, table: ThroughputTable) -> None:
    """A job type the reference table lacks is a type of one's own only when the submitter says
    something of it: what a real worker runs (--command) or how fast it runs (--throughput).
    Otherwise it is most likely a typo (issue 23: `ResNet50 (batch size 64)` was accepted, then
    crashed on every real worker with "unknown job type"): one line, with the nearest known types."""
    if spec.job_type in table.job_types or spec.command or spec.throughput_estimate_steps_per_s:
        return
    raise CommandFailed(
        f"--job-type: {spec.job_type!r} is not a job type of the reference table{did_you_mean(spec.job_type, table)}; "
        "a type of your own needs --command (what a real worker runs) or --throughput (how fast it runs), or both "
        "(gavel job-types lists the table's)",
        exit_code=2,
    )


def did_you_mean(job_type: str, table: ThroughputTable) -> str:
    """`` (did you mean 'A'?)`` for the nearest known job types (ignoring case and punctuation)."""
    def key(name: str) -> str:
        return re.sub(r"[^a-z0-9]", "", name.lower())

    by_key = {key(name): name for name in sorted(table.job_types)}
    near = [by_key[k] for k in difflib.get_close_matches(key(job_type), list(by_key), n=2, cutoff=0.75)]
    if not near and key(job_type):  # a family's name alone: "Transformer" for "Transformer (batch size 16)"
        near = [name for k, name in by_key.items() if k.startswith(key(job_type))][:3]
    return f" (did you mean {' or '.join(repr(n) for n in near)}?)" if near else ""


def check_spec(spec: JobSpec, max_gpus: int | None, *, trace: bool) -> None:
    """One line naming the flag (one job) or the trace's job, exit 2: the same checks as the
    mechanism's and the policy's, so nothing published here is refused for its fields. A job type
    or gang size the throughput table lacks is not refused (unknown_notes says so instead)."""

    def bad(field: str, reason: str) -> CommandFailed:
        where = f"job {spec.job_id}: {field}" if trace else FLAG_OF_FIELD.get(field, field)
        return CommandFailed(f"{where}: {reason}", exit_code=2)

    try:
        check_job(
            job_id=spec.job_id, job_type=spec.job_type, scale_factor=spec.scale_factor,
            priority_weight=spec.priority_weight, slo_s=spec.slo_s, entity=spec.entity, total_steps=spec.total_steps,
            command=spec.command,
        )
    except JobFieldError as e:
        raise bad(e.field, e.reason) from None
    if max_gpus is not None and spec.scale_factor > max_gpus:
        raise bad("scale_factor", f"{spec.scale_factor} GPUs is more than --max-gpus {max_gpus}")


# -- talking to the mechanism --------------------------------------------------------------------
