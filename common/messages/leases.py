"""Lease commands, sent by the mechanism to one worker (``worker.cmd.<worker id>.<verb>``).

Every command carries (round, lease id, epoch): workers refuse epochs older than the newest they
have obeyed, so a restarted mechanism or a stale duplicate cannot double-book a GPU.
"""

from __future__ import annotations

from common.messages.base import Message, message


@message("worker.cmd.{worker_id}.run")
class RunJobs(Message):
    """Start one job, or two packed jobs sharing the same GPUs, for the length of a lease."""

    worker_id: str
    round_id: int
    lease_id: str
    epoch: int
    job_ids: tuple[str, ...]  # one job, or a packed pair
    gpu_ids: tuple[int, ...]  # GPU indices on the worker
    lease_duration_s: float
    max_steps: tuple[int, ...] = ()  # per job in job_ids: stop after this many steps (remaining)
    job_types: tuple[str, ...] = ()  # per job in job_ids: what to run (a template name)
    scale_factor: int = 1  # GPUs of the gang; this worker runs len(gpu_ids) of them
    restore_s: float = 0.0  # time lost restoring from a checkpoint before the first step


@message("worker.cmd.{worker_id}.extend")
class ExtendLease(Message):
    """Keep running the same jobs on the same GPUs into the next round (no checkpoint/restore)."""

    worker_id: str
    round_id: int
    lease_id: str
    epoch: int
    lease_duration_s: float
    job_ids: tuple[str, ...] = ()
    max_steps: tuple[int, ...] = ()
    job_types: tuple[str, ...] = ()
    scale_factor: int = 1


@message("worker.cmd.{worker_id}.kill")
class KillJobs(Message):
    """Stop a lease now: checkpoint and exit."""

    worker_id: str
    round_id: int
    lease_id: str
    epoch: int
    reason: str = ""
