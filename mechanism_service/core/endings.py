"""A job leaving the cluster, whichever way: ``end_job`` is the one place that says what goes with
it (issue 24: it was written out by hand in seven places). Pure: it changes the memory and returns
what the shell publishes and journals.

The ways a job leaves, and what it leaves as:

- ``refused``: its submission, on receipt (its fields, or a type nothing here can run);
- ``rejected``: at admission (the cluster can never run it) or set aside before it ever ran (the
  policy refuses to solve with it): nothing of it was used, so its id is free again;
- ``completed``: its last step was credited;
- ``failed``: a gang short of steps too many times, a process that crashed too many times in a
  row, or set aside after it ran;
- ``cancelled``: before admission at once, after it at the next boundary.

Every way: its command, its estimates and its submitter's prior go, late estimates for it are
dropped, the profiling runs it was owed are forgotten, and when it ended is kept for the
retention rule (core/retention.py). A job still in the state leaves it (failed: among the
completed, with no finish time; cancelled or rejected: withdrawn).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from common.messages import JobCancelled, JobCompleted, JobFailed, JobRejected
from common.messages.base import Message
from mechanism_service.core import audit
from mechanism_service.core import status as status_core
from mechanism_service.core.job_entries import remove_job, withdraw_job
from mechanism_service.core.model import JobState

if TYPE_CHECKING:
    from mechanism_service.core.memory import Memory

Outcome = Literal["refused", "rejected", "completed", "failed", "cancelled"]
GANG_FAILED = "a gang got fewer steps than GPUs too many times"


@dataclass(frozen=True, slots=True)
class Ending:
    """A job's end, for the shell: the event to publish under ``message_id`` (the same end
    published again by a restarted mechanism is recognisably the same), and the audit record."""

    job_id: str
    outcome: Outcome
    reason: str
    at_s: float
    job: JobState | None  # its record, when it was admitted
    event: Message
    message_id: str

    def record(self, epoch: int) -> audit.EndRecord:
        return audit.EndRecord(self.job_id, self.outcome, self.reason, self.at_s, epoch)


def end_job(
    memory: Memory, job_id: str, outcome: Outcome, reason: str, now_s: float, *, settled: JobState | None = None
) -> Ending:
    """The job leaves the cluster: see the module docstring. ``settled``: its record, when the
    settle retired it from the state already (completed, or a gang short of steps)."""
    obs = memory.observations
    job = settled if settled is not None else _leave_state(memory, job_id, outcome)
    memory.launch.pop(job_id, None)
    memory.book.forget(job_id)
    memory.user_estimates.pop(job_id, None)
    memory.ended_jobs.add(job_id)
    if memory.state is not None:
        memory.state.profiling.served.pop(job_id, None)
        memory.state.profiling.packed_served.pop(job_id, None)
    ended = memory.ended_at_s
    ended.pop(job_id, None)  # (a refused id submitted again and ended again: its latest end)
    ended[job_id] = now_s
    event: Message
    if outcome in ("refused", "rejected"):
        obs.rejected[job_id] = reason
        memory.intake.known.pop(job_id, None)  # nothing of it was accepted: the id is free again
        event, message_id = JobRejected(job_id, reason), rejection_id(job_id, reason)
    elif outcome == "completed":
        assert job is not None and job.last_finish_s is not None
        event = JobCompleted(job_id, job.last_finish_s, job.last_finish_s - job.arrival_s, job.steps_done)
    elif outcome == "failed":
        obs.failed[job_id] = reason
        event = JobFailed(job_id, reason, now_s)
    elif isinstance(job, JobState):  # cancelled after admission, at a boundary
        obs.cancelled[job_id] = status_core.cancelled_row(job, reason, now_s)
        event = JobCancelled(job_id, reason, now_s, job.steps_done)
    else:  # cancelled before admission, at once
        if job is not None:
            obs.cancelled[job_id] = {**status_core.pending_row(job, "cancelled", reason), "cancelled_at_s": now_s}  # type: ignore[arg-type]
        event = JobCancelled(job_id, reason, now_s, 0)
    if outcome not in ("refused", "rejected"):
        message_id = f"job-end:{job_id}"
    return Ending(job_id, outcome, reason, now_s, job if isinstance(job, JobState) else None, event, message_id)


def _leave_state(memory: Memory, job_id: str, outcome: Outcome) -> object:
    """The job's record, taken out of where it was: the state's active jobs (failed: among the
    completed, dropped; otherwise withdrawn), or the submissions waiting (a cancel before
    admission; a submission refused or rejected was never kept)."""
    state = memory.state
    index = state.jobs.index_of.get(job_id) if state is not None else None
    if state is not None and index is not None:
        if outcome == "failed":
            return remove_job(state, index, dropped=True)
        return withdraw_job(state, index)
    if outcome != "cancelled":
        return None
    waiting = [j for j in memory.submitted if j.job_id == job_id] + [
        j for j, _ in [*memory.held, *memory.queued] if j.job_id == job_id
    ]
    memory.submitted = [j for j in memory.submitted if j.job_id != job_id]
    memory.held = [(j, why) for j, why in memory.held if j.job_id != job_id]
    memory.queued = [(j, why) for j, why in memory.queued if j.job_id != job_id]
    return waiting[0] if waiting else None


def settled_end(job: JobState) -> tuple[Outcome, str]:
    """How a job the settle retired ended: its steps all done, or dropped as a gang short of
    steps too many times."""
    if job.steps_remaining <= 0 and job.last_finish_s is not None:
        return "completed", ""
    return "failed", GANG_FAILED


def rejection_id(job_id: str, reason: str) -> str:
    """JobRejected's message id, derived from what it says: the same refusal published again (a
    redelivered submission) is recognisably the same, a different one for the same id is not."""
    digest = hashlib.blake2b(reason.encode(), digest_size=6).hexdigest()
    return f"job-rejected:{job_id}:{digest}"
