"""One job of a trace, as every trace format describes it."""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import JobFieldError, TraceError
from common.job_checks import check_job
from common.messages import JobSpec


@dataclass(frozen=True, slots=True)
class TraceJob:
    """A job as a trace gives it. Validated on construction: a TraceJob is always usable.

    ``slo_s``: the job should finish within this many seconds of its arrival (None: no SLO).
    ``command`` may hold ``%s`` placeholders for the run (and data) directory; traces keep them.
    A TraceError raised here names the offending field in ``column``; the readers translate it
    into the file's column.
    """

    job_id: str
    job_type: str
    total_steps: int
    scale_factor: int
    arrival_time_s: float
    priority_weight: float = 1.0
    slo_s: float | None = None
    command: str = ""
    working_directory: str = ""
    num_steps_arg: str = ""
    needs_data_dir: bool = False
    entity: str | None = None  # the team or account it is charged to (an admission quota's entity)

    def __post_init__(self) -> None:
        problem = _problem(self)
        if problem is not None:
            field, reason = problem
            raise TraceError(reason, column=field)


def _problem(job: TraceJob) -> tuple[str, str] | None:
    """(field, reason) for the first invalid field, or None. A job's own fields are checked as
    everywhere else (common/job_checks.py: `gavel submit`, the mechanism, the policy); the rest
    only a trace has."""
    for name in ("working_directory", "num_steps_arg"):
        if not isinstance(getattr(job, name), str):
            return name, f"expected a string, got {type(getattr(job, name)).__name__}"
    try:
        check_job(
            job_id=job.job_id, job_type=job.job_type, scale_factor=job.scale_factor,
            priority_weight=job.priority_weight, slo_s=job.slo_s, total_steps=job.total_steps,
            command=job.command, arrival_s=job.arrival_time_s, entity=job.entity,
        )
    except JobFieldError as e:
        return _TRACE_FIELD.get(e.field, e.field), e.reason
    if not isinstance(job.needs_data_dir, bool):
        return "needs_data_dir", f"expected a boolean, got {job.needs_data_dir!r}"
    return None


_TRACE_FIELD = {"arrival_s": "arrival_time_s"}  # check_job's name -> this class's


def to_job_spec(job: TraceJob) -> JobSpec:
    """What a trace replay submits for this job (JobSubmitted carries it)."""
    return JobSpec(
        job_id=job.job_id,
        job_type=job.job_type,
        total_steps=job.total_steps,
        scale_factor=job.scale_factor,
        priority_weight=float(job.priority_weight),
        slo_s=None if job.slo_s is None else float(job.slo_s),
        command=job.command,
        submit_time_s=float(job.arrival_time_s),
        entity=job.entity,
    )
