"""What happened in the cluster, for people watching it (`gavel events`, `gavel top`): one message
type for every kind of event, published by the mechanism under ``event.<kind>``. Observers only:
nothing schedules on these (the facts themselves travel as RoundStarted, JobCompleted, ...)."""

from __future__ import annotations

from common.messages.base import Message, message

#: Every kind, in the order a boundary says them. ``placed``: a job starts, or moves (another type
#: or other workers); ``preempted``: it ran in the last round, is still active, and does not run
#: in this one; ``mechanism_started``: a start, a restart or a fail-over (a new journal epoch).
EVENT_KINDS = (
    "round_started",
    "round_ended",
    "placed",
    "preempted",
    "completed",
    "failed",
    "cancelled",
    "worker_joined",
    "worker_lost",
    "mechanism_started",
)


@message("event.{kind}")
class ClusterEvent(Message):
    event_id: str  # derived from what it says: the same event published again has the same id
    kind: str  # one of EVENT_KINDS
    time_s: float  # the mechanism's clock (Unix seconds on a wall-clock cluster)
    round_id: int  # the round it belongs to (the latest one, for events between boundaries)
    job_id: str = ""  # "": not about one job
    worker_id: str = ""  # "": not about one worker (a gang names its workers in the detail)
    accelerator_type: str = ""
    detail: str = ""  # a short sentence for people
