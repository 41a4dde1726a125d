"""What ``gavel logs`` prints, from the workers' answers: pure (answers in, text out), so the
merging of attempts, their order, the offsets to ask for next and the headers are tested without
a broker (tests/cli/test_cli_logs.py).

Attempts print in the order they started (whichever worker ran them), each under a header: the
worker, its ranks for a gang, when it started and how it ended (or that it runs).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field

from common.messages import LogsReported, attempt_key


def when(unix_s: float) -> str:
    return datetime.datetime.fromtimestamp(unix_s, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def ranks_text(ranks: tuple[int, ...]) -> str:
    if len(ranks) <= 1:
        return ""
    contiguous = list(ranks) == list(range(ranks[0], ranks[0] + len(ranks)))
    return f", ranks {ranks[0]}-{ranks[-1]}" if contiguous else f", ranks {','.join(map(str, ranks))}"


@dataclass
class Attempt:
    worker_id: str
    attempt: int
    started_unix_s: float
    ranks: tuple[int, ...] = ()
    ended: str = ""
    ended_unix_s: float = 0.0
    kept_from: int = 0
    pieces: dict[int, tuple[str, int]] = field(default_factory=dict)  # offset -> (text, next offset)
    printed_to: int | None = None  # the next byte to print (None: nothing printed yet)
    header_printed: bool = False
    end_printed: bool = False
    complete: bool = False  # ended, and a whole answer since said so: every byte of it is here

    @property
    def key(self) -> str:
        return attempt_key(self.worker_id, self.attempt)

    def received_to(self) -> int:
        """The byte after what is here without a gap, from where printing is (what to ask for next)."""
        at = self.printed_to if self.printed_to is not None else min(self.pieces, default=self.kept_from)
        while at in self.pieces and self.pieces[at][1] > at:
            at = self.pieces[at][1]
        return at


class LogsView:
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.attempts: dict[str, Attempt] = {}
        self.notes: dict[str, str] = {}  # worker id -> why it has no output (a simulated fleet)
        self._parts: dict[tuple[str, str], tuple[set[int], int]] = {}  # (request, worker) -> (parts here, of)
        self._in_answer: dict[tuple[str, str], set[str]] = {}  # (request, worker) -> attempts it spoke of
        self._at_line_start = True
        self._last_printed = ""  # the attempt whose text was printed last
        self._tail_start = False  # the first text of an attempt may begin mid-stream on purpose (--tail)

    # -- answers in ----------------------------------------------------------------------------

    def add(self, part: LogsReported) -> None:
        if part.job_id != self.job_id:
            return
        answer = (part.request_id, part.worker_id)
        got, _ = self._parts.setdefault(answer, (set(), part.parts))
        got.add(part.part)
        if part.note:
            self.notes[part.worker_id] = part.note
            return
        key = attempt_key(part.worker_id, part.attempt)
        a = self.attempts.get(key)
        if a is None:
            a = self.attempts[key] = Attempt(part.worker_id, part.attempt, part.started_unix_s, tuple(part.ranks))
        if part.ended and not a.ended:
            a.ended, a.ended_unix_s = part.ended, part.ended_unix_s
        a.kept_from = max(a.kept_from, part.kept_from)
        if part.next_offset > part.offset and (a.printed_to is None or part.offset >= a.printed_to):
            a.pieces[part.offset] = (part.text, part.next_offset)
        self._in_answer.setdefault(answer, set()).add(key)
        if self.answered(part.request_id, part.worker_id):
            for k in self._in_answer[answer]:
                if self.attempts[k].ended:
                    self.attempts[k].complete = True

    def answered(self, request_id: str, worker_id: str) -> bool:
        """Every part of that worker's answer to that request is here."""
        got, of = self._parts.get((request_id, worker_id), (set(), 1))
        return len(got) >= of

    def answering(self, request_id: str) -> set[str]:
        """The workers that began to answer ``request_id``."""
        return {w for (r, w) in self._parts if r == request_id}

    def incomplete_answers(self, request_id: str) -> set[str]:
        return {w for w in self.answering(request_id) if not self.answered(request_id, w)}

    # -- what to ask next ------------------------------------------------------------------------

    def offsets(self) -> dict[str, int]:
        return {a.key: a.received_to() for a in self.attempts.values() if not a.complete}

    def done(self) -> tuple[str, ...]:
        return tuple(sorted(a.key for a in self.attempts.values() if a.complete))

    def running_on(self) -> set[str]:
        """Workers that hold an attempt not complete yet."""
        return {a.worker_id for a in self.attempts.values() if not a.complete}

    # -- text out --------------------------------------------------------------------------------

    def keep_last_lines(self, lines: int) -> None:
        """Only the last ``lines`` lines of every attempt together (``--tail``): earlier attempts
        with none of them are not shown at all."""
        self._tail_start = True
        remaining = lines
        for a in sorted(self.attempts.values(), key=_order, reverse=True):
            if remaining <= 0:
                del self.attempts[a.key]
                continue
            start = min(a.pieces, default=a.kept_from)
            end = a.received_to() if a.pieces else start
            its_lines = _lines("".join(_joined(a, start)))
            kept = its_lines[-remaining:]
            remaining -= len(kept)
            # one piece now, ending where the bytes received end (its start is never asked for)
            a.pieces = {start: ("".join(kept), end)} if kept else {}

    def render(self, *, follow: bool) -> str:
        """The text to print now, from where the last call stopped. Without ``follow`` a header
        says at once how its attempt ended; with it, a running attempt's header says so, and a
        line says when it ends."""
        out: list[str] = []
        for a in sorted(self.attempts.values(), key=_order):
            new = self._new_text(a)
            if not a.header_printed:
                self._write(out, self._header(a, ending=bool(a.ended)))
                self._last_printed = a.key
                a.header_printed = True
                a.end_printed = bool(a.ended)
            if new:
                if self._last_printed not in ("", a.key):
                    # following, attempts that overlap (a worker's last lines come after the next
                    # one began): say whose lines these are again
                    self._write(out, f"==> {self.job_id} on {a.worker_id}, attempt {a.attempt}, continued <==\n")
                self._write(out, new)
                self._last_printed = a.key
            if follow and a.ended and a.complete and not a.end_printed and a.header_printed:
                self._write(out, f"==> {self.job_id} on {a.worker_id}, attempt {a.attempt}: ended {when(a.ended_unix_s)}: {a.ended} <==\n")
                a.end_printed = True
        return "".join(out)

    def _new_text(self, a: Attempt) -> str:
        if not a.pieces:
            return ""
        parts: list[str] = []
        if a.printed_to is None:
            a.printed_to = min(a.pieces)
            if a.printed_to > 0 and not self._tail_start:
                parts.append(f"[the first {a.printed_to:,} bytes of this attempt are no longer kept by the worker]\n")
        elif a.printed_to not in a.pieces and a.pieces and min(a.pieces) > a.printed_to and a.kept_from > a.printed_to:
            skipped = min(a.pieces) - a.printed_to
            parts.append(f"[{skipped:,} bytes removed by the worker before they were read]\n")
            a.printed_to = min(a.pieces)
        while a.printed_to in a.pieces:
            text, next_offset = a.pieces.pop(a.printed_to)
            parts.append(text)
            a.printed_to = next_offset
        for stale in [o for o in a.pieces if o < a.printed_to]:
            del a.pieces[stale]
        return "".join(parts)

    def _header(self, a: Attempt, *, ending: bool) -> str:
        how = f"ended {when(a.ended_unix_s)}: {a.ended}" if ending else "running"
        return (
            f"==> {self.job_id} on {a.worker_id}, attempt {a.attempt}{ranks_text(a.ranks)}: "
            f"started {when(a.started_unix_s)}, {how} <==\n"
        )

    def _write(self, out: list[str], text: str) -> None:
        if text.startswith("==>") and not self._at_line_start:
            out.append("\n")
        out.append(text)
        self._at_line_start = text.endswith("\n")


def _order(a: Attempt) -> tuple[float, str, int]:
    return (a.started_unix_s, a.worker_id, a.attempt)


def _joined(a: Attempt, start: int) -> list[str]:
    texts, at = [], start
    while at in a.pieces and a.pieces[at][1] > at:
        text, at = a.pieces[at][0], a.pieces[at][1]
        texts.append(text)
    return texts


def _lines(text: str) -> list[str]:
    """``text`` as lines with their ends (a last line without one counts)."""
    chunks = text.split("\n")
    lines = [c + "\n" for c in chunks[:-1]]
    return lines + [chunks[-1]] if chunks[-1] else lines
