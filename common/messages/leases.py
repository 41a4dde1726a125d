"""Lease commands, sent by the mechanism to one worker (``worker.cmd.<worker id>.<verb>``).

Every command carries (round, lease id, epoch): workers refuse epochs older than the newest they
have obeyed, so a restarted mechanism or a stale duplicate cannot double-book a GPU. The epoch is
the mechanism's incarnation (it grows with every start).

A gang (``scale_factor`` > 1) runs one process per GPU (rank). Its workers, in rank order, are
``gang_workers``; this worker's ranks start at ``first_rank``. The first worker of the gang picks
the rendezvous address and tells the others (GangRendezvous).
"""

from __future__ import annotations

from collections.abc import Mapping

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
    restore_s: float = 0.0  # simulated fleets: time lost restoring before the first step
    gang_workers: tuple[str, ...] = ()  # a gang's workers in rank order ("": this worker alone)
    first_rank: int = 0  # the rank of this worker's first GPU in the gang
    commands: tuple[str, ...] = ()  # per job: the user's command ("": the catalog entry of its type)
    working_dirs: tuple[str, ...] = ()  # per job: where its command runs ("": the worker's --work-dir)
    # per job: the steps the mechanism has credited; the job resumes from its newest checkpoint at
    # or below this (a checkpoint whose report was lost is not counted, so it is not used)
    resume_steps: tuple[int, ...] = ()
    # per job: its submitter's steps/s per accelerator type ({}: none given; (): no job of the lease
    # gave one). A simulated fleet runs a job its table lacks from it (sim/derived_rates.py).
    throughput_estimates_steps_per_s: tuple[Mapping[str, float], ...] = ()


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
    # What a worker that is not running the jobs (it restarted) needs to start them anyway.
    gpu_ids: tuple[int, ...] = ()
    gang_workers: tuple[str, ...] = ()
    first_rank: int = 0
    commands: tuple[str, ...] = ()
    working_dirs: tuple[str, ...] = ()
    resume_steps: tuple[int, ...] = ()
    throughput_estimates_steps_per_s: tuple[Mapping[str, float], ...] = ()  # as RunJobs's


@message("worker.cmd.{worker_id}.kill")
class KillJobs(Message):
    """Stop a lease now: checkpoint and exit."""

    worker_id: str
    round_id: int
    lease_id: str
    epoch: int
    reason: str = ""


@message("worker.cmd.{worker_id}.rendezvous")
class GangRendezvous(Message):
    """From the gang's first worker to each other worker of the gang: where rank 0 listens
    (torch.distributed's MASTER_ADDR and MASTER_PORT) for this lease."""

    worker_id: str  # the receiver
    lease_id: str
    round_id: int
    epoch: int
    master_addr: str
    master_port: int
    from_worker: str = ""


@message("worker.cmd.{worker_id}.refused")
class WorkerRefused(Message):
    """The mechanism will not take this worker in (its clock differs, its GPUs do not fit the
    servers' size, ...): said to the worker too, so that its own log shows why it gets no work.
    It keeps announcing itself, and is taken in once the mechanism can (restarted with the same
    clock, say)."""

    worker_id: str
    epoch: int
    reason: str


@message("worker.cmd.{worker_id}.fenced")
class WorkerFenced(Message):
    """The mechanism declared this worker lost (no heartbeat within its grace period): its leases
    ended and its GPUs left the cluster. A worker that hears this stops every job it runs (their
    reports would be refused) and registers again to rejoin."""

    worker_id: str
    epoch: int
    reason: str
    # The instance declared lost ("": whatever process holds the id). A worker restarted under
    # the same id ignores a fence meant for the process it replaced.
    instance: str = ""
    # The instance that took this one's place: the fenced process stops for good instead of
    # registering again (it would take the id back, and the two would take turns)
    replaced_by: str = ""
