"""The mechanism's side of the admission seam (core/seams/admission.py): the view built from the
state, the policy's answer checked. Pure: a policy that raises or answers wrong admits every
waiting job for this boundary (accept_all) and returns an error text the shell logs."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence

from common.plugins import PLUGIN_FAULTS
from mechanism_service.core.admission import NewJob
from mechanism_service.core.model import MechanismState
from mechanism_service.core.rates import JobRef, Rates
from mechanism_service.core.seams.admission import (
    REFERENCE_TYPE,
    AdmissionDecision,
    AdmissionPolicy,
    AdmissionView,
    EntityUsage,
    WaitingJob,
)


def speeds(job: JobRef, rates: Rates, types: Sequence[str]) -> tuple[float, float]:
    """(steps/s alone on the reference type, on its fastest type) of a job's gang; the
    reference is its fastest type's speed when it has none on a v100 (0, 0: no speed known)."""
    fastest = max((rates.isolated(job, w) for w in types), default=0.0)
    reference = rates.isolated(job, REFERENCE_TYPE)
    return (reference if reference > 0 else fastest), fastest


def _seconds(steps: int, gpus: int, steps_per_s: float) -> float:
    return steps * gpus / steps_per_s if steps_per_s > 0 else math.inf


def waiting_job(job: NewJob, rates: Rates, types: Sequence[str]) -> WaitingJob:
    reference, fastest = speeds(job, rates, types)
    return WaitingJob(
        job.job_id, job.entity, job.job_type, job.scale_factor, job.arrival_s, job.total_steps,
        _seconds(job.total_steps, job.scale_factor, reference), _seconds(job.total_steps, job.scale_factor, fastest),
    )


def entity_usage(state: MechanismState, rates: Rates) -> dict[str, EntityUsage]:
    """Entity -> what its scheduled jobs hold (core/seams/admission.py, EntityUsage)."""
    types = tuple(state.gpus)
    totals: dict[str, list[float]] = {}
    for job in state.jobs.values():
        reference, fastest = speeds(job, rates, types)
        left = max(0, job.total_steps - job.steps_done)
        row = totals.setdefault(job.entity or "", [0, 0, 0.0, 0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += job.scale_factor
        row[2] += _seconds(job.steps_done, job.scale_factor, reference) if job.steps_done else 0.0
        row[3] += sum(job.gpu_seconds_by_type.values())
        row[4] += _seconds(left, job.scale_factor, reference) if left else 0.0
        row[5] += _seconds(left, job.scale_factor, fastest) if left else 0.0
    return {e: EntityUsage(int(r[0]), int(r[1]), r[2], r[3], r[4], r[5]) for e, r in totals.items()}


def view_of(state: MechanismState, waiting: Sequence[NewJob], rates: Rates, now_s: float) -> AdmissionView:
    types = tuple(state.gpus)
    running = sum(len(entry) for entry in state.previous_assignment)
    return AdmissionView(
        now_s=now_s,
        waiting=tuple(waiting_job(job, rates, types) for job in waiting),
        gpus_by_type=dict(state.gpus),
        scheduled_jobs=len(state.jobs),
        scheduled_gpus=sum(job.scale_factor for job in state.jobs.values()),
        running_jobs=running,
        usage_of=functools.cache(lambda: entity_usage(state, rates)),
    )


def decide(policy: AdmissionPolicy, view: AdmissionView) -> tuple[AdmissionDecision, str]:
    """(the decision, "" or why the policy's answer was not used: then every job is admitted)."""
    try:
        decision = policy.admit(view)
        if isinstance(decision, AdmissionDecision) and not isinstance(decision.admit, tuple):
            with contextlib.suppress(TypeError):  # read once: a generator would pass the check and admit nothing
                decision = dataclasses.replace(decision, admit=tuple(decision.admit))
        problem = answer_problem(view, decision)
    except PLUGIN_FAULTS as error:  # a plug-in may raise anything: the boundary goes on (sys.exit too)
        problem = f"raised {type(error).__name__}: {error}"
    if problem:
        return AdmissionDecision(tuple(j.job_id for j in view.waiting)), problem
    return decision, ""


def answer_problem(view: AdmissionView, decision: object) -> str:
    if not isinstance(decision, AdmissionDecision):
        return f"not an AdmissionDecision (a {type(decision).__name__})"
    waiting = {j.job_id for j in view.waiting}
    try:
        unknown = [job_id for job_id in decision.admit if job_id not in waiting]
    except TypeError:
        return "admit is not a sequence of job ids"
    if unknown:
        return f"admits {unknown[0]!r}, which is not waiting"
    if not isinstance(decision.reasons, Mapping):
        return "reasons is not a mapping"
    # (the reasons are kept with the queue and shown by gavel jobs: a status reply carries them)
    if not isinstance(decision.reason, str) or not all(isinstance(r, str) for r in decision.reasons.values()):
        return "a reason that is not a str"
    return ""
