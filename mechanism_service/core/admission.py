"""A job whose arrival has come: whether it can ever run here, and whether it can now (admit,
hold or refuse). Section numbers refer to docs/gavel-semantics.md."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from common.errors import JobFieldError
from common.job_checks import check_job
from mechanism_service.core.rates import Rates


@dataclass(frozen=True, slots=True)
class NewJob:
    job_id: str
    job_type: str
    scale_factor: int
    total_steps: int
    arrival_s: float
    priority_weight: float = 1.0
    slo_s: float | None = None
    entity: str | None = None


@dataclass(frozen=True, slots=True)
class Admission:
    """What becomes of a job whose arrival has come: it joins (``admit``), waits until the cluster
    can run it (``hold``: a live cluster that grows as workers join), or never will (``refuse``).
    ``reason`` says why for the last two."""

    verdict: Literal["admit", "hold", "refuse"]
    reason: str = ""


def submission_problem(job: NewJob, rates: Rates, types: Sequence[str]) -> str:
    """Why a job can never run on any of ``types`` ("" when it may): its fields, checked as the
    policy checks them (common/job_checks.py), then whether anything knows how fast it runs
    (a table knows its types; estimates have a prior for every job). With no types known yet (a
    replay before its fleet registered), only the fields."""
    return _field_problem(job) or _rates_problem(job, rates, types, _runs_on(job, rates, types))


def _field_problem(job: NewJob) -> str:
    try:
        check_job(
            job_id=job.job_id, job_type=job.job_type, scale_factor=job.scale_factor,
            priority_weight=job.priority_weight, slo_s=job.slo_s, entity=job.entity, total_steps=job.total_steps,
        )
    except JobFieldError as e:
        return str(e)
    return ""


def _runs_on(job: NewJob, rates: Rates, types: Sequence[str]) -> list[str]:
    """The types where the job is believed to run (a positive speed at its size)."""
    return [w for w in types if rates.isolated(job, w) > 0]


def _rates_problem(job: NewJob, rates: Rates, types: Sequence[str], runs_on: Sequence[str]) -> str:
    if not types or runs_on:
        return ""
    return rates.unknown(job, types) or f"{job.job_type!r} on {job.scale_factor} GPUs runs on no accelerator type here"


WAITS_FOR_WORKERS = "it waits for workers to join"  # a held job's reason ends so (status adds the refused workers)


def admission(
    gpus: Mapping[str, int], job: NewJob, rates: Rates, *, elastic_types: Sequence[str] = ()
) -> Admission:
    """Whether a job can run on the cluster as it is: a gang needs ``scale_factor`` GPUs of one
    type where it runs. A job that never could is refused at once instead of waiting forever
    (Gavel would hang on it). On a live cluster (``elastic_types``: every type the table knows,
    since workers of any of them may still join) a job that could run on some type, but not on
    the GPUs here now, is held: the policy never sees it (it would refuse the whole problem), and
    it is admitted at the first boundary after enough workers joined."""
    types = list(dict.fromkeys([*gpus, *elastic_types]))
    runs_on = _runs_on(job, rates, types)  # looked up once, for both questions below
    problem = _field_problem(job) or _rates_problem(job, rates, types, runs_on)
    if problem:
        return Admission("refuse", problem)
    if any(gpus.get(w, 0) >= job.scale_factor for w in runs_on):
        return Admission("admit")
    here = ", ".join(f"{w} {gpus[w]}" for w in runs_on if gpus.get(w, 0) > 0)
    gpus_text = "1 GPU" if job.scale_factor == 1 else f"{job.scale_factor} GPUs"
    reason = f"needs {gpus_text} of one accelerator type where {job.job_type!r} runs" + (
        f" (here: {here})" if here else ", and there is none here"
    )
    if elastic_types:
        return Admission("hold", f"{reason}: {WAITS_FOR_WORKERS}")
    return Admission("refuse", reason)
