"""core/endings.end_job: every way a job leaves, in one place (issue 24), and core/cancel.py's
cancel, which ends a job that has not arrived at once and an admitted one at the next boundary."""

from __future__ import annotations

import pytest

from common.messages import JobCancelled, JobCompleted, JobFailed, JobRejected
from mechanism_service.core import cancel as cancel_core
from mechanism_service.core.endings import Ending, end_job, rejection_id, settled_end
from mechanism_service.core.memory import Memory
from mechanism_service.core.reducers import NewJob, remove_job
from tests.unit.mechanism.builders import state


def memory_with_jobs() -> Memory:
    """j0, j1 admitted (j1 has run), w waiting for its arrival, h held; each with a command, an
    estimate and a profiling run owed."""
    s = state(k80=2).jobs(2).build()
    s.jobs[1].first_run_s = 5.0
    memory = Memory(state=s)
    memory.submitted = [NewJob("w", "a", 1, 100, 50.0)]
    memory.held = [(NewJob("h", "a", 4, 100, 0.0), "needs 4 GPUs")]
    for job_id in ("j0", "j1", "w", "h"):
        memory.launch[job_id] = ("python train.py", "")
        memory.user_estimates[job_id] = {"k80": 2.0}
        memory.intake.known[job_id] = None
        s.profiling.served[job_id] = {("k80", "")}
        s.profiling.packed_served[job_id] = 1
    return memory


def forgotten_everywhere(memory: Memory, job_id: str) -> None:
    """What goes with a job whichever way it leaves."""
    assert job_id not in memory.launch and job_id not in memory.user_estimates
    assert job_id in memory.ended_jobs
    assert memory.state is not None
    assert job_id not in memory.state.profiling.served and job_id not in memory.state.profiling.packed_served
    assert list(memory.ended_at_s)[-1] == job_id


def test_a_job_rejected_at_admission_frees_its_id_and_says_why_under_an_id_derived_from_it() -> None:
    memory = memory_with_jobs()
    memory.submitted = []  # taken out as due, then refused
    ending = end_job(memory, "w", "rejected", "runs on nothing here", 7.0)
    assert ending == Ending("w", "rejected", "runs on nothing here", 7.0, None, JobRejected("w", "runs on nothing here"),
                            rejection_id("w", "runs on nothing here"))
    forgotten_everywhere(memory, "w")
    assert memory.observations.rejected == {"w": "runs on nothing here"} and "w" not in memory.intake.known
    assert ending.record(3).outcome == "rejected" and ending.record(3).epoch == 3


def test_a_job_that_never_ran_set_aside_is_withdrawn_and_one_that_ran_fails() -> None:
    memory = memory_with_jobs()
    assert memory.state is not None
    rejected = end_job(memory, "j0", "rejected", "the policy cannot allocate with this job", 9.0)
    failed = end_job(memory, "j1", "failed", "the policy cannot allocate with this job", 9.0)
    assert rejected.job is not None and rejected.job.job_id == "j0"  # withdrawn: its record, among nothing
    assert failed.job is memory.state.completed[-1]
    assert failed.event == JobFailed("j1", "the policy cannot allocate with this job", 9.0)
    assert failed.message_id == "job-end:j1"
    assert dict(memory.state.jobs) == {} and [j.job_id for j in memory.state.completed] == ["j1"]
    assert memory.state.completed[0].last_finish_s is None  # dropped: no completion time
    assert len(memory.state.entries) == 0
    assert memory.observations.failed == {"j1": "the policy cannot allocate with this job"}
    assert list(memory.ended_at_s) == ["j0", "j1"]


def test_a_settled_job_ends_completed_or_failed_as_a_short_gang() -> None:
    memory = memory_with_jobs()
    s = memory.state
    assert s is not None
    done = remove_job(s, 0)
    done.steps_done, done.last_finish_s = done.total_steps, 30.0
    assert settled_end(done) == ("completed", "")
    ending = end_job(memory, "j0", *settled_end(done), 31.0, settled=done)
    assert ending.event == JobCompleted("j0", 30.0, 30.0, 1000)
    forgotten_everywhere(memory, "j0")
    dropped = remove_job(s, 1, dropped=True)
    assert settled_end(dropped) == ("failed", "a gang got fewer steps than GPUs too many times")
    end_job(memory, "j1", *settled_end(dropped), 31.0, settled=dropped)
    assert memory.observations.failed == {"j1": "a gang got fewer steps than GPUs too many times"}
    assert [j.job_id for j in s.completed] == ["j0", "j1"]  # settled once, not added again


def test_a_refused_submission_ends_without_having_been_kept() -> None:
    memory = Memory()
    memory.ended_at_s["x"] = 1.0  # refused before: its latest end is the one kept
    memory.ended_at_s["y"] = 2.0
    ending = end_job(memory, "x", "refused", "total_steps: must be >= 1, got 0", 3.0)
    assert ending.event == JobRejected("x", "total_steps: must be >= 1, got 0")
    assert memory.ended_at_s == {"y": 2.0, "x": 3.0} and list(memory.ended_at_s) == ["y", "x"]
    assert memory.observations.rejected == {"x": "total_steps: must be >= 1, got 0"}


def test_a_cancel_before_arrival_ends_the_job_at_once_and_again_answers_the_same() -> None:
    memory = memory_with_jobs()
    done = cancel_core.cancel(memory, "h", "no longer needed", 12.0)
    assert done.changed and not done.cancelling and done.ending is not None
    assert done.event == JobCancelled("h", "no longer needed", 12.0, 0)
    assert memory.held == [] and [j.job_id for j in memory.submitted] == ["w"]
    assert memory.observations.cancelled["h"]["cancelled_at_s"] == 12.0
    forgotten_everywhere(memory, "h")
    again = cancel_core.cancel(memory, "h", "twice", 13.0)
    assert (again.changed, again.ending, again.event) == (False, None, done.event)  # published again: deduplicated


def test_an_admitted_job_cancelled_leaves_at_the_next_boundary_with_its_steps() -> None:
    memory = memory_with_jobs()
    assert memory.state is not None
    memory.state.jobs[1].steps_done = 40
    done = cancel_core.cancel(memory, "j1", "stop", 12.0)
    assert (done.changed, done.cancelling, done.ending, done.event) == (True, True, None, None)
    assert not cancel_core.cancel(memory, "j1", "stop", 13.0).changed
    assert cancel_core.leaving(memory) == [("j1", "stop")] and memory.cancelling == {}
    ending = end_job(memory, "j1", "cancelled", "stop", 20.0)
    assert ending.event == JobCancelled("j1", "stop", 20.0, 40)
    assert memory.observations.cancelled["j1"]["steps_done"] == 40
    assert list(memory.state.jobs.index_of) == ["j0"] and memory.state.completed == []


@pytest.mark.parametrize(
    ("job_id", "answer"),
    [("nobody", {"error": "no job 'nobody'"}), ("r", {"error": "job 'r' was rejected (why): nothing to cancel"})],
)
def test_a_cancel_of_nothing_changes_nothing(job_id: str, answer: dict[str, object]) -> None:
    memory = memory_with_jobs()
    memory.observations.rejected["r"] = "why"
    assert cancel_core.cancel(memory, job_id, "stop", 1.0) == cancel_core.Cancelled(False, answer)
