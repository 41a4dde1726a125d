"""One job of a trace, as every trace format describes it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from common.errors import TraceError
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

    def __post_init__(self) -> None:
        problem = _problem(self)
        if problem is not None:
            field, reason = problem
            raise TraceError(reason, column=field)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _problem(job: TraceJob) -> tuple[str, str] | None:
    """(field, reason) for the first invalid field, or None."""
    for name in ("job_id", "job_type", "command", "working_directory", "num_steps_arg"):
        if not isinstance(getattr(job, name), str):
            return name, f"expected a string, got {type(getattr(job, name)).__name__}"
    if not job.job_id:
        return "job_id", "must not be empty"
    if not job.job_type.strip():
        return "job_type", "must not be empty"
    if not _is_int(job.total_steps) or job.total_steps < 1:
        return "total_steps", f"expected an integer >= 1, got {job.total_steps!r}"
    if not _is_int(job.scale_factor) or job.scale_factor < 1:
        return "scale_factor", f"expected an integer >= 1, got {job.scale_factor!r}"
    if not _is_number(job.arrival_time_s) or job.arrival_time_s < 0:
        return "arrival_time_s", f"expected a finite number of seconds >= 0, got {job.arrival_time_s!r}"
    if not _is_number(job.priority_weight) or job.priority_weight <= 0:
        return "priority_weight", f"expected a finite number > 0, got {job.priority_weight!r}"
    if job.slo_s is not None and (not _is_number(job.slo_s) or job.slo_s <= 0):
        return "slo_s", f"expected a finite number of seconds > 0 (or none), got {job.slo_s!r}"
    if not isinstance(job.needs_data_dir, bool):
        return "needs_data_dir", f"expected a boolean, got {job.needs_data_dir!r}"
    return None


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
    )
