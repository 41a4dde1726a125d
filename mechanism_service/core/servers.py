"""Workers (servers) joining and leaving a running cluster's state, and the throughputs each
entry takes from the rates on a type."""

from __future__ import annotations

from collections.abc import Collection

from mechanism_service.core.model import Entry, MechanismState
from mechanism_service.core.rates import Rates
from mechanism_service.core.settings import MechanismSettings


def add_server(state: MechanismState, accelerator_type: str, gpus: int, settings: MechanismSettings, rates: Rates) -> list[int]:
    """A worker (server) joins a running cluster: its GPUs get the next ids; a new accelerator type
    gets a time ledger in every entry (seeded like a reset) and throughputs from the rates. The
    allocation is recomputed at the next allowed boundary."""
    ids = list(range(state.next_worker_id, state.next_worker_id + gpus))
    state.next_worker_id += gpus
    if accelerator_type not in state.gpus:
        state.gpus[accelerator_type] = 0
        state.servers[accelerator_type] = []
        state.type_time_s[accelerator_type] = settings.seed_s * len(state.entries)
        state.entries.add_type(accelerator_type, settings.seed_s)  # seeded, no deficit
        for entry, ledger in state.entries.items():
            ledger.throughputs[accelerator_type] = entry_throughputs(state, entry, accelerator_type, rates)
        for job in state.jobs.values():
            job.gpu_seconds_by_type.setdefault(accelerator_type, 0.0)
    state.gpus[accelerator_type] += gpus
    state.servers[accelerator_type].append(ids)
    state.needs_allocation = True
    return ids


def entry_throughputs(state: MechanismState, entry: Entry, accelerator_type: str, rates: Rates) -> tuple[float, ...]:
    """An entry's steps/s per member on the type, as the rates say (a pair that may not share
    GPUs there: zeros)."""
    jobs = [state.jobs[i] for i in entry]
    if len(jobs) == 1:
        return (rates.isolated(jobs[0], accelerator_type),)
    packed = rates.pair(jobs[0], jobs[1], accelerator_type)
    return tuple(packed) if packed is not None else (0.0, 0.0)


def refresh_throughputs(state: MechanismState, rates: Rates, indices: Collection[int] | None = None) -> None:
    """Every entry (or every entry of the jobs ``indices``) takes the rates' current throughputs
    (estimates change; a table does not)."""
    wanted = None if indices is None else set(indices)
    for entry, ledger in state.entries.items():
        if wanted is not None and wanted.isdisjoint(entry):
            continue
        for w in state.gpus:
            ledger.throughputs[w] = entry_throughputs(state, entry, w, rates)


def remove_server(state: MechanismState, accelerator_type: str, gpu_ids: Collection[int]) -> None:
    """A worker (server) leaves a running cluster (it was declared lost): the inverse of
    ``add_server``. Its GPUs leave the counts and the servers, and every entry that ran on one of
    them last round forgets that placement, so nothing is kept (extended) onto a dead worker: it
    is placed afresh, elsewhere. The type stays, with its ledgers, even with 0 GPUs left (planning
    skips it, the policy gets it with 0 GPUs), so a worker that registers again resumes it. Ids
    are never reused: a worker that comes back gets new ones (``add_server``)."""
    gone = set(gpu_ids)
    servers = state.servers.get(accelerator_type, [])
    mine = gone & {g for server in servers for g in server}
    if len(mine) != len(gone):
        raise ValueError(f"{accelerator_type}: GPUs {sorted(gone - mine)} are not in this cluster")
    state.servers[accelerator_type] = [kept for server in servers if (kept := [g for g in server if g not in gone])]
    state.gpus[accelerator_type] -= len(gone)
    state.previous_assignment = {
        entry: placement
        for entry, placement in state.previous_assignment.items()
        if not gone.intersection(placement.worker_ids)
    }
    state.needs_allocation = True
