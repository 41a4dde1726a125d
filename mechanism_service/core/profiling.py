"""Profiling runs: the measurements the estimator asks for, within a share of the cluster's time.

The estimator asks, per job, for runs alone on types it has not measured and for a number of
packed runs with jobs of given reference classes (ProfilingRequest). Before each round is
planned, ``choose`` turns some of those into leases that the round runs whatever the allocation
says, within a budget: every round adds ``share`` x the cluster's GPUs to a bucket, a profiling
lease takes its gang's GPUs from it, and the bucket holds at most one round's worth plus one gang
(so a small cluster still profiles now and then, and an idle bucket does not hoard).

A packed cell pairs the job with an active job of the wanted class (both make progress: no GPU
runs a throwaway reference job), and only under a policy that packs (the pair's ledger exists).
Cells alone come first (every policy needs the speed alone on each type; packed fractions only
refine the match). One cell per job per round; a cell is served once per job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from common.messages import ProfilingRequest
from mechanism_service.core.model import Entry, MechanismState
from mechanism_service.core.rates import colocation_class


@dataclass(frozen=True, slots=True)
class ProfilingPick:
    entry: Entry
    accelerator_type: str
    job_id: str
    cell: tuple[str, str]  # (type, partner class "" for alone)


def choose(
    state: MechanismState,
    requests: Mapping[str, ProfilingRequest],
    share: float,
    *,
    packing: bool,
) -> list[ProfilingPick]:
    """The profiling leases of this round (they take their GPUs before the planner runs)."""
    profiling = state.profiling
    total_gpus = sum(state.gpus.values())
    if share <= 0 or total_gpus == 0:
        return []
    largest_gang = max((j.scale_factor for j in state.jobs.values()), default=1)
    profiling.tokens_gpus = min(profiling.tokens_gpus + share * total_gpus, share * total_gpus + largest_gang)
    if not requests:
        return []
    index_of = {job.job_id: i for i, job in state.jobs.items()}
    free = dict(state.gpus)
    taken: set[int] = set()
    picks: list[ProfilingPick] = []
    for job_id in sorted((j for j in requests if j in index_of), key=index_of.__getitem__):
        index = index_of[job_id]
        if index in taken:
            continue
        job = state.jobs[index]
        if profiling.tokens_gpus < job.scale_factor:
            break
        request = requests[job_id]
        pick = _first_servable(state, request, index, free, taken, packing)
        if pick is None:
            continue
        picks.append(pick)
        taken.update(pick.entry)
        free[pick.accelerator_type] -= job.scale_factor
        profiling.tokens_gpus -= job.scale_factor
        profiling.served.setdefault(job_id, set()).add(pick.cell)
        if pick.cell[1]:
            profiling.packed_served[job_id] = profiling.packed_served.get(job_id, 0) + 1
        profiling.leases += 1
        profiling.gpu_rounds += job.scale_factor
    return picks


def _first_servable(
    state: MechanismState, request: ProfilingRequest, index: int, free: dict[str, int], taken: set[int], packing: bool
) -> ProfilingPick | None:
    job = state.jobs[index]
    served = state.profiling.served.get(job.job_id, set())
    packed_left = request.packed_wanted - state.profiling.packed_served.get(job.job_id, 0)
    for cell in request.cells:
        key = (cell.accelerator_type, cell.partner_class)
        w = cell.accelerator_type
        if key in served or free.get(w, 0) < job.scale_factor:
            continue
        if not cell.partner_class:
            if state.entries[(index,)].throughputs.get(w, (0.0,))[0] <= 0:
                continue  # believed unable to run there (a zero is not worth a crash to confirm)
            return ProfilingPick((index,), w, job.job_id, key)
        if not packing or packed_left <= 0:
            continue
        partner = _partner(state, index, cell.partner_class, taken, w)
        if partner is not None:
            return ProfilingPick(tuple(sorted((index, partner))), w, job.job_id, key)
    return None


def new_request(state: MechanismState, job_id: str) -> None:
    """A new request for the job says how many packed runs the estimator still wants: count
    afresh."""
    state.profiling.packed_served.pop(job_id, None)


def _partner(state: MechanismState, index: int, partner_class: str, taken: set[int], accelerator_type: str) -> int | None:
    """The oldest active job of the class that is free this round and may pack with the job."""
    for other, job in state.jobs.items():
        if other == index or other in taken or colocation_class(job) != partner_class:
            continue
        entry = (min(index, other), max(index, other))
        ledger = state.entries.get(entry)
        if ledger is None:
            continue
        if min(ledger.throughputs.get(accelerator_type, (0.0, 0.0))) <= 0:
            continue  # believed unable to share the type

        return other
    return None
