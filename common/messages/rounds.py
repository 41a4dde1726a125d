"""Round events, for observers and metrics."""

from __future__ import annotations

from common.messages.base import Message, message, value


@value
class Assignment:
    job_ids: tuple[str, ...]  # one job, or a packed pair
    worker_id: str
    accelerator_type: str
    gpu_ids: tuple[int, ...]
    lease_id: str
    extended: bool  # the same jobs kept the same GPUs from the previous round


@message("round.started")
class RoundStarted(Message):
    round_id: int
    start_time_s: float
    duration_s: float
    assignments: tuple[Assignment, ...]


@message("round.ended")
class RoundEnded(Message):
    round_id: int
    end_time_s: float
    jobs_completed: tuple[str, ...] = ()
