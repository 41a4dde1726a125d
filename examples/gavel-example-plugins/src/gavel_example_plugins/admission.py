"""An admission plug-in: at most ``max_jobs`` scheduled jobs per entity (team, account).

A team that submits a hundred jobs at once would otherwise fill the scheduler's queue, and a
fair-share policy would still give each of its jobs a share; here each entity has at most
``max_jobs`` jobs admitted and not ended, and the rest of its jobs wait in the admission queue
in arrival order (``gavel job ID --why`` says why). Jobs submitted without an entity count as
one entity of their own (the seam's usage names it ""), so a trace without entities runs at
most ``max_jobs`` jobs at a time.
"""

from __future__ import annotations

from mechanism_service.core.seams.admission import AdmissionDecision, AdmissionView


class PerEntityJobs:
    """Jobs join in arrival order while their entity has fewer than ``max_jobs`` scheduled."""

    def __init__(self, max_jobs: str = "2", **params: str) -> None:
        if params:
            raise TypeError(f"per_entity_jobs: unknown parameters {', '.join(sorted(params))} (it takes max_jobs)")
        if not max_jobs.isdigit() or int(max_jobs) < 1:
            raise ValueError(f"per_entity_jobs: max_jobs={max_jobs!r} is not a whole number >= 1")
        self.max_jobs = int(max_jobs)

    def admit(self, view: AdmissionView) -> AdmissionDecision:
        usage = view.usage()
        scheduled = {entity: used.jobs for entity, used in usage.items()}
        admitted, reasons = [], {}
        for job in view.waiting:  # arrival order
            entity = job.entity or ""  # no entity: one anonymous entity, as the usage counts it
            count = scheduled.get(entity, 0)
            if count < self.max_jobs:
                admitted.append(job.job_id)
                scheduled[entity] = count + 1
            else:
                who = f"entity {entity}" if entity else "jobs without an entity"
                reasons[job.job_id] = f"{who}: {count} scheduled, at most {self.max_jobs}"
        return AdmissionDecision(tuple(admitted), reasons=reasons)
