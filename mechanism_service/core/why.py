"""Why a job waits, or runs where it does: a short reason code, as Slurm gives one (`squeue`'s
REASON), and its detail (`gavel job ID --why`, docs/jobs.md). Pure: read from the memory, the
allocation in force, the ledgers and this round's plan; nothing is changed.

The codes (docs/jobs.md lists them for users):

    BeginTime     submitted, its arrival is still ahead
    Held          admission holds it: the cluster as it is cannot run it (a gang larger than any
                  type has here), it waits for workers to join
    Admission     the cluster can run it, but the admission policy (--admission: load, quota, a
                  plug-in) keeps it in the admission queue for now; the detail says why
    NoAllocation  the allocation in force gives it no share: admitted since the last solve, or
                  the policy does not answer (degraded) and the old allocation is kept
    Priority      its share is on types whose GPUs jobs ahead of it hold this round (or the
                  policy gave it no share at its solve: FIFO's queue)
    Resources     a gang that does not fit in the GPUs its types have free this round (some are
                  free, fewer than it needs)
    Running       it runs this round
    Profiling     it runs this round to measure its speed for the estimator, whatever its share
    Retrying      its last attempt crashed; it is tried again next round
    Cancelling    a cancel came; it leaves at the next boundary
    Completed, Failed, Cancelled, Rejected   it has ended

Two entry points: ``reason_codes`` (every job not ended, cheap: called at every metrics scrape
for ``gavel_mechanism_jobs_pending{reason}``) and ``explain`` (one job, in full).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mechanism_service.core.model import Entry, JobState, MechanismState, Placement
from mechanism_service.core.planning.priority import UNSERVED_FACTOR

if TYPE_CHECKING:
    from mechanism_service.core.memory import Memory

BEGIN_TIME = "BeginTime"
HELD = "Held"
ADMISSION = "Admission"
NO_ALLOCATION = "NoAllocation"
PRIORITY = "Priority"
RESOURCES = "Resources"
RUNNING = "Running"
PROFILING = "Profiling"
RETRYING = "Retrying"
CANCELLING = "Cancelling"
COMPLETED = "Completed"
FAILED = "Failed"
CANCELLED = "Cancelled"
REJECTED = "Rejected"

ACTIVE_CODES = (BEGIN_TIME, HELD, ADMISSION, NO_ALLOCATION, PRIORITY, RESOURCES, RUNNING, PROFILING, RETRYING, CANCELLING)
ENDED_CODES = (COMPLETED, FAILED, CANCELLED, REJECTED)
HOLDERS_SHOWN = 5  # of the jobs holding the GPUs a waiting job wants, the first by priority


@dataclass(frozen=True, slots=True)
class Round:
    """What every job's code reads of this round, gathered once."""

    running_on: dict[int, tuple[Entry, Placement]]  # job index -> its entry and placement this round
    profiled: frozenset[Entry]  # entries run this round for the estimator
    shares: dict[int, dict[str, float]]  # job index -> type -> its share (positive only), summed over its entries
    allocated: frozenset[int]  # job indices the allocation in force names (a share or not)
    free_gpus: dict[str, int]  # type -> GPUs no lease holds this round


def gather(memory: Memory) -> Round:
    state = memory.state
    if state is None:
        return Round({}, frozenset(), {}, frozenset(), {})
    running_on = {i: (entry, placement) for entry, placement in state.previous_assignment.items() for i in entry}
    profiled = getattr(memory.running[1], "profiled", frozenset()) if memory.running is not None else frozenset()
    shares: dict[int, dict[str, float]] = {}
    allocated: set[int] = set()
    for entry, fractions in state.allocation.items():
        allocated.update(entry)
        for w, f in fractions.items():
            if f > 0.0:
                for i in entry:
                    of_job = shares.setdefault(i, {})
                    of_job[w] = of_job.get(w, 0.0) + f
    free = dict(state.gpus)
    for placement in state.previous_assignment.values():
        free[placement.accelerator_type] = free.get(placement.accelerator_type, 0) - len(placement.worker_ids)
    return Round(running_on, frozenset(profiled), shares, frozenset(allocated), free)


def _last_attempt_crashed(attempts: Mapping[str, object] | None) -> bool:
    kept = attempts.get("kept") if attempts else None
    last = kept[-1] if isinstance(kept, list) and kept else None
    return isinstance(last, dict) and str(last.get("ended", "")).startswith("crashed")


def _runs_on(state: MechanismState, index: int, w: str) -> bool:
    ledger = state.entries.get((index,))
    if ledger is None or w not in state.gpus:
        return False
    return ledger.throughputs[w][0] > 0.0


def active_code(memory: Memory, job: JobState, now: Round) -> str:
    """The code of an admitted job (in the state)."""
    if job.job_id in memory.cancelling:
        return CANCELLING
    running = now.running_on.get(job.index)
    if running is not None:
        if running[0] in now.profiled:
            return PROFILING
        if _last_attempt_crashed(memory.observations.attempts.get(job.job_id)):
            return RETRYING
        return RUNNING
    shares = now.shares.get(job.index)
    if not shares:
        # named by the allocation with no share: the policy saw it and gave it nothing (FIFO's
        # queue); not named: admitted since the solve, or the policy has not answered since
        return PRIORITY if job.index in now.allocated and memory.observations.degraded_since_s is None else NO_ALLOCATION
    if job.scale_factor > 1:
        free = [now.free_gpus.get(w, 0) for w in shares]
        if all(f < job.scale_factor for f in free) and any(f > 0 for f in free):
            return RESOURCES
    return PRIORITY


def reason_codes(memory: Memory) -> dict[str, str]:
    """Every job that has not ended, job id -> its reason code: the admitted ones, those whose
    arrival is ahead (BeginTime) and those admission holds (Held). One pass over the allocation
    and this round's leases, then a look-up a job."""
    codes = {job.job_id: BEGIN_TIME for job in memory.submitted}
    codes.update((job.job_id, HELD) for job, _ in memory.held)
    codes.update((job.job_id, ADMISSION) for job, _ in memory.queued)
    state = memory.state
    if state is not None:
        now = gather(memory)
        for job in state.jobs.values():
            codes[job.job_id] = active_code(memory, job, now)
    return codes


def pending_counts(memory: Memory, codes: Mapping[str, str] | None = None) -> dict[str, int]:
    """Jobs not running, per reason code: every job but those Running, Profiling, and Cancelling
    while their last lease runs out. A Retrying job counts: its lease crashed, and it waits for
    the next round to be tried again. ``codes``: reason_codes(memory), when the caller has them."""
    codes = reason_codes(memory) if codes is None else codes
    state = memory.state
    running = {state.jobs[i].job_id for entry in state.previous_assignment for i in entry if i in state.jobs} if state else set()
    counts = collections.Counter(
        code for job_id, code in codes.items()
        if code not in (RUNNING, PROFILING) and not (code == CANCELLING and job_id in running)
    )
    return dict(counts)


# -- one job, in full ---------------------------------------------------------------------------


def owed_s(state: MechanismState, index: int, now_s: float, seed_s: float) -> dict[str, float]:
    """Per type, the time the allocation gave the job's entries since its ledgers began, less
    the time they received (the ledgers' deficit carried over resets, plus share x time since
    the last reset, less what was received since: the same sum the holds read): positive, it is
    owed time there; negative, it had more than its share."""
    ledgers = state.entries
    since_reset_s = now_s - state.last_reset_s
    owed = dict.fromkeys(state.gpus, 0.0)
    for entry in ledgers.entries_of(index):
        ledger = ledgers[entry]
        fractions = state.allocation.get(entry, {})
        for w in owed:
            owed[w] += ledger.deficit_s[w] + fractions.get(w, 0.0) * since_reset_s - (ledger.received_s[w] - seed_s)
    return {w: round(v, 3) for w, v in owed.items()}


def type_priority(state: MechanismState, entry: Entry, w: str) -> float:
    """The entry's priority on the type, as the planner ranks it before any move's charge:
    its share over the share of the type's time it received (priority.priority_rows)."""
    share = state.allocation.get(entry, {}).get(w, 0.0)
    ledger = state.entries.get(entry)
    if share == 0.0 or ledger is None or min(ledger.throughputs[w]) <= 0.0:
        return 0.0
    total_s = state.type_time_s.get(w, 0.0)
    received = ledger.received_s[w] / total_s if total_s > 0 else 0.0
    return share / received if received > 0 else share * UNSERVED_FACTOR


def _holders(state: MechanismState, types: list[str], now: Round) -> list[dict[str, object]]:
    """The entries holding GPUs of ``types`` this round, highest priority there first."""
    rows = []
    for entry, placement in state.previous_assignment.items():
        w = placement.accelerator_type
        if w in types:
            rows.append({
                "ids": list(state.job_ids_of(entry)), "accelerator_type": w, "gpus": len(placement.worker_ids),
                "priority": round(type_priority(state, entry, w), 6),
                **({"profiling": True} if entry in now.profiled else {}),
            })
    rows.sort(key=lambda r: r["priority"], reverse=True)  # type: ignore[arg-type,return-value]
    return rows


def _shares_text(shares: Mapping[str, float]) -> str:
    return ", ".join(f"{w} {f:.2f}" for w, f in sorted(shares.items(), key=lambda kv: -kv[1]))


def explain(memory: Memory, job_id: str, now_s: float, *, seed_s: float = 0.0) -> dict[str, object] | None:
    """``gavel job ID --why``: the job's code, a sentence, and what it rests on: its share per
    type and what it is owed there, who holds the GPUs it wants (their priority beside its own),
    its gang against the GPUs free, its failed attempts. None for a job the memory does not hold
    as active, submitted or held (an ended one: its row says how it ended)."""
    for job in memory.submitted:
        if job.job_id == job_id:
            return {"code": BEGIN_TIME, "reason": f"submitted; it arrives in {max(0.0, job.arrival_s - now_s):.0f} s (mechanism time)",
                    "arrival_s": job.arrival_s}
    for job, why in memory.held:
        if job.job_id == job_id:
            return {"code": HELD, "reason": f"held at admission: {why}", "gang_gpus": job.scale_factor}
    for position, (job, why) in enumerate(memory.queued):
        if job.job_id == job_id:
            return {"code": ADMISSION, "reason": f"in the admission queue: {why}", "gang_gpus": job.scale_factor,
                    "arrival_s": job.arrival_s, "admission_queue_position": position + 1,
                    "admission_queue_length": len(memory.queued)}
    state = memory.state
    index = state.jobs.index_of.get(job_id) if state is not None else None
    if state is None or index is None:
        return None
    job = state.jobs[index]
    now = gather(memory)
    code = active_code(memory, job, now)
    shares = {w: round(f, 6) for w, f in now.shares.get(index, {}).items()}
    record = memory.observations.attempts.get(job_id) or {}
    failed = int(record.get("failed_in_a_row", 0) or 0)  # type: ignore[call-overload]
    detail: dict[str, object] = {
        "code": code,
        "shares": shares,
        "owed_s": owed_s(state, index, now_s, seed_s),
        "priority": {w: round(type_priority(state, (index,), w), 6) for w in state.gpus if _runs_on(state, index, w)},
        "gang_gpus": job.scale_factor,
        "free_gpus": dict(now.free_gpus),
        "failed_attempts_in_a_row": failed,
    }
    wanted = list(shares) or [w for w in state.gpus if _runs_on(state, index, w)]
    holders = _holders(state, wanted, now) if code in (PRIORITY, RESOURCES, NO_ALLOCATION) else []
    if holders:
        detail["holders"] = holders[:HOLDERS_SHOWN]
        if len(holders) > HOLDERS_SHOWN:
            detail["holders_not_shown"] = len(holders) - HOLDERS_SHOWN
    detail["reason"] = _sentence(memory, job, code, now, shares, holders, failed)
    return detail


def _sentence(
    memory: Memory, job: JobState, code: str, now: Round, shares: Mapping[str, float], holders: list[dict[str, object]],
    failed: int,
) -> str:
    obs = memory.observations
    crashes = f"; {failed} attempt{'s' if failed != 1 else ''} failed in a row" if failed else ""
    if code == CANCELLING:
        return f"cancelled: it leaves at the next boundary ({memory.cancelling[job.job_id]})"
    if code in (RUNNING, PROFILING, RETRYING):
        _, placement = now.running_on[job.index]
        where = f"on {len(placement.worker_ids)} {placement.accelerator_type} GPU{'s' if len(placement.worker_ids) != 1 else ''}"
        if code == PROFILING:
            return f"runs {where} to measure its speed for the estimator (within the profiling budget, whatever its share)"
        if code == RETRYING:
            return f"its last attempt {where} crashed; it is tried again next round{crashes}"
        if not shares:
            return f"runs {where}, which the allocation leaves idle (it gives this job no share)"
        return f"runs {where}; its share: {_shares_text(shares)}"
    if code == NO_ALLOCATION:
        if obs.degraded_since_s is not None:
            return f"the policy does not answer (since {obs.degraded_since_s:.0f} s): the allocation kept gives it no share{crashes}"
        if obs.allocation_solved_at_s is None and not memory.state.allocation:  # type: ignore[union-attr]
            return f"no allocation has been solved yet; it gets a share at the first solve{crashes}"
        return f"admitted since the allocation in force was solved: it gets a share at the next solve{crashes}"
    if code == RESOURCES:
        free = ", ".join(f"{w} {now.free_gpus.get(w, 0)}" for w in shares)
        return f"a gang of {job.scale_factor} GPUs: the types of its share have fewer free this round ({free} free){crashes}"
    ahead = ", ".join(f"{'+'.join(h['ids'])} ({h['priority']:.3g})" for h in holders[:3])  # type: ignore[arg-type]
    if not shares:
        base = "the allocation in force gives it no share: the policy gives the GPUs to jobs ahead of it"
    else:
        base = f"its share ({_shares_text(shares)}) is on GPUs that jobs ahead of it hold this round"
    return f"{base}{': ' + ahead if ahead else ''}{crashes}"
