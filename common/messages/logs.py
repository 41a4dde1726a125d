"""A job's output (``gavel logs JOB``): a request every worker hears, answered by each worker that
holds output of that job, on the asker's own key, in parts.

A worker keeps each attempt of a job (one start of its processes there) as a stream of bytes:
stdout and stderr of every rank it ran, as written. Offsets are bytes of that stream; a worker
keeps only its latest bytes (``kept_from``: the first byte it still has).
"""

from __future__ import annotations

from collections.abc import Mapping
from common.messages.base import Message, message


def attempt_key(worker_id: str, attempt: int) -> str:
    """How a request names an attempt: ``<worker id>/<attempt>``."""
    return f"{worker_id}/{attempt}"


@message("logs.requested")
class LogsRequested(Message):
    request_id: str
    job_id: str
    reply_to: str  # the asker's id: the answers go to logs.reply.<reply_to>
    # the attempts the asker has begun (attempt_key -> the byte it wants next): only what is new
    # comes back; an attempt not named comes from its first kept byte (or its last tail_lines)
    offsets: Mapping[str, int] | None = None
    # attempts the asker holds in full (ended, read to their end): not sent again
    done: tuple[str, ...] = ()
    tail_lines: int = 0  # > 0: of an attempt not named in offsets, only its last lines


@message("logs.reply.{reply_to}")
class LogsReported(Message):
    """One part of one worker's answer: a piece of one attempt's output, with the attempt's
    header. A worker that holds nothing of the job sends nothing; a simulated fleet that ran it
    says so in ``note`` (attempt 0: there is no output)."""

    request_id: str
    reply_to: str
    worker_id: str
    job_id: str
    attempt: int = 0  # this worker's count of the job's starts there (1, 2, ...)
    started_unix_s: float = 0.0
    ended: str = ""  # how the attempt ended ("" while it runs)
    ended_unix_s: float = 0.0
    ranks: tuple[int, ...] = ()  # the gang's ranks this worker ran (a line of a gang says its rank)
    offset: int = 0  # the byte of the attempt's output where ``text`` starts
    next_offset: int = 0  # the byte after it: what to ask for next
    kept_from: int = 0  # the first byte the worker still keeps (older output was removed)
    text: str = ""  # the bytes as UTF-8 (bytes that are not: U+FFFD)
    note: str = ""  # no output, and why
    part: int = 0  # of this worker's answer to this request
    parts: int = 1
