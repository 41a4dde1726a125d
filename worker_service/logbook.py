"""What the worker keeps of its jobs' output, and how it serves it: pure rules, values in and out
(the files are worker_service/job_logs.py's, the bus worker_service/log_desk.py's).

An *attempt* is one start of a job's processes on this worker. Its output is one stream of bytes:
stdout and stderr of every rank the worker ran, whole lines as they were written (a gang's lines
begin ``[rank N] ``). The stream is kept in segment files named by the offset of their first byte,
so dropping the oldest segment keeps every offset meaningful:

    <log-dir>/<job>/attempt-<n>.json              who, when, how it ended
    <log-dir>/<job>/attempt-<n>.<first byte>.log  the output from that byte on

Bounds, so that no job and no long run fills the disk:
- per job (all its attempts here): at most ``job_bytes``; a segment ends at ``segment_bytes``, and
  when a new one begins the oldest go until the rest fit (so 3/4 to all of ``job_bytes`` is kept);
- per worker: attempts that ended more than ``keep_s`` ago go, and then, oldest ended first, until
  what is kept fits in ``total_bytes``; a running attempt is never removed (its job bound holds it).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from common.messages import LogsReported, LogsRequested
from worker_service.core import safe_name

PART_BYTES = 60_000  # of UTF-8 text per answer part: under the codec's 64 KiB limit on one string
LINE_HOLD_BYTES = 64 * 1024  # a partial line longer than this is written without waiting for its end
MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class LogLimits:
    job_bytes: int = 8 * MiB
    total_bytes: int = 1024 * MiB
    keep_s: float = 7 * 24 * 3600.0
    attempts_per_job: int = 100  # older attempts' headers go too

    @property
    def segment_bytes(self) -> int:
        return max(1, self.job_bytes // 4)


@dataclass(frozen=True, slots=True)
class Segment:
    attempt: int
    first_byte: int
    size: int

    @property
    def end(self) -> int:
        return self.first_byte + self.size


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """An attempt's header (its JSON file)."""

    job_id: str
    worker_id: str
    attempt: int
    started_unix_s: float
    ranks: tuple[int, ...] = ()
    lease_id: str = ""
    ended: str = ""  # "" while it runs
    ended_unix_s: float = 0.0

    def as_json(self) -> dict[str, object]:
        return {
            "job_id": self.job_id, "worker_id": self.worker_id, "attempt": self.attempt,
            "started_unix_s": self.started_unix_s, "ranks": list(self.ranks), "lease_id": self.lease_id,
            "ended": self.ended, "ended_unix_s": self.ended_unix_s,
        }

    @staticmethod
    def from_json(data: Mapping[str, object]) -> AttemptRecord | None:
        try:
            return AttemptRecord(
                job_id=str(data["job_id"]), worker_id=str(data["worker_id"]), attempt=int(data["attempt"]),  # type: ignore[call-overload]
                started_unix_s=float(data["started_unix_s"]),  # type: ignore[arg-type]
                ranks=tuple(int(r) for r in data.get("ranks") or ()),  # type: ignore[attr-defined]
                lease_id=str(data.get("lease_id", "")), ended=str(data.get("ended", "")),
                ended_unix_s=float(data.get("ended_unix_s", 0.0) or 0.0),  # type: ignore[arg-type]
            )
        except (KeyError, TypeError, ValueError):
            return None


# -- names ---------------------------------------------------------------------------------------


def job_dir_name(job_id: str) -> str:
    """One path component per job id: readable, and apart from another id that reads the same."""
    return f"{safe_name(job_id)[:100]}-{hashlib.sha1(job_id.encode()).hexdigest()[:10]}"


def record_name(attempt: int) -> str:
    return f"attempt-{attempt}.json"


def segment_name(attempt: int, first_byte: int) -> str:
    return f"attempt-{attempt}.{first_byte}.log"


_SEGMENT = re.compile(r"attempt-(\d+)\.(\d+)\.log")
_RECORD = re.compile(r"attempt-(\d+)\.json")


def parse_segment(name: str, size: int) -> Segment | None:
    m = _SEGMENT.fullmatch(name)
    return Segment(int(m.group(1)), int(m.group(2)), size) if m else None


def parse_record_name(name: str) -> int | None:
    m = _RECORD.fullmatch(name)
    return int(m.group(1)) if m else None


# -- writing -------------------------------------------------------------------------------------


def complete_lines(held: bytes, chunk: bytes, *, final: bool = False) -> tuple[bytes, bytes]:
    """(what to write now, what to hold): whole lines (ended by \\n or \\r, so a progress bar
    shows), a partial line too when it is long or the stream ends (``final``)."""
    data = held + chunk
    if final or len(data) - max(data.rfind(b"\n"), data.rfind(b"\r")) - 1 > LINE_HOLD_BYTES:
        return data, b""
    cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
    return data[:cut], data[cut:]


def mark_lines(data: bytes, rank: int | None) -> bytes:
    """A gang's lines say their rank (one file holds every rank this worker ran)."""
    if rank is None or not data:
        return data
    prefix = f"[rank {rank}] ".encode()
    return b"".join(prefix + line for line in data.splitlines(keepends=True))


def segments_to_drop(segments: Iterable[Segment], job_bytes: int) -> list[Segment]:
    """The oldest segments of a job (all its attempts here) beyond ``job_bytes``; the newest one
    (being written) always stays."""
    newest_first = sorted(segments, key=lambda s: (s.attempt, s.first_byte), reverse=True)
    kept = 0
    drop: list[Segment] = []
    for k, s in enumerate(newest_first):
        if k > 0 and kept + s.size > job_bytes:
            drop.append(s)
        else:
            kept += s.size
    return drop


@dataclass(frozen=True, slots=True)
class KeptAttempt:
    """An attempt as the worker-wide bound sees it."""

    job_dir: str
    attempt: int
    ended_unix_s: float | None  # None: running
    bytes: int


def attempts_to_forget(attempts: Sequence[KeptAttempt], now_unix_s: float, limits: LogLimits) -> list[KeptAttempt]:
    """Ended attempts older than ``keep_s``, then the oldest ended until the rest fit in
    ``total_bytes``; then, per job, the oldest attempts past ``attempts_per_job``. Running ones stay."""
    forget: dict[tuple[str, int], KeptAttempt] = {}
    ended = sorted((a for a in attempts if a.ended_unix_s is not None), key=lambda a: (a.ended_unix_s, a.job_dir, a.attempt))
    for a in ended:
        if now_unix_s - (a.ended_unix_s or 0.0) > limits.keep_s:
            forget[(a.job_dir, a.attempt)] = a
    total = sum(a.bytes for a in attempts if (a.job_dir, a.attempt) not in forget)
    for a in ended:
        if total <= limits.total_bytes:
            break
        if (a.job_dir, a.attempt) not in forget:
            forget[(a.job_dir, a.attempt)] = a
            total -= a.bytes
    by_job: dict[str, list[KeptAttempt]] = {}
    for a in attempts:
        if (a.job_dir, a.attempt) not in forget:
            by_job.setdefault(a.job_dir, []).append(a)
    for kept in by_job.values():
        kept.sort(key=lambda a: a.attempt)
        for a in kept[: max(0, len(kept) - limits.attempts_per_job)]:
            if a.ended_unix_s is not None:
                forget[(a.job_dir, a.attempt)] = a
    return list(forget.values())


def ending(*, outcome: str, exit_codes: Sequence[int | None], stop_reason: str) -> str:
    """How an attempt ended, for its header: the last lease's outcome, and why it was stopped."""
    codes = [c for c in exit_codes if c is not None]
    code = next((c for c in codes if c != 0), codes[0] if codes else None)
    how = "" if code is None else (f"killed by signal {-code}" if code < 0 else f"exit code {code}")
    if outcome == "finished":
        return "finished" + (f" ({how})" if how and code != 0 else "")
    if outcome == "crashed":
        return f"crashed ({how})" if how else "crashed"
    if stop_reason:
        return f"stopped: {stop_reason}" + (f" ({how})" if how and code != 0 else "")
    return f"exited ({how})" if how else "exited"


# -- serving -------------------------------------------------------------------------------------


def start_offset(key: str, request: LogsRequested, kept_from: int) -> int | None:
    """Where this attempt's answer starts (None: the asker has it all); before ``kept_from`` is
    not kept: the answer starts there and says so."""
    if key in request.done:
        return None
    asked = (request.offsets or {}).get(key)
    return max(kept_from, asked if asked is not None else kept_from)


def tail_start(data: bytes, lines: int) -> int:
    """The index in ``data`` where its last ``lines`` lines begin (a last line without its end
    counts as one)."""
    if lines <= 0:
        return 0
    end = len(data) - 1 if data.endswith(b"\n") else len(data)
    for _ in range(lines):
        end = data.rfind(b"\n", 0, end)
        if end < 0:
            return 0
    return end + 1


def utf8_complete(data: bytes) -> int:
    """How many bytes of ``data`` end on a whole UTF-8 character (a write may stop inside one; the
    rest comes with the next answer)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte or ASCII: does its sequence fit?
            need = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
            return len(data) if back >= need else len(data) - back
    return len(data)


def text_pieces(data: bytes, offset: int, *, final: bool, part_bytes: int = PART_BYTES) -> list[tuple[int, str, int]]:
    """``data`` (the attempt's bytes from ``offset``) as (offset, text, next offset) pieces of at
    most ``part_bytes`` of UTF-8 each, cut between characters; an unfinished character at the end
    waits for the next answer unless the attempt has ended (``final``)."""
    usable = len(data) if final else utf8_complete(data)
    pieces: list[tuple[int, str, int]] = []
    at = 0
    while at < usable:
        take = min(part_bytes, usable - at)
        while True:
            cut = at + take
            if cut < usable:  # between two characters
                cut = at + (utf8_complete(data[at:cut]) or take)
            text = data[at:cut].decode("utf-8", "replace")
            if len(text.encode()) <= part_bytes or take <= 4:
                break
            take //= 2  # bytes that are not UTF-8 become 3 bytes each (U+FFFD)
        pieces.append((offset + at, text, offset + cut))
        at = cut
    return pieces


@dataclass(frozen=True, slots=True)
class AttemptView:
    """What the worker read of one attempt for an answer."""

    record: AttemptRecord
    kept_from: int
    offset: int  # where ``data`` starts
    data: bytes


def answer_parts(request: LogsRequested, worker_id: str, views: Sequence[AttemptView]) -> list[LogsReported]:
    """The worker's answer: every attempt's new bytes in parts (an attempt with nothing new still
    gets one, its header: how it is going), numbered across the answer. Nothing: no parts."""
    pieces: list[dict[str, object]] = []
    for view in sorted(views, key=lambda v: v.record.attempt):
        r = view.record
        header = {
            "attempt": r.attempt, "started_unix_s": r.started_unix_s, "ended": r.ended, "ended_unix_s": r.ended_unix_s,
            "ranks": r.ranks, "kept_from": view.kept_from,
        }
        chunks = text_pieces(view.data, view.offset, final=bool(r.ended))
        if not chunks:
            chunks = [(view.offset, "", view.offset)]
        for offset, text, next_offset in chunks:
            pieces.append({**header, "offset": offset, "text": text, "next_offset": next_offset})
    return [
        LogsReported(request.request_id, request.reply_to, worker_id, request.job_id, part=k, parts=len(pieces), **p)  # type: ignore[arg-type]
        for k, p in enumerate(pieces)
    ]
