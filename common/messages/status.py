"""Asking the mechanism what it is doing (``gavel jobs``, ``gavel cluster``, ...): a request on a
shared topic, the reply on the asker's own key."""

from __future__ import annotations

from common.messages.base import Message, message


@message("status.requested")
class StatusRequested(Message):
    request_id: str
    query: str  # jobs | job | workers | cluster | clock | events | shares
    reply_to: str  # the asker's id: the reply goes to status.reply.<reply_to>
    job_id: str = ""  # for query "job" (and "events": that job's only)
    limit: int = 0  # for query "events": the newest this many (0: all it keeps; `gavel top` wants a screenful)


@message("status.reply.{reply_to}")
class StatusReported(Message):
    request_id: str
    reply_to: str
    body: str  # JSON (this part of it): the answer, or {"error": "..."}
    # A long answer (every job of a big cluster) comes in parts, each within the codec's limit on
    # one string; the asker joins parts 0..parts-1 of its request.
    part: int = 0
    parts: int = 1
