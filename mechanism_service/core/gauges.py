"""The mechanism's state as plain numbers, for the metrics read at scrape time (docs/metrics.md):
jobs per state and per pending reason, GPUs per type busy / idle / lost, the GPUs the allocation
gives out, its age, workers per state, stragglers' speed. Pure: the memory in, numbers out.

Read only when scraped (every 15 s or so), never per round, so they cost the round loop nothing;
each is one pass over the active jobs or the workers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mechanism_service.core import why

if TYPE_CHECKING:
    from mechanism_service.core.memory import Memory

# Every state a job can be in, as `gavel jobs` says it (core/status.py): each is exported, 0 when
# none is in it, so a dashboard's series do not come and go.
JOB_STATES = (
    "submitted", "held", "admission", "queued", "running", "retrying", "cancelling", "completed", "failed", "cancelled", "rejected",
)
WORKER_STATES = ("up", "lost", "refused")
GPU_STATES = ("busy", "idle", "lost")


@dataclass(frozen=True, slots=True)
class Gauges:
    jobs: dict[str, int]  # state -> jobs (finished ones until the retention rule forgets them)
    pending: dict[str, int]  # reason code (core/why.py) -> jobs not running
    gpus: dict[tuple[str, str], int]  # (accelerator type, busy|idle|lost) -> GPUs
    allocated_gpus: dict[str, float]  # type -> GPUs the allocation in force gives out
    allocation_age_s: float | None  # mechanism seconds since the allocation in force was solved
    degraded: bool  # the allocation is kept because the policy does not answer
    workers: dict[str, int]  # up|lost|refused -> workers
    speed_ratio: dict[str, float] = field(default_factory=dict)  # flagged worker -> measured / expected


def read(memory: Memory, now_s: float) -> Gauges:
    obs = memory.observations
    state = memory.state
    jobs = dict.fromkeys(JOB_STATES, 0)
    jobs["submitted"] = len(memory.submitted)
    jobs["held"] = len(memory.held)
    jobs["admission"] = len(memory.queued)  # in the admission queue (core/seams/admission.py)
    jobs["rejected"] = len(obs.rejected)
    jobs["cancelled"] = len(obs.cancelled)
    allocated: dict[str, float] = {}
    busy: dict[str, int] = {}
    codes = why.reason_codes(memory)  # once: the states below and the pending reasons read it
    if state is not None:
        for job in state.completed:
            jobs["completed" if job.steps_remaining <= 0 else "failed"] += 1
        for job in state.jobs.values():
            code = codes.get(job.job_id)
            if code == why.CANCELLING:
                jobs["cancelling"] += 1
            elif code == why.RETRYING:
                jobs["retrying"] += 1
            elif code in (why.RUNNING, why.PROFILING):
                jobs["running"] += 1
            else:
                jobs["queued"] += 1
        for placement in state.previous_assignment.values():
            busy[placement.accelerator_type] = busy.get(placement.accelerator_type, 0) + len(placement.worker_ids)
        for entry, fractions in state.allocation.items():
            gang = max((state.jobs[i].scale_factor for i in entry if i in state.jobs), default=0)  # a pair shares its GPUs
            for w, f in fractions.items():
                allocated[w] = allocated.get(w, 0.0) + f * gang
    gpus: dict[tuple[str, str], int] = {}
    for w, servers in memory.servers.items():
        capacity = sum(g for _, g in servers)
        gpus[(w, "busy")] = busy.get(w, 0)
        gpus[(w, "idle")] = max(capacity - busy.get(w, 0), 0)
        gpus.setdefault((w, "lost"), 0)
    for info in memory.lost_workers.values():
        key = (str(info.get("accelerator_type", "")), "lost")
        gpus[key] = gpus.get(key, 0) + int(info.get("gpus", 0) or 0)  # type: ignore[call-overload]
    solved_at_s = obs.allocation_solved_at_s
    return Gauges(
        jobs=jobs,
        pending=why.pending_counts(memory, codes),
        gpus=gpus,
        allocated_gpus=allocated,
        allocation_age_s=None if solved_at_s is None else max(now_s - solved_at_s, 0.0),
        degraded=obs.degraded_since_s is not None,
        workers={
            "up": sum(len(servers) for servers in memory.servers.values()),
            "lost": len(memory.lost_workers),
            "refused": len(memory.refused_workers),
        },
        speed_ratio={worker_id: flag.ratio for worker_id, flag in memory.book.stragglers.items()},
    )
