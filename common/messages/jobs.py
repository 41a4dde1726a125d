"""Job lifecycle messages: submission, refusal, completion, failure, and progress reports."""

from __future__ import annotations

from collections.abc import Mapping

from common.messages.base import Message, message, value


@value
class JobSpec:
    """What a user asks to run. Ids are assigned at submission, so duplicates can be absorbed."""

    job_id: str
    job_type: str  # a job template, e.g. "ResNet-50 (batch size 64)"
    total_steps: int
    scale_factor: int = 1  # GPUs of one accelerator type the job needs at once (a gang)
    priority_weight: float = 1.0
    slo_s: float | None = None  # finish within this many seconds of arrival, if set
    entity: str | None = None  # owner for hierarchical policies (team, user)
    command: str = ""  # what a real worker runs ("": the catalog's workload for job_type)
    # Arrival time on the trace's clock: a mechanism replaying in lockstep takes the job in at this
    # time. A live mechanism stamps arrivals with its own clock instead (see JobSubmitted).
    submit_time_s: float = 0.0
    working_dir: str = ""  # where the command runs, on the worker ("": the worker's --work-dir)
    # The user's own estimate of the gang's steps/s alone, per accelerator type (gavel submit
    # --throughput): a prior that the estimator's measurements correct. None: no estimate.
    throughput_estimate_steps_per_s: Mapping[str, float] | None = None


@message("job.submitted")
class JobSubmitted(Message):
    """A job for the mechanism. On a live cluster it arrives ``arrival_offset_s`` after the moment
    the mechanism received the first submission of its batch (a trace keeps its spacing, counted
    from when it reached the cluster); a job with no batch arrives ``arrival_offset_s`` after it
    was received. Times are the mechanism's (scaled with ``--time-scale``)."""

    spec: JobSpec
    batch_id: str = ""  # the submission this job came with (one `gavel submit`)
    arrival_offset_s: float = 0.0
    # Who submits it (mechanism_service/core/ownership.py): the operating-system user the client
    # runs as, as it says, and the broker user it publishes as, which the mechanism checks against
    # the broker's validated user-id (a claim the broker did not validate is refused).
    submitted_by: str = ""
    broker_user: str = ""


@message("job.submissions.sealed")
class SubmissionsSealed(Message):
    """Everything a client meant to submit in one batch (a trace) has been published before this,
    on the same queue: a mechanism replaying a trace in lockstep may start its clock. With
    ``reply_to``, the mechanism answers on ``status.reply.<reply_to>`` (StatusReported) with what
    became of the batch: new, already known, refused (and why)."""

    batch_id: str
    count: int
    reply_to: str = ""
    request_id: str = ""
    # Jobs of the batch the broker refused (the submissions queue was full): the mechanism never
    # got them, and says so (JobRejected) to the others that did, such as the estimator
    not_accepted: tuple[str, ...] = ()


@message("job.cancel")
class CancelJob(Message):
    """Stop a job for good: it ends in the terminal state ``cancelled`` (JobCancelled). Sent on the
    submissions' queue, so a cancel follows the submission it names. With ``reply_to`` the
    mechanism answers on ``status.reply.<reply_to>``."""

    job_id: str
    reason: str = "cancelled by the user"
    reply_to: str = ""
    request_id: str = ""
    requested_by: str = ""  # who asks, as JobSubmitted.submitted_by and .broker_user say who submits
    broker_user: str = ""


@message("job.cancelled")
class JobCancelled(Message):
    """An accepted job that was cancelled (``gavel cancel``); its steps so far are kept."""

    job_id: str
    reason: str
    cancelled_at_s: float
    steps_done: int = 0


@message("job.rejected")
class JobRejected(Message):
    """A submission the mechanism refused; nothing of it was accepted."""

    job_id: str
    reason: str


@message("job.completed")
class JobCompleted(Message):
    job_id: str
    completion_time_s: float
    jct_s: float  # completion time minus arrival time
    steps_done: int


@message("job.failed")
class JobFailed(Message):
    """An accepted job that ended without finishing its steps."""

    job_id: str
    reason: str
    failure_time_s: float = 0.0


@message("job.progress")
class JobProgress(Message):
    """A worker's report of a job's work under one lease (idempotent per lease id and job)."""

    job_id: str
    worker_id: str
    lease_id: str
    round_id: int
    steps_done: int  # steps done under this lease so far (cumulative within the lease)
    elapsed_s: float  # time run under this lease so far
    throughput_steps_per_s: float  # steps / stepping_s: restore, start-up and checkpoints excluded
    finished: bool = False  # the job has done all its steps
    # A real worker's breakdown of elapsed_s (0 from simulated fleets): starting the process
    # (interpreter, imports, model build), loading the checkpoint, stepping, saving the checkpoint.
    startup_s: float = 0.0
    restore_s: float = 0.0
    stepping_s: float = 0.0
    checkpoint_s: float = 0.0
    # How the lease ended for this job: "" or "lease_end" (ran its time), "finished", "killed",
    # "crashed" (the process failed: exit_code and error say how; its steps since the last
    # checkpoint are lost, so steps_done counts only what was checkpointed).
    outcome: str = ""
    exit_code: int | None = None
    error: str = ""  # the tail of the process's stderr when it crashed
    # What the estimator needs to learn from the report: the type it ran on and the jobs it shared
    # its GPUs with ("" and (): an older worker; the estimator then cannot use the report).
    accelerator_type: str = ""
    packed_with: tuple[str, ...] = ()
