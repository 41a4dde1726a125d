"""A cancel: whether its sender may, what it changes, and the kills it sends. Pure.

A job not admitted yet is cancelled at once; an admitted one leaves at the next boundary, after
its running lease is settled (its steps so far count); a job over already has nothing to cancel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.messages import CancelJob, JobCancelled, KillJobs
from mechanism_service.core import ownership
from mechanism_service.core.endings import Ending, end_job
from mechanism_service.core.leases import workers_of

if TYPE_CHECKING:
    from mechanism_service.core.memory import Memory


@dataclass(frozen=True, slots=True)
class Cancelled:
    """What a cancel did: whether anything changed (it is then journaled), the answer for the
    asker, the job's end when it ended now (before admission), the terminal event to publish
    (again, when it was cancelled before: deduplicated), and whether the job now waits for the
    next boundary to leave."""

    changed: bool
    answer: dict[str, object]
    ending: Ending | None = None
    event: JobCancelled | None = None
    cancelling: bool = False


def refused(memory: Memory, message: CancelJob, user_id: str, rules: ownership.Ownership) -> str:
    """Why this cancel is not allowed ("": it is): a broker user the broker did not validate
    (``user_id``: the one it did), or a requester who is neither the job's owner nor an
    operator."""
    forged = ownership.unverified(message.broker_user, user_id)
    if forged:
        return f"cancel of {message.job_id!r} not accepted: {forged}"
    requester = ownership.owner(message.requested_by, message.broker_user or user_id, rules)
    job_owner = memory.owners.get(message.job_id)
    if job_owner is None or ownership.may_cancel(job_owner, requester, rules):
        return ""
    return ownership.refusal(message.job_id, job_owner, requester)


def cancel(memory: Memory, job_id: str, reason: str, now_s: float) -> Cancelled:
    obs = memory.observations
    if job_id in obs.cancelled:
        row = obs.cancelled[job_id]
        event = JobCancelled(job_id, str(row["reason"]), float(row["cancelled_at_s"]), int(row.get("steps_done", 0)))  # type: ignore[call-overload]
        return Cancelled(False, {"job_id": job_id, "state": "cancelled", "reason": row["reason"]}, event=event)
    if any(j.job_id == job_id for j in memory.submitted) or any(j.job_id == job_id for j, _ in [*memory.held, *memory.queued]):
        ending = end_job(memory, job_id, "cancelled", reason, now_s)
        event = ending.event
        assert isinstance(event, JobCancelled)
        return Cancelled(True, {"job_id": job_id, "state": "cancelled", "reason": reason}, ending, event)
    state = memory.state
    if state is not None and job_id in state.jobs.index_of:
        if job_id in memory.cancelling:
            return Cancelled(False, {"job_id": job_id, "state": "cancelling", "reason": memory.cancelling[job_id]})
        memory.cancelling[job_id] = reason
        return Cancelled(True, {
            "job_id": job_id, "state": "cancelling", "reason": reason,
            "note": "it is not scheduled again; it leaves when its current round ends",
        }, cancelling=True)
    ended = next((j for j in state.completed if j.job_id == job_id), None) if state is not None else None
    if ended is not None:
        how = "completed" if ended.steps_remaining <= 0 else "failed"
        return Cancelled(False, {"error": f"job {job_id!r} has already {how}: nothing to cancel"})
    if job_id in obs.rejected:
        return Cancelled(False, {"error": f"job {job_id!r} was rejected ({obs.rejected[job_id]}): nothing to cancel"})
    return Cancelled(False, {"error": f"no job {job_id!r}"})


def kills(memory: Memory, job_id: str, reason: str) -> list[KillJobs]:
    """A cancelled job that runs now is stopped now (a real worker would run it to its lease's
    end otherwise; its steps so far still count). Only a lease it runs alone: a packed
    partner keeps its round."""
    state = memory.state
    if state is None or job_id not in memory.cancelling:
        return []
    for lease_id, lease in memory.expected.items():
        job = state.jobs.get(lease.entry[0])
        if len(lease.entry) != 1 or job is None or job.job_id != job_id:
            continue
        if lease_id in memory.ended_leases or memory.reports.get(lease_id):
            return []  # over already
        return [
            KillJobs(worker_id, memory.round_id - 1, lease_id, memory.epoch, f"cancelled: {reason}")
            for worker_id, _ in workers_of(memory.worker_of, lease.placement)
        ]
    return []


def leaving(memory: Memory) -> list[tuple[str, str]]:
    """The admitted jobs cancelled since the last boundary, with why: they leave at this one,
    after their last round was settled (a job that completed in it completed: one terminal
    state each). The list of them is cleared."""
    state = memory.state
    assert state is not None
    out = [(job_id, reason) for job_id, reason in memory.cancelling.items() if job_id in state.jobs.index_of]
    memory.cancelling.clear()
    return out
