"""The only functions that change a MechanismState: admission, workers joining and leaving,
allocation resets, the new allocation, and settling a finished round. Section numbers refer to
docs/gavel-semantics.md.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from common.errors import JobFieldError
from common.job_checks import check_job
from mechanism_service.core.model import (
    Entry, EntryLedger, FrozenAllocation, JobState, MechanismState, Placement, share_matrix,
)
from mechanism_service.core.rates import Rates
from mechanism_service.core.settings import MechanismSettings
from mechanism_service.core.stability import steady_allocation


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
        return Admission("hold", f"{reason}: it waits for workers to join")
    return Admission("refuse", reason)


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
    for entry in state.entries.entries_of(index):
        del state.entries[entry]
    state.needs_allocation = True
    return record


def reset_due(state: MechanismState, now_s: float, settings: MechanismSettings, *, force: bool = False) -> bool:
    """Section 4: re-solve only after a change, and not more often than the minimum interval
    (with Gavel's quirk that a reset at t = 0 counts as "never reset"). ``force``: a change that
    cannot wait for the interval (a worker was lost: the allocation gives its GPUs away)."""
    if not state.needs_allocation:
        return False
    if force:
        return True
    if settings.reset_quirk_at_zero and state.last_reset_s == 0:
        return True
    return state.resets == 0 or now_s - state.last_reset_s >= settings.min_reset_interval_s


def reset_ledgers(state: MechanismState, now_s: float, settings: MechanismSettings) -> None:
    """Section 4: fold the time received under the old allocation into the deficits, then
    re-seed every entry (and each type's total) for the new allocation."""
    elapsed_s = now_s - state.last_reset_s
    seed = settings.seed_s
    ledgers = state.entries
    rows = ledgers.rows  # removed entries' rows too: nothing reads them
    # per cell, as the plain loop did: deficit += allocation x elapsed - (received - seed)
    target_s = ledgers.allocation_matrix(state.allocation) * elapsed_s
    ledgers.deficit_s[:rows] += target_s - (ledgers.received_s[:rows] - seed)
    ledgers.received_s[:rows] = seed
    total = _seeds_summed(seed, len(ledgers))
    for w in state.accelerator_types:
        state.type_time_s[w] = total
    state.last_reset_s = now_s
    state.resets += 1


def _seeds_summed(seed_s: float, count: int) -> float:
    """``seed_s`` added ``count`` times from 0.0, one addition after another (as the ledgers'
    reset always summed them: the same float, not ``seed_s * count``)."""
    if count == 0:
        return 0.0
    return float(np.add.accumulate(np.full(count, seed_s))[-1])


def apply_allocation(
    state: MechanismState,
    fractions: Mapping[tuple[str, ...], Mapping[str, float]],
    isolated_throughputs: Mapping[str, float],
    settings: MechanismSettings,
    policy_state: str = "",
) -> None:
    """Install a new allocation (job-id tuples -> type -> fraction) and remember the isolated
    baseline it came with (see policy_input.advance_isolated_time)."""
    index_of = {job.job_id: index for index, job in state.jobs.items()}
    allocation: dict[Entry, dict[str, float]] = {}
    for job_ids, by_type in fractions.items():  # one a job at 20,000 jobs: kept plain
        if len(job_ids) == 1:
            index = index_of.get(job_ids[0])
            if index is not None:
                allocation[(index,)] = dict(by_type)
        elif all(job_id in index_of for job_id in job_ids):
            allocation[tuple(sorted(index_of[j] for j in job_ids))] = dict(by_type)
    if settings.zero_fill_allocation:
        # An LP policy returns a row for every entry it was given, zeros included.
        missing = state.entries.row_of.keys() - allocation.keys()
        for entry in state.entries if missing else ():
            if entry in missing:
                allocation[entry] = {}
    if settings.steady_types_tolerance is not None:  # each job kept on its type (core/stability.py)
        allocation = steady_allocation(
            state, allocation, settings.steady_types_tolerance, settings.steady_max_split_jobs,
        )
    state.allocation = _install(state, allocation)
    state.policy_state = policy_state
    state.needs_allocation = False
    for job in state.jobs.values():
        job.isolated_throughput_at_last_solve = isolated_throughputs.get(job.job_id)


def _install(state: MechanismState, allocation: dict[Entry, dict[str, float]]) -> FrozenAllocation:
    """The allocation as the state keeps it (never changed in place), with its columnar copy in
    the ledgers for the planner's passes."""
    installed = FrozenAllocation(allocation)
    rows: list[int | None] = list(map(state.entries.row_of.get, allocation))
    shares_of: Collection[dict[str, float]] = allocation.values()
    if None in rows:  # entries of jobs gone since the request: no ledger to copy to
        shares_of = [shares for row, shares in zip(rows, shares_of) if row is not None]
        rows = [row for row in rows if row is not None]
    state.entries.set_allocation(installed, rows, share_matrix(shares_of, state.entries.types))
    return installed


@dataclass(frozen=True, slots=True)
class LeaseResult:
    """What one entry did in a round: steps per member (same order as the entry) and when the
    last member stopped. ``ended``: how a real worker's lease ended when it was not the job's
    time running out: "crashed" (a member's process failed), "lost" (a worker of it was declared
    lost) or "unreported" (no report by the round's timeout). Each is launched afresh next, never
    extended. Simulated leases leave it empty."""

    entry: Entry
    placement: Placement
    steps: tuple[int, ...]
    finish_s: float
    ended: Literal["", "crashed", "lost", "unreported"] = ""


def settle_round(
    state: MechanismState,
    results: Iterable[LeaseResult],
    round_start_s: float,
    settings: MechanismSettings,
) -> list[JobState]:
    """Section 8: credit steps and time, count gang failures, retire finished jobs.

    Results are settled latest finish first. Returns the jobs that completed (or were dropped).

    A lease that crashed or lost its worker is not a gang failure, whatever its steps: its steps
    (what was checkpointed, or reported before the loss) and time count, the job's gang-failure
    count is left as it was (crashes are counted as failed attempts by the shell), and its
    placement is forgotten: no process runs there any more, so the next round launches the job
    afresh instead of extending the lease."""
    done: list[JobState] = []
    for result in sorted(results, key=lambda r: r.finish_s, reverse=True):
        members = [(i, steps) for i, steps in zip(result.entry, result.steps, strict=True) if i in state.jobs]
        if not members:
            continue
        for i, _ in members:
            state.jobs[i].last_finish_s = result.finish_s
        exec_s = result.finish_s - round_start_s
        scale_factor = state.jobs[members[0][0]].scale_factor
        if result.ended:
            _settle_ended_early(state, result, members, exec_s, done)
            continue
        if any(steps < scale_factor for _, steps in members) or exec_s <= 0:
            # A gang that got fewer steps than GPUs: some worker did nothing (section 8.3).
            state.needs_allocation = True
            if len(result.entry) == 1:
                job = state.jobs[members[0][0]]
                job.failures += 1
                if job.failures >= settings.max_gang_failures:
                    done.append(remove_job(state, job.index, dropped=True))
            continue
        for i, _ in members:
            state.jobs[i].failures = 0
        _credit(state, result, members, exec_s, done)
    return done


def _credit(
    state: MechanismState, result: LeaseResult, members: list[tuple[int, int]], exec_s: float, done: list[JobState]
) -> None:
    """A lease's steps and time to its members and its entry's ledger; the finished retire."""
    w = result.placement.accelerator_type
    share_s = exec_s * len(result.placement.worker_ids) / len(result.entry)
    for i, steps in members:
        job = state.jobs[i]
        job.steps_done += steps
        job.gpu_seconds_by_type[w] = job.gpu_seconds_by_type.get(w, 0.0) + share_s
    ledgers = state.entries
    row = ledgers.row_of.get(result.entry)
    if row is not None:
        ledgers.received_s[row, ledgers.column_of[w]] += exec_s
        state.type_time_s[w] += exec_s
    for i, _ in members:
        if state.jobs[i].steps_remaining <= 0:
            done.append(remove_job(state, i))


def _settle_ended_early(
    state: MechanismState, result: LeaseResult, members: list[tuple[int, int]], exec_s: float, done: list[JobState]
) -> None:
    """A crashed, lost or unreported lease (see settle_round): credit what it did (no time when it
    ran none), and launch it afresh next."""
    if state.previous_assignment.get(result.entry) == result.placement:
        del state.previous_assignment[result.entry]
    _credit(state, result, members, max(exec_s, 0.0), done)


def record_first_runs(state: MechanismState, assignment: Mapping[Entry, Placement], now_s: float) -> None:
    for entry in assignment:
        for i in entry:
            job = state.jobs[i]
            if job.first_run_s is None:
                job.first_run_s = now_s
