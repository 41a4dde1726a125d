"""``gavel logs JOB [--follow] [--tail N]``: a job's output, from whichever workers ran it.

The question goes out on ``logs.requested``, which every real worker hears; each one that holds
output of the job answers on this command's own key (``logs.reply.<key>``, a private queue gone
with the command), in parts; the others stay silent. So the command waits a short while
(``--wait-s``, 2 s) for whoever answers, and a little longer for an answer that has begun. With
``--follow`` it asks every FOLLOW_EVERY_S for what is new after what it has, and asks the
mechanism whether the job has ended; it stops when the job has ended and every attempt is
printed to its end, or on Ctrl-C (exit 0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import uuid
from typing import TYPE_CHECKING

from services.cli.common import CommandFailed, open_bus, positive_int, positive_number

if TYPE_CHECKING:
    from common.bus import Bus, Delivery
    from common.config import Settings
    from services.cli.logs_view import LogsView
    from services.cli.replies import Replies

FOLLOW_EVERY_S = 1.0
ANSWER_MORE_S = 10.0  # how long an answer that has begun may take to finish
ENDED_STATES = {"completed", "failed", "cancelled", "rejected"}
NO_OUTPUT = (
    "no worker holds output of job {job!r} (it may have run on the simulated fleet, on a worker that is gone, "
    "or not have run yet)"
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "logs",
        help="show a job's output (stdout and stderr), from whichever workers ran it",
        description="Prints the output each worker kept of the job, attempt by attempt in the order they started, "
        "each under a header (worker, start, how it ended). Workers keep each job's last 8 MiB, for a week "
        "after it ends (docs/worker.md, 'A job's output').",
    )
    p.add_argument("job_id", metavar="JOB")
    p.add_argument("-f", "--follow", action="store_true", help="go on printing what the job writes until it ends (Ctrl-C stops)")
    p.add_argument("--tail", type=positive_int, metavar="N", help="begin with only the last N lines")
    p.add_argument(
        "--wait-s", type=positive_number, default=2.0, metavar="S",
        help="wait this long for the workers to answer (default 2: a worker that holds output answers within it)",
    )
    p.add_argument("--amqp", metavar="URL", help="broker URL (default: GAVEL_AMQP_URL)")
    p.set_defaults(run=run_logs)


async def run_logs(args: argparse.Namespace, settings: Settings) -> int:
    from common.errors import JobFieldError
    from common.job_checks import check_name

    try:
        check_name(args.job_id, "JOB")
    except JobFieldError as e:
        raise CommandFailed(str(e), exit_code=2) from None
    bus = await open_bus(settings, args.amqp)
    try:
        return await show_logs(bus, args.job_id, follow=args.follow, tail=args.tail or 0, wait_s=args.wait_s)
    finally:
        await bus.close()


async def show_logs(bus: Bus, job_id: str, *, follow: bool, tail: int = 0, wait_s: float = 2.0, out=None) -> int:  # noqa: ANN001
    """Print the job's output to ``out`` (stdout); follow it if asked. The exit code."""
    from services.cli.logs_view import LogsView
    from services.cli.replies import Replies

    out = out or sys.stdout
    view = LogsView(job_id)
    # the mechanism is asked only when following (has the job ended?): one private queue less
    stop = asyncio.Event()  # Ctrl-C while following: exit 0, no traceback
    async with Answers(bus, view) as answers, (Replies(bus) if follow else contextlib.nullcontext()) as status:
        with _ctrl_c_sets(stop) if follow else contextlib.nullcontext():
            return await _show(bus, answers, status, view, job_id, follow=follow, tail=tail, wait_s=wait_s, out=out, stop=stop)


async def _show(bus: Bus, answers: Answers, status: Replies | None, view: LogsView, job_id: str, *, follow: bool, tail: int, wait_s: float, out, stop: asyncio.Event) -> int:  # noqa: ANN001, PLR0913
    await answers.ask(job_id, tail=tail, wait_s=wait_s)
    if view.notes and not view.attempts:
        worker, note = next(iter(view.notes.items()))
        raise CommandFailed(f"job {job_id!r} has no output: {note} (its server {worker})")
    if not view.attempts and not (follow and await job_state(bus, status, job_id) not in (None, *ENDED_STATES)):
        raise CommandFailed(NO_OUTPUT.format(job=job_id))
    if tail:
        view.keep_last_lines(tail)
    _write(out, view.render(follow=follow))
    if not follow or stop.is_set():
        return 0
    return await _follow(bus, answers, status, view, job_id, wait_s, out, stop)


@contextlib.contextmanager
def _ctrl_c_sets(stop: asyncio.Event):  # noqa: ANN202
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, stop.set)
    except (NotImplementedError, RuntimeError):  # not the main thread
        pass
    try:
        yield
    finally:
        try:
            loop.remove_signal_handler(signal.SIGINT)
        except (NotImplementedError, RuntimeError):
            pass


async def _follow(bus: Bus, answers: Answers, status: Replies, view: LogsView, job_id: str, wait_s: float, out, stop: asyncio.Event) -> int:  # noqa: ANN001, PLR0913
    said_waiting = False
    while not stop.is_set():
        state = await job_state(bus, status, job_id)
        ended = state is None or state in ENDED_STATES  # None: the mechanism does not know it (any more)
        silent = await answers.ask(job_id, wait_s=wait_s, expect=view.running_on())
        _write(out, view.render(follow=True))
        if not view.attempts and not view.notes:
            if ended:
                raise CommandFailed(NO_OUTPUT.format(job=job_id))
            if not said_waiting:
                print(f"gavel: job {job_id!r} has no output yet ({state}); waiting for it", file=sys.stderr)
                said_waiting = True
        # ended: everything printed to its end, or its worker no longer answers (gone)
        if ended and all(a.complete or a.worker_id in silent for a in view.attempts.values()):
            return 0
        try:
            await asyncio.wait_for(stop.wait(), FOLLOW_EVERY_S)
        except asyncio.TimeoutError:
            pass
    return 0


async def job_state(bus: Bus, status: Replies, job_id: str) -> str | None:
    """The job's state as the mechanism says it ("running", "completed", ...); None when it does
    not know the job; "unknown" when it does not answer (following goes on)."""
    from common.errors import UnroutableError
    from common.messages import StatusRequested

    request_id = uuid.uuid4().hex[:12]
    try:
        await bus.publish(StatusRequested(request_id, "job", status.key, job_id))
        answer = await status.wait(request_id, timeout_s=3.0)
    except (UnroutableError, TimeoutError):
        return "unknown"
    if isinstance(answer, dict) and "error" in answer:
        return None
    return str(answer.get("state", "unknown")) if isinstance(answer, dict) else "unknown"


def _write(out, text: str) -> None:  # noqa: ANN001
    if text:
        out.write(text)
        out.flush()


class Answers:
    """The workers' answers to this command, into a LogsView, on a private queue."""

    def __init__(self, bus: Bus, view: LogsView) -> None:
        self._bus = bus
        self._view = view
        self.key = uuid.uuid4().hex[:12]
        self._changed = asyncio.Event()
        self._subscription = None

    async def __aenter__(self) -> Answers:
        from common.messages import LogsReported

        self._subscription = await self._bus.subscribe(
            f"cli.{self.key}", [LogsReported.ROUTING_KEY.format(reply_to=self.key)], self._on_answer, durable=False
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._subscription is not None:
            await self._subscription.cancel()

    async def _on_answer(self, d: Delivery) -> None:
        from common.messages import LogsReported

        if isinstance(d.message, LogsReported):
            self._view.add(d.message)
            self._changed.set()

    async def ask(self, job_id: str, *, wait_s: float, tail: int = 0, expect: set[str] | None = None) -> set[str]:
        """Ask every worker; wait ``wait_s`` for answers (less when every worker in ``expect`` has
        answered in full), then up to ANSWER_MORE_S for answers that have begun. The workers of
        ``expect`` that did not answer."""
        from common.messages import LogsRequested

        request_id = uuid.uuid4().hex[:12]
        view = self._view
        request = LogsRequested(request_id, job_id, self.key, view.offsets(), view.done(), tail)
        await self._bus.publish(request, mandatory=False)  # no worker at all: nobody answers, as when none has it
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while not (expect and all(view.answered(request_id, w) for w in expect) and not view.incomplete_answers(request_id)):
            if not await self._changed_before(deadline):
                break
        more = loop.time() + ANSWER_MORE_S
        while view.incomplete_answers(request_id):
            if not await self._changed_before(more):
                break
        return {w for w in (expect or set()) if not view.answered(request_id, w)}

    async def _changed_before(self, deadline: float) -> bool:
        """An answer came before ``deadline`` (loop time); False: the time is up."""
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            return False
        try:
            await asyncio.wait_for(self._changed.wait(), remaining)
        except asyncio.TimeoutError:
            return False
        self._changed.clear()
        return True
