"""Who may hold a worker id: a registration read against the worker the mechanism holds under it.

A worker id names one process at a time (issue 23: a second process started with an id in use
was counted as a phantom server, and the commands for either landed on the other). Each worker
process announces an ``instance`` token of its own, and claims its id on the broker before it
consumes a command (``Bus.claim``): a second live process is refused there, at the worker. So a
registration that carries an instance holds the claim, and any other process of that id is gone.
What the mechanism makes of a registration, given what it holds under the id:

- nothing held (never joined, or declared lost): ``JOIN``;
- the same instance (a periodic re-announcement, a redelivery): ``REPEAT``;
- another instance: ``REPLACE`` (a restart, on the same server or after a move): the old process's
  leases end now and the new one takes its place, whatever its type and GPUs, since the old
  process cannot be running (it would hold the claim);
- no instance (a worker from before instances), while another process is held: ``REFUSE``, with
  why (it cannot show that it holds the claim); the same shape under no instance on both sides is
  a ``REPEAT`` as it always was.

A heartbeat counts only when it comes from the instance held (``beats_for``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Verdict(enum.Enum):
    JOIN = "join"
    REPEAT = "repeat"
    REPLACE = "replace"
    REFUSE = "refuse"


@dataclass(frozen=True, slots=True)
class Held:
    """The worker the mechanism holds under an id."""

    accelerator_type: str
    gpus: int
    instance: str  # "" for a worker from before instances


def verdict(held: Held | None, accelerator_type: str, gpus: int, instance: str) -> Verdict:
    if held is None:
        return Verdict.JOIN
    if instance == held.instance:
        return Verdict.REPEAT if (accelerator_type, gpus) == (held.accelerator_type, held.gpus) or instance else Verdict.REFUSE
    return Verdict.REPLACE if instance else Verdict.REFUSE


def refusal(worker_id: str, held: Held, accelerator_type: str, gpus: int) -> str:
    """Why a registration without an instance cannot take an id that another process holds."""
    return (
        f"worker id {worker_id!r} is held by a {held.accelerator_type} worker with {held.gpus} GPU(s); a registration "
        f"as {accelerator_type} with {gpus} GPU(s) that does not say which process it is (a worker from before "
        "instances) cannot take it while that one is alive: give it its own --worker-id, or stop the other and wait "
        "until it is declared lost (--worker-grace-s)"
    )


def replacement(held: Held, accelerator_type: str, gpus: int, instance: str) -> str:
    """Why the process held under an id is let go (the reason its fence and its ended leases give)."""
    change = "" if (accelerator_type, gpus) == (held.accelerator_type, held.gpus) else (
        f", now as {accelerator_type} with {gpus} GPU(s) (was {held.accelerator_type} with {held.gpus})"
    )
    return f"a new process of this worker (instance {instance}) took its place{change}"


def beats_for(held: Held | None, instance: str) -> bool:
    """A heartbeat keeps the held worker alive only when it comes from that process."""
    return held is not None and instance == held.instance
