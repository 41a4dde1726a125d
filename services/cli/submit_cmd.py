"""``gavel submit`` (one job, or every job of a trace) and ``gavel cancel ID``.

A submission is checked before it is published, field by field as the policy checks it
(common/job_checks.py): one line naming the flag (or the trace's job), exit 2. A job type (or a
gang size) the throughput table does not have is accepted, with a note: the mechanism schedules
it from the estimator's estimates, which start from a prior (better: the user's own,
``--throughput``) until the first measurements arrive; a ``--throughput`` on no accelerator type
of the table is refused (a likely typo) unless ``--allow-new-types``. It is then published persistent and
confirmed to the durable queues of common/topology.py (the mechanism's and the estimator's), which
this command makes sure exist: a submission the user was told about is kept even when the
mechanism (or the estimator) is down at that moment, or has never run. The batch is
sealed, and the mechanism answers what became of it: new, already known (the same id with the
same spec: absorbed), or refused (why).

Ids. One job: ``--job-id`` or a new unique id. A trace: its jobs' ids under a prefix of its own
(``<file stem>-<6 hex of its content>/``), because every Gavel trace numbers its jobs from 0 and a
second trace would collide with the first; submitting the same file again gives the same ids
(an idempotent retry). ``--id-prefix ''`` keeps the trace's ids as they are.

Arrivals. On a live cluster a trace keeps its spacing: each job arrives its trace arrival time
minus the first one's after the mechanism received the trace (on the mechanism's clock: with
``--time-scale 100`` an hour of trace passes in 36 s). ``--now`` makes every job arrive at once.
A mechanism replaying in lockstep takes the trace's own times.

Backpressure (issue 13). The mechanism's queue holds at most GAVEL_SUBMISSIONS_MAX_LENGTH
submissions waiting (common/topology.py); the broker refuses each one past that (a nack). Those
are not submitted: the command says how many were accepted, lists the refused ones (all of them
with --json) and why, and exits 1. The batch is sealed with the number the broker accepted, so
the mechanism's answer (and a lockstep replay) waits for no job it will never get; the seal
itself is tried again while the queue is full, until --timeout-s.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import getpass
import hashlib
import os
import pathlib
import pwd
import re
import sys
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from common.errors import JobFieldError, QueueFullError, SubscriptionError, TraceError
from common.job_checks import check_job, check_number
from services.cli.common import CommandFailed, load_table, positive_number, print_json, print_lines
from sim.progress import ProgressBar

# The messages, the bus and the trace readers are imported where they are used: `gavel submit
# --help` starts without them (services/cli/__init__.py).
if TYPE_CHECKING:
    from common.bus import Bus
    from common.config import Settings
    from common.messages import JobSpec, SubmissionsSealed
    from common.throughputs import ThroughputTable
    from common.topology import DurableQueue
    from sim.traces import TraceJob

REASONS_SHOWN = 10  # refused jobs listed one per line; `gavel jobs` shows every reason
SEAL_RETRY_S = (0.05, 1.0)  # the seal to a full queue: tried again after 50 ms, doubling to 1 s
FLAG_OF_FIELD = {
    "job_id": "--job-id", "job_type": "--job-type", "total_steps": "--steps", "scale_factor": "--scale-factor",
    "priority_weight": "--priority-weight", "slo_s": "--slo-s", "entity": "--entity", "command": "--command",
    "working_dir": "--working-dir",
}
ACCELERATOR_TYPE = re.compile(r"[A-Za-z0-9_-]+")  # a --throughput type: what a worker's --type is likely to be
UNKNOWN_SHOWN = 5  # job types of a trace named in the note about types the table does not have


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "submit", help="submit a job, or every job of a trace, to the mechanism",
        description="Publishes to the durable queues of the mechanism and the estimator (kept while they are down), then "
        "reports what the mechanism made of them: new, already known (same id and spec), refused (why). A trace's jobs get ids "
        "under a prefix of their own, and arrive with their trace's spacing, counted from when the "
        "mechanism receives the trace. Exit codes: 0 submitted; 1 some job refused (by the mechanism, or by the broker: "
        "its queue full), or no broker; 2 bad input.",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--job-type",
        help='a job template, e.g. "ResNet-50 (batch size 64)" (gavel job-types lists the ones the throughput table '
        "has); another name is accepted and scheduled from estimates, starting from a prior (see --throughput)",
    )
    what.add_argument("--trace", metavar="FILE", help="a trace (.trace or .jsonl): submit every job, keeping its arrival spacing")
    p.add_argument("--steps", type=int, help="total steps (with --job-type)")
    p.add_argument(
        "--scale-factor", type=int,
        help="GPUs of one accelerator type the job needs at once; more than the cluster has of any type it runs on: "
        "the job is held, saying why, until such workers join",
    )
    p.add_argument(
        "--throughput", metavar="TYPE=STEPS_PER_S,...", action="append",
        help="with --job-type: your own estimate of the job's steps/s (the whole gang's) alone on each accelerator "
        "type, e.g. v100=12.5,k80=3.1; the estimator starts from it and corrects it as measurements arrive",
    )
    p.add_argument(
        "--allow-new-types", action="store_true",
        help="with --throughput: keep it even when no type in it is an accelerator type of the throughput table "
        "(workers of a type the table lacks, in the cluster or yet to join; the mechanism uses your figure there); "
        "without it such an estimate is refused as a likely typo",
    )
    p.add_argument("--priority-weight", type=float, help="default 1")
    p.add_argument("--slo-s", type=float, help="finish within this many seconds of arrival")
    p.add_argument("--entity", help="the team or user the job belongs to (hierarchical policies)")
    p.add_argument("--job-id", help="default: a new unique id")
    p.add_argument(
        "--command",
        help="with --job-type: your own training script, run by a real worker through /bin/sh (it must use "
        "worker_service.training.LeaseIterator: docs/worker.md); --job-type then only says how fast it runs. "
        "Default: the catalog's workload for --job-type",
    )
    p.add_argument(
        "--working-dir", metavar="DIR",
        help="with --command: where it runs, on the worker (made absolute here; default: the worker's --work-dir)",
    )
    p.add_argument(
        "--id-prefix", metavar="PREFIX",
        help="with --trace: put PREFIX before each job's id (default: '<file stem>-<content hash>/'; '' keeps the ids)",
    )
    p.add_argument("--now", action="store_true", help="with --trace: every job arrives at once, not with the trace's spacing")
    p.add_argument(
        "--max-gpus", type=int,
        help="refuse gangs larger than this (default: none; a gang larger than the cluster is held until workers join)",
    )
    p.add_argument(
        "--throughputs", metavar="TABLE.json",
        help="the reference table, to say which job types it lacks (default: the shipped Gavel table)",
    )
    p.add_argument("--amqp", metavar="URL", help="broker URL (default: GAVEL_AMQP_URL)")
    p.add_argument(
        "--timeout-s", type=positive_number, default=10.0,
        help="wait this long for the mechanism to say what it made of the jobs, and for room in its full queue for "
        "the seal that ends the batch (default 10)",
    )
    p.add_argument("--no-wait", action="store_true", help="publish and return: do not wait for the mechanism's answer")
    p.add_argument("--json", action="store_true", help='print {"job_ids": [...], "new": n, "known": n, "refused": n, ...}')
    p.set_defaults(run=run_submit)

    c = sub.add_parser(
        "cancel", help="cancel a job: it ends in the state cancelled",
        description="A job not yet admitted is cancelled at once; a running one stops being scheduled and leaves "
        "when its current round ends (its steps so far are kept). Exit codes: 0 cancelled (or already); 1 no "
        "such job, already ended, or no answer (the cancel then waits in the mechanism's queue).",
    )
    c.add_argument("job_id")
    c.add_argument("--reason", default="cancelled by the user")
    c.add_argument("--amqp", metavar="URL", help="broker URL (default: GAVEL_AMQP_URL)")
    c.add_argument("--timeout-s", type=positive_number, default=5.0, help="wait this long for the mechanism (default 5)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(run=run_cancel)


# -- what to submit ------------------------------------------------------------------------------


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


def _bus(settings: Settings, amqp: str | None, source: str) -> Bus:
    from common.config import BusSettings
    from common.transport import make_bus

    bus_settings = dataclasses.replace(settings.bus, kind="amqp")
    if amqp:
        bus_settings = dataclasses.replace(bus_settings, amqp_url=BusSettings.from_env({"GAVEL_AMQP_URL": amqp}).amqp_url)
    return make_bus(bus_settings, source=source)


async def _make_sure_the_queues_exist(bus: Bus, routing_key: str, connect: Callable[[], Bus]) -> None:
    """Every durable queue of common/topology.py that what we publish under ``routing_key`` must
    reach, declared (passively first) before anything is published, so that it waits there for a
    consumer that is down or has never run. The mechanism's missing, and not ours to create, is a
    failure: nothing would schedule the jobs. Another's (the estimator's) is one warning: the jobs
    are scheduled all the same, on the mechanism's prior figures for them."""
    from common.topology import MECHANISM_SUBMISSIONS, SUBMISSION_QUEUES

    for queue in SUBMISSION_QUEUES:
        if routing_key not in queue.bindings:
            continue
        if queue == MECHANISM_SUBMISSIONS:
            try:
                await bus.declare(queue.name, queue.bindings)
            except SubscriptionError as e:
                raise CommandFailed(
                    f"the mechanism has never run here: {e}; start it once (`gavel serve mechanism` declares its "
                    "queues), or load deploy/rabbitmq/definitions.json into the broker (docs/deploy.md)"
                ) from None
        else:
            await _declare_or_warn(queue, bus, connect)


async def _declare_or_warn(queue: DurableQueue, bus: Bus, connect: Callable[[], Bus]) -> None:
    if await bus.consumer_count(queue.name) is not None:  # passive, on a channel of its own
        return
    # Missing: made on a connection of its own, since a refusal (a least-privilege user) closes the
    # channel it was tried on, and ours must go on to publish.
    spare = connect()
    await spare.start()
    try:
        await spare.declare(queue.name, queue.bindings)
    except SubscriptionError as e:
        print_lines([
            f"gavel: warning: the {queue.consumer} will not see these jobs until its queue exists: {e}; start "
            f"`gavel serve {queue.consumer}` once, or load deploy/rabbitmq/definitions.json into the broker (docs/deploy.md)"
        ], sys.stderr)
    finally:
        await spare.close()


@dataclasses.dataclass(frozen=True)
class Refused:
    """What the broker did not accept: the positions in the batch, and why, as the user reads it."""

    positions: tuple[int, ...]
    reason: str


def queue_full_reason(settings: Settings) -> str:
    bound = settings.bus.submissions_max_length
    at_most = f"at most {bound} waiting, GAVEL_SUBMISSIONS_MAX_LENGTH" if bound is not None else "its own bound"
    return f"the mechanism's submissions queue is full ({at_most}): it is behind; submit these again later"


async def _seal(bus: Bus, seal: SubmissionsSealed, deadline_s: float) -> bool:
    """Whether the seal got in. It goes to the same bounded queue as the jobs: while that is
    full, try again (the mechanism is draining it) until ``deadline_s`` (time.monotonic); a batch
    never sealed leaves no answer for us (and a lockstep replay waiting)."""
    import asyncio

    pause_s = SEAL_RETRY_S[0]
    while True:
        try:
            await bus.publish(seal)
            return True
        except QueueFullError:
            if time.monotonic() + pause_s > deadline_s:
                return False
            await asyncio.sleep(pause_s)
            pause_s = min(pause_s * 2, SEAL_RETRY_S[1])


async def run_submit(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio

    from common.messages import JobSubmitted, SubmissionsSealed
    from services.cli.replies import Replies

    batch = batch_from_args(args)
    print_lines(batch.notes, sys.stderr)  # before the broker: about the input, whatever becomes of it
    specs = batch.specs
    request_id = uuid.uuid4().hex[:12]
    answer: object = None
    bus = _bus(settings, args.amqp, "gavel-submit")
    await bus.start()
    try:
        await _make_sure_the_queues_exist(bus, JobSubmitted.ROUTING_KEY, lambda: _bus(settings, args.amqp, "gavel-submit"))
        async with Replies(bus) as replies:
            progress = ProgressBar("submit", sys.stderr, simulated=False) if len(specs) > 1 else None
            publishing = time.monotonic()
            total = len(specs)
            every = max(1, total // 200)  # the bar redraws ~200 times, not once per confirm

            published = [0]

            def confirmed(n: int) -> None:
                published[0] = n
                if progress is not None and (n % every == 0 or n == total):
                    progress(0.0, n, total)

            # one stream with a window of confirms in flight (batches would drain the window each time)
            who = os_user()  # the job's owner where people share a broker user (core/ownership.py)
            submissions = [
                JobSubmitted(spec, batch.batch_id, offset, submitted_by=who, broker_user=bus.user)
                for spec, offset in zip(specs, batch.offsets_s, strict=True)
            ]
            refused = Refused((), "")
            try:
                await bus.publish_many(submissions, on_confirmed=confirmed)
            except QueueFullError as e:  # the rest were published; these were not taken
                refused = Refused(e.refused, queue_full_reason(settings))
            except asyncio.CancelledError:  # Ctrl-C: say how far it got, and how to finish
                if progress is not None:
                    progress.close()
                print_lines([
                    f"gavel: interrupted: {published[0]} of {total} jobs were published and are kept (the batch is not "
                    "sealed); the same command again submits the rest (the jobs already taken are absorbed, not doubled)"
                ], sys.stderr)
                raise
            if progress is not None:
                progress.close()
            reply_to = "" if args.no_wait else replies.key
            # sealed with what the broker took: the mechanism waits for no job it will never get
            seal = SubmissionsSealed(
                batch.batch_id, total - len(refused.positions), reply_to, request_id,
                not_accepted=tuple(specs[i].job_id for i in refused.positions),
            )
            sealed = await _seal(bus, seal, time.monotonic() + args.timeout_s)
            publish_s = time.monotonic() - publishing
            if sealed and not args.no_wait:
                try:
                    answer = await replies.wait(request_id, args.timeout_s)
                except TimeoutError:
                    answer = None
    finally:
        await bus.close()
    return _report(args, specs, answer, publish_s, refused, sealed=sealed)


def _report(
    args: argparse.Namespace, specs: list[JobSpec], answer: object, publish_s: float, full: Refused | None = None,
    *, sealed: bool = True,
) -> int:
    ids = [spec.job_id for spec in specs]
    full = full or Refused((), "")
    not_taken = [ids[i] for i in full.positions]  # refused by the broker: never reached the mechanism
    summary = answer if isinstance(answer, dict) else None
    refused = int(summary.get("refused", 0)) if summary else 0
    reasons: dict[str, str] = dict(summary.get("reasons", {})) if summary else {}  # type: ignore[call-overload]
    out: list[str] = []  # the answer, on stdout
    notes: list[str] = []  # beside it, on stderr
    if not_taken:
        # first: the one line that says what happened, then which (the first few; --json: all)
        notes.append(f"gavel: {len(not_taken)} of {len(ids)} jobs not accepted: {full.reason}")
        if not args.json:
            notes += [f"gavel: job {job_id} not accepted (queue full)" for job_id in not_taken[:REASONS_SHOWN]]
            if len(not_taken) > REASONS_SHOWN:
                notes.append(f"gavel: ... and {len(not_taken) - REASONS_SHOWN} more not accepted (--json lists every one)")
    if args.json:
        print_json({
            "job_ids": ids, "published": len(ids), "accepted": len(ids) - len(not_taken), "publish_s": publish_s,
            "confirmed": summary is not None,
            **({k: summary[k] for k in ("batch_id", "new", "known", "refused", "reasons")} if summary else {}),
            **({"waits_for_workers": summary["waits_for_workers"]} if summary and "waits_for_workers" in summary else {}),
            "not_accepted": {"count": len(not_taken), "reason": full.reason, "job_ids": not_taken}, "sealed": sealed,
        })
    elif len(ids) == 1 and not refused and not not_taken:
        out.append(ids[0])
    elif len(ids) > 1:
        line = f"submitted {len(ids)} jobs ({ids[0]} .. {ids[-1]})"
        if not_taken:
            line += f": {len(ids) - len(not_taken)} accepted, {len(not_taken)} not accepted (queue full)"
        if summary:
            line += f"{';' if not_taken else ':'} {summary['new']} new, {summary['known']} already known, {refused} refused"
        out.append(line)
    if not sealed:
        notes.append(
            f"gavel: the batch could not be sealed: the mechanism's submissions queue stayed full for {args.timeout_s:g} s "
            f"(is the mechanism running?); the {len(ids) - len(not_taken)} jobs accepted wait in its queue"
        )
    elif summary is None and not args.no_wait:
        notes.append(
            f"gavel: the mechanism has not said what it made of {'it' if len(ids) == 1 else 'them'} within "
            f"{args.timeout_s:g} s (is it running?); what was published waits in its queue"
        )
    elif summary is not None and not args.json:
        if len(ids) == 1 and summary.get("known"):
            notes.append(f"gavel: {ids[0]} was submitted before with the same spec: nothing new")
        notes += [f"gavel: job {job_id} refused: {reason}" for job_id, reason in list(reasons.items())[:REASONS_SHOWN]]
        if refused > len(reasons) or len(reasons) > REASONS_SHOWN:
            notes.append(f"gavel: ... {refused - min(len(reasons), REASONS_SHOWN)} more refused (gavel jobs shows why)")
        waits: dict[str, str] = dict(summary.get("waits_for_workers", {}))  # type: ignore[call-overload]
        notes += [
            f"gavel: job {job_id} accepted, but the cluster as it is cannot run it: {reason} (gavel cancel {job_id} "
            "if none are coming; --max-gpus N refuses such gangs)"
            for job_id, reason in list(waits.items())[:REASONS_SHOWN]
        ]
    print_lines(out)
    print_lines(notes, sys.stderr)
    return 1 if refused or not_taken or not sealed else 0


def os_user() -> str:
    """Who runs this command, as the operating system says ("" if it cannot): the account of the
    process's user id, else the login name of the environment."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except (KeyError, OSError):
        try:
            return getpass.getuser()
        except (KeyError, OSError):
            return ""


async def run_cancel(args: argparse.Namespace, settings: Settings) -> int:
    from common.messages import CancelJob
    from services.cli.replies import Replies

    request_id = uuid.uuid4().hex[:12]
    bus = _bus(settings, args.amqp, "gavel-cancel")
    await bus.start()
    try:
        # only the queues a cancel reaches (the mechanism's): the estimator learns of it from job.cancelled
        await _make_sure_the_queues_exist(bus, CancelJob.ROUTING_KEY, lambda: _bus(settings, args.amqp, "gavel-cancel"))
        async with Replies(bus) as replies:
            try:
                cancel = CancelJob(args.job_id, args.reason, replies.key, request_id, requested_by=os_user(), broker_user=bus.user)
                await bus.publish(cancel)
            except QueueFullError:
                raise CommandFailed(f"the cancel was not accepted: {queue_full_reason(settings)}") from None
            try:
                answer = await replies.wait(request_id, args.timeout_s)
            except TimeoutError:
                raise CommandFailed(
                    f"no answer from the mechanism within {args.timeout_s:g} s (is it running?); the cancel waits "
                    "in its queue and applies when it runs"
                ) from None
    finally:
        await bus.close()
    if not isinstance(answer, dict) or "error" in answer:
        raise CommandFailed(str(answer.get("error") if isinstance(answer, dict) else answer))
    if args.json:
        print_json(answer)
    else:
        note = f" ({answer['note']})" if answer.get("note") else ""
        print_lines([f"{answer['job_id']}: {answer['state']}{note}"])
    return 0
