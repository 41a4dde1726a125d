"""``gavel submit`` (one job, or every job of a trace) and ``gavel cancel ID``.

A submission is checked before it is published, field by field as the policy checks it
(common/job_checks.py, in services/cli/submit_batch.py): one line naming the flag (or the trace's job), exit 2. A job type (or a
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
import getpass
import os
import pwd
import sys
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from common.errors import QueueFullError, SubscriptionError
from services.cli.common import CommandFailed, positive_number, print_json, print_lines
from services.cli.submit_batch import batch_from_args
from sim.progress import ProgressBar

# The messages, the bus and the trace readers are imported where they are used: `gavel submit
# --help` starts without them (services/cli/__init__.py).
if TYPE_CHECKING:
    from common.bus import Bus
    from common.config import Settings
    from common.messages import JobSpec, SubmissionsSealed
    from common.topology import DurableQueue

REASONS_SHOWN = 10  # refused jobs listed one per line; `gavel jobs` shows every reason
SEAL_RETRY_S = (0.05, 1.0)  # the seal to a full queue: tried again after 50 ms, doubling to 1 s
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
