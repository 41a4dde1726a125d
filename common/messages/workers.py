"""Worker membership messages. A worker is one server owning GPUs of one accelerator type."""

from __future__ import annotations

from common.messages.base import Message, message


@message("worker.registered")
class WorkerRegistered(Message):
    worker_id: str
    accelerator_type: str  # e.g. "v100"
    gpu_count: int
    server_id: str = ""  # servers group GPUs for gang placement; defaults to the worker id
    # The clock its leases run on: "wall", "scaled x100" (--time-scale 100) or "lockstep". A
    # mechanism on another clock refuses the worker and says so: their rounds would never agree.
    # "" (older workers): not checked.
    clock: str = ""
    # This process of the worker: a fresh token at every start. The mechanism counts heartbeats
    # from the instance it registered only, and takes a new instance of the same worker (same
    # id, type and GPUs) as a restart: the old one's leases end and the new one takes its place.
    # "" (older workers): not told apart.
    instance: str = ""


@message("worker.heartbeat")
class WorkerHeartbeat(Message):
    worker_id: str
    lease_ids: tuple[str, ...] = ()  # the leases the worker is running now
    epoch: int = 0  # the highest command epoch the worker has obeyed (stale commands are refused)
    instance: str = ""  # the process that beats (WorkerRegistered.instance)


@message("worker.id_in_use")
class WorkerIdInUse(Message):
    """A process that tried to start as a worker whose id another live process holds (the broker
    keeps one claim per worker id) and gave up: the mechanism records it (`gavel cluster`,
    workers_refused) so that an operator sees the attempt where they look."""

    worker_id: str
    accelerator_type: str
    gpu_count: int
    host: str = ""
    reason: str = ""
