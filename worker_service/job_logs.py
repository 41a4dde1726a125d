"""The worker's record of its jobs' output on disk (the rules are worker_service/logbook.py's).

``LogStore.begin`` opens an attempt when a job's processes start; each process's stdout and
stderr are read by the worker (processes.py) and written here as whole lines; ``end`` says how it
ended. ``read`` is what an answer to ``gavel logs`` needs, and runs in a thread (it reads up to a
job's bound of bytes); the store's files are replaced atomically or appended, so a read beside
the writes sees a consistent prefix.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

import structlog

from common.messages import LogsRequested, attempt_key
from worker_service import logbook
from worker_service.logbook import AttemptRecord, AttemptView, KeptAttempt, LogLimits, Segment
from worker_service.training import write_json_atomic

log = structlog.get_logger("gavel.worker.logs")
PRUNE_EVERY_S = 60.0  # the worker-wide bound is checked at most this often (it lists every attempt kept)


class AttemptLog:
    """One attempt's output, being written."""

    def __init__(self, store: LogStore, directory: Path, record: AttemptRecord) -> None:
        self.record = record
        self._store = store
        self._dir = directory
        self._written = 0
        self._segment_size = 0
        self._file: BinaryIO | None = None
        self._broken = False
        self._closed = False

    def write(self, data: bytes) -> None:
        """Append ``data`` (whole lines); a disk that refuses is logged once, and the job runs on."""
        if not data or self._broken or self._closed:  # closed: a process outside its group wrote late
            return
        try:
            if self._file is None or (self._segment_size and self._segment_size + len(data) > self._store.limits.segment_bytes):
                self._next_segment()
            assert self._file is not None
            self._file.write(data)
            self._file.flush()
        except (OSError, ValueError) as e:  # ValueError: closed meanwhile
            self._broken = True
            log.warning("job_output_not_kept", job_id=self.record.job_id, attempt=self.record.attempt, error=str(e))
            return
        self._written += len(data)
        self._segment_size += len(data)

    def _next_segment(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = open(self._dir / logbook.segment_name(self.record.attempt, self._written), "ab")  # noqa: SIM115
        self._segment_size = 0
        self._store.bound_job(self._dir)

    def close(self) -> None:
        self._closed = True
        if self._file is not None:
            self._file.close()
            self._file = None


class LogStore:
    def __init__(self, root: str | Path, worker_id: str, limits: LogLimits = LogLimits(), now_unix_s: Callable[[], float] = time.time) -> None:
        self.root = Path(root)
        self.worker_id = worker_id
        self.limits = limits
        self._now = now_unix_s
        self._pruned_at_s = float("-inf")

    # -- writing ---------------------------------------------------------------------------------

    def open(self) -> None:
        """At the worker's start: attempts a previous process left running ended with it; then the
        worker-wide bound."""
        self.root.mkdir(parents=True, exist_ok=True)
        for directory, record in self._records():
            if not record.ended:
                ended = replace(record, ended="the worker stopped while it ran", ended_unix_s=self._last_write(directory, record))
                write_json_atomic(directory / logbook.record_name(record.attempt), ended.as_json())
        self.prune()

    def begin(self, job_id: str, *, ranks: Sequence[int], lease_id: str, started_unix_s: float) -> AttemptLog:
        directory = self.root / logbook.job_dir_name(job_id)
        directory.mkdir(parents=True, exist_ok=True)
        attempts = [n for n in (logbook.parse_record_name(p.name) for p in directory.iterdir()) if n is not None]
        record = AttemptRecord(job_id, self.worker_id, max(attempts, default=0) + 1, started_unix_s, tuple(ranks), lease_id)
        write_json_atomic(directory / logbook.record_name(record.attempt), record.as_json())
        return AttemptLog(self, directory, record)

    def end(self, attempt: AttemptLog, ended: str) -> None:
        """The attempt ended (``ended`` says how); the worker-wide bound, if it is due. Lists and
        reads files: the worker calls it in a thread."""
        attempt.close()
        attempt.record = replace(attempt.record, ended=ended, ended_unix_s=self._now())
        try:
            write_json_atomic(attempt._dir / logbook.record_name(attempt.record.attempt), attempt.record.as_json())  # noqa: SLF001
            if self._now() - self._pruned_at_s >= PRUNE_EVERY_S:
                self.prune()
        except OSError as e:
            log.warning("job_output_record_failed", job_id=attempt.record.job_id, error=str(e))

    def bound_job(self, directory: Path) -> None:
        """A segment begins: the job's oldest go until the rest and a full new one fit its bound."""
        room = self.limits.job_bytes - self.limits.segment_bytes
        for segment in logbook.segments_to_drop(self._segments(directory), room):
            (directory / logbook.segment_name(segment.attempt, segment.first_byte)).unlink(missing_ok=True)

    def prune(self) -> None:
        """The worker-wide bound: old and, past the total, the oldest ended attempts go."""
        self._pruned_at_s = self._now()
        kept = []
        for directory, record in self._records():
            size = sum(s.size for s in self._segments(directory) if s.attempt == record.attempt)
            kept.append(KeptAttempt(directory.name, record.attempt, record.ended_unix_s if record.ended else None, size))
        for attempt in logbook.attempts_to_forget(kept, self._now(), self.limits):
            directory = self.root / attempt.job_dir
            for segment in self._segments(directory):
                if segment.attempt == attempt.attempt:
                    (directory / logbook.segment_name(segment.attempt, segment.first_byte)).unlink(missing_ok=True)
            (directory / logbook.record_name(attempt.attempt)).unlink(missing_ok=True)
            try:
                directory.rmdir()  # only when it was the job's last attempt here
            except OSError:
                pass

    # -- reading -----------------------------------------------------------------------------------

    def read(self, request: LogsRequested) -> list[AttemptView]:
        """What an answer to ``request`` sends: each attempt of its job the asker does not hold in
        full, from where it asks (or its last ``tail_lines``)."""
        directory = self.root / logbook.job_dir_name(request.job_id)
        views = []
        for record in self._job_records(directory):
            if record.job_id != request.job_id:
                continue
            segments = sorted((s for s in self._segments(directory) if s.attempt == record.attempt), key=lambda s: s.first_byte)
            kept_from = segments[0].first_byte if segments else 0
            key = attempt_key(self.worker_id, record.attempt)
            start = logbook.start_offset(key, request, kept_from)
            if start is None:
                continue
            begins, data = self._read_from(directory, segments, start)
            if begins > start:  # removed while this read: what is kept begins later
                kept_from = start = begins
            tail = request.tail_lines > 0 and key not in (request.offsets or {})
            if tail:
                cut = logbook.tail_start(data, request.tail_lines)
                data, start = data[cut:], start + cut
            views.append(AttemptView(record, kept_from, start, data))
        return views

    def _read_from(self, directory: Path, segments: Sequence[Segment], start: int) -> tuple[int, bytes]:
        """(where the bytes begin, the bytes from ``start`` on); a segment dropped meanwhile moves
        the beginning past it."""
        chunks: list[bytes] = []
        for s in segments:
            if s.end <= start:
                continue
            try:
                with (directory / logbook.segment_name(s.attempt, s.first_byte)).open("rb") as f:
                    f.seek(max(0, start - s.first_byte))
                    chunks.append(f.read())
            except FileNotFoundError:
                chunks, start = [], s.end
        return start, b"".join(chunks)

    # -- listing ---------------------------------------------------------------------------------

    def _records(self) -> list[tuple[Path, AttemptRecord]]:
        out = []
        for directory in sorted(p for p in self.root.iterdir() if p.is_dir()) if self.root.is_dir() else []:
            out += [(directory, r) for r in self._job_records(directory)]
        return out

    def _job_records(self, directory: Path) -> list[AttemptRecord]:
        records = []
        try:
            names = os.listdir(directory)
        except OSError:
            return []
        for name in names:
            if logbook.parse_record_name(name) is None:
                continue
            try:
                record = AttemptRecord.from_json(json.loads((directory / name).read_text()))
            except (OSError, ValueError):
                record = None
            if record is not None:
                records.append(record)
        return sorted(records, key=lambda r: r.attempt)

    def _segments(self, directory: Path) -> list[Segment]:
        segments = []
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return []
        for entry in entries:
            try:
                segment = logbook.parse_segment(entry.name, entry.stat().st_size)
            except OSError:
                continue
            if segment is not None:
                segments.append(segment)
        return segments

    def _last_write(self, directory: Path, record: AttemptRecord) -> float:
        times = [record.started_unix_s]
        for s in self._segments(directory):
            if s.attempt == record.attempt:
                try:
                    times.append((directory / logbook.segment_name(s.attempt, s.first_byte)).stat().st_mtime)
                except OSError:
                    pass
        return max(times)
