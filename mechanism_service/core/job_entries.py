"""A job joins the state (its single entry and its pairs) and leaves it (completed, failed,
cancelled or set aside). Section numbers refer to docs/gavel-semantics.md."""

from __future__ import annotations

from mechanism_service.core.admission import NewJob
from mechanism_service.core.model import EntryLedger, JobState, MechanismState
from mechanism_service.core.rates import Rates
from mechanism_service.core.settings import MechanismSettings


def admit(state: MechanismState, job: NewJob, settings: MechanismSettings, rates: Rates) -> JobState:
    """Section 3: number the job, seed its received time, create its pair entries."""
    index = state.next_index
    state.next_index += 1
    types = state.accelerator_types
    record = JobState(
        index=index,
        job_id=job.job_id,
        job_type=job.job_type,
        scale_factor=job.scale_factor,
        priority_weight=job.priority_weight,
        total_steps=job.total_steps,
        arrival_s=job.arrival_s,
        slo_s=job.slo_s,
        entity=job.entity,
        gpu_seconds_by_type=dict.fromkeys(types, 0.0),
    )
    # The single entry first, then its pairs with every active job of the same scale factor,
    # oldest partner first: this order breaks ties in the planner.
    state.entries[(index,)] = EntryLedger(
        throughputs={w: (rates.isolated(record, w),) for w in types},
        received_s=dict.fromkeys(types, settings.seed_s),
        deficit_s=dict.fromkeys(types, 0.0),
    )
    if settings.packing:
        for other in state.jobs.values():
            if other.scale_factor != job.scale_factor:
                continue
            throughputs = {}
            for w in types:
                packed = rates.pair(other, record, w)
                throughputs[w] = tuple(packed) if packed is not None else (0.0, 0.0)
            state.entries[(other.index, index)] = EntryLedger(
                throughputs=throughputs, received_s=dict.fromkeys(types, 0.0), deficit_s=dict.fromkeys(types, 0.0)
            )
    state.jobs[index] = record
    state.needs_allocation = True
    return record


def remove_job(state: MechanismState, index: int, *, dropped: bool = False) -> JobState:
    """Section 3: the job leaves with its single entry and every pair it is in, and is listed
    among the completed (``dropped``: failed, with no completion time)."""
    record = withdraw_job(state, index)
    if dropped:
        record.last_finish_s = None
    state.completed.append(record)
    return record


def withdraw_job(state: MechanismState, index: int) -> JobState:
    """The job leaves the cluster without completing or failing (cancelled, or set aside because
    the policy refuses to solve with it): its entries go, the allocation is recomputed."""
    record = state.jobs.pop(index)
    state.run_started_s.pop(index, None)
    for entry in state.entries.entries_of(index):
        del state.entries[entry]
    state.needs_allocation = True
    return record
