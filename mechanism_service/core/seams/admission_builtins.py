"""The built-in admission policies (the seam: core/seams/admission.py; docs/mechanism.md, "Seams").

    accept_all   every feasible job joins at once (the default; the mechanism skips the call)
    load         Blox's load-based admission (EuroSys 2024, figures 12-13): jobs join in arrival
                 order while the scheduled jobs' GPU demand stays within ``max_load`` x the
                 cluster's GPUs (and their count within ``max_jobs``); the rest wait
    quota        per-entity quotas of work in flight, in normalised compute (V100-hours): an
                 entity's scheduled jobs hold at most its quota of work, whatever types run it

Each is built from ``--admission-param`` strings and refuses a parameter it does not know.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from mechanism_service.core.seams.admission import (
    AdmissionDecision,
    AdmissionView,
    EntityUsage,
    WaitingJob,
)


def _number(name: str, text: str, *, low: float = 0.0, allow_inf: bool = True) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r}: not a number") from None
    if math.isnan(value) or value <= low or (not allow_inf and math.isinf(value)):
        raise ValueError(f"{name}={text!r}: must be a number above {low:g}")
    return value


def _no_more(params: Mapping[str, str], policy: str) -> None:
    if params:
        raise TypeError(f"{policy}: unknown parameter{'s' if len(params) > 1 else ''} {', '.join(sorted(params))}")


class AcceptAll:
    """Every feasible job joins the scheduled set at once (today's behaviour)."""

    def __init__(self, **params: str) -> None:
        _no_more(params, "accept_all")

    def admit(self, view: AdmissionView) -> AdmissionDecision:
        return AdmissionDecision(tuple(j.job_id for j in view.waiting))


class LoadAdmission:
    """Blox's load-based admission. Jobs join in arrival order, the first that does not fit
    stopping the rest (so a large gang is not starved by small ones behind it), while

        scheduled GPUs + the job's GPUs <= max_load x cluster GPUs   and   scheduled jobs < max_jobs

    where "scheduled" is every admitted job not ended (running or queued for the scheduler).
    When nothing is scheduled the first waiting job joins whatever its size, so a gang larger
    than the bound does not wait for ever. Blox tests its bound before adding the job (it may
    overshoot by one job); this bound holds with the job in.

    Parameters: ``max_load`` (GPU demand per GPU of the cluster; default 1.0: no more demand
    than GPUs), ``max_jobs`` (default: no bound)."""

    def __init__(self, **params: str) -> None:
        self.max_load = _number("max_load", params.pop("max_load", "1.0"))
        self.max_jobs = _number("max_jobs", params.pop("max_jobs", "inf"))
        _no_more(params, "load")

    def admit(self, view: AdmissionView) -> AdmissionDecision:
        bound_gpus = self.max_load * view.cluster_gpus
        demand, jobs = view.scheduled_gpus, view.scheduled_jobs
        admitted: list[str] = []
        for job in view.waiting:
            empty = jobs == 0
            if not empty and (demand + job.gpus > bound_gpus + 1e-9 or jobs + 1 > self.max_jobs):
                break
            admitted.append(job.job_id)
            demand += job.gpus
            jobs += 1
        load = demand / view.cluster_gpus if view.cluster_gpus else math.inf
        jobs_text = "" if math.isinf(self.max_jobs) else f", at most {self.max_jobs:g} jobs ({jobs} scheduled)"
        reason = (
            f"load-based admission: the scheduled jobs demand {demand} GPUs of {view.cluster_gpus} "
            f"(load {load:.2f}); jobs join in arrival order while the load with them stays at most "
            f"{self.max_load:g}{jobs_text}"
        )
        return AdmissionDecision(tuple(admitted), reason=reason)


class QuotaAdmission:
    """Per-entity quotas of work in flight, in normalised compute. An entity's jobs join in
    arrival order while

        charge + the job's work <= quota

    where, in ``unit=v100`` (the default), the charge is the work of the entity's scheduled
    jobs in V100-hours (done and left: the same wherever they run, so a quota means the same
    work on any mix of types) and a job's work is its steps x GPUs / its steps/s on a v100; in
    ``unit=gpu`` (device counts, for comparison) the charge is the device-hours its scheduled
    jobs held plus what they have left at their fastest type, so an entity whose jobs run on
    slow types is charged more for the same work. The first of an entity's jobs that does not
    fit stops that entity's others (not other entities'); an entity with nothing scheduled
    admits its first job whatever its size. Jobs without an entity count under "".

    Parameters: ``hours`` (every entity's quota; default: no bound), ``entities`` (per-entity
    quotas overriding it, ``a:20,b:7.5``), at least one of the two; ``unit`` (``v100`` or ``gpu``)."""

    def __init__(self, **params: str) -> None:
        self.hours = _number("hours", params.pop("hours", "inf"))
        self.unit = params.pop("unit", "v100")
        if self.unit not in ("v100", "gpu"):
            raise ValueError(f"unit={self.unit!r}: v100 or gpu")
        self.entity_hours: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in params.pop("entities", "").split(","))):
            name, sep, value = part.rpartition(":")
            if not sep or not name:
                raise ValueError(f"entities={part!r}: give ENTITY:HOURS, comma-separated")
            if name in self.entity_hours:
                raise ValueError(f"entities: {name!r} given twice")
            self.entity_hours[name] = _number(f"entities[{name}]", value)
        _no_more(params, "quota")
        if math.isinf(self.hours) and not self.entity_hours:
            raise ValueError("quota: give hours=H (every entity's quota) or entities=a:H1,b:H2: without either no job ever waits")

    def quota_hours(self, entity: str) -> float:
        return self.entity_hours.get(entity, self.hours)

    def _charge_s(self, usage: EntityUsage) -> float:
        if self.unit == "v100":
            return usage.used_v100_s + usage.committed_v100_s
        return usage.used_gpu_s + usage.committed_gpu_s

    def _work_s(self, job: WaitingJob) -> float:
        return job.work_v100_s if self.unit == "v100" else job.work_gpu_s

    def admit(self, view: AdmissionView) -> AdmissionDecision:
        usage = view.usage()
        charge_s = {entity: self._charge_s(u) for entity, u in usage.items()}
        jobs = {entity: u.jobs for entity, u in usage.items()}
        stopped: set[str] = set()
        admitted: list[str] = []
        reasons: dict[str, str] = {}
        unit = "V100-hours" if self.unit == "v100" else "GPU-hours"
        for job in view.waiting:
            entity = job.entity or ""
            charge, work, quota_s = charge_s.get(entity, 0.0), self._work_s(job), self.quota_hours(entity) * 3600.0
            if entity not in stopped and (jobs.get(entity, 0) == 0 or charge + work <= quota_s * (1 + 1e-9)):
                admitted.append(job.job_id)
                charge_s[entity] = charge + work
                jobs[entity] = jobs.get(entity, 0) + 1
                continue
            stopped.add(entity)
            reasons[job.job_id] = (
                f"quota: entity {entity!r} has {charge / 3600:.3g} {unit} of work scheduled; with this job's "
                f"{work / 3600:.3g} it would pass its quota of {quota_s / 3600:.3g}"
            )
        return AdmissionDecision(tuple(admitted), reasons=reasons)


ADMISSION_BUILTINS = {"accept_all": AcceptAll, "load": LoadAdmission, "quota": QuotaAdmission}
DEFAULT_ADMISSION = "accept_all"
