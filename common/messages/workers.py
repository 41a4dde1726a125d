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


@message("worker.heartbeat")
class WorkerHeartbeat(Message):
    worker_id: str
    lease_ids: tuple[str, ...] = ()  # the leases the worker is running now
    epoch: int = 0  # the highest command epoch the worker has obeyed (stale commands are refused)
