"""The only functions that change a MechanismState: admission, workers joining and leaving,
allocation resets, the new allocation, and settling a finished round. Section numbers refer to
docs/gavel-semantics.md.
"""

from __future__ import annotations

import itertools
import operator
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
    jobs = state.jobs
    allocation = _answer_entries(fractions, jobs.index_of)  # (a state's jobs are always a JobTable)
    columns = allocation_columns(state, allocation)  # read by the re-lay and the install alike
    # (as many entries as the ledgers, each with a ledger: every entry is named, none missing)
    named_all = len(allocation) == len(state.entries) and bool((columns[0] >= 0).all())
    if settings.zero_fill_allocation and not named_all:
        # An LP policy returns a row for every entry it was given, zeros included.
        missing = state.entries.row_of.keys() - allocation.keys()
        if missing:
            allocation = dict(allocation)  # _answer_entries may have made it frozen already
        for entry in state.entries if missing else ():
            if entry in missing:
                allocation[entry] = {}
        if missing:
            columns = allocation_columns(state, allocation)
    if settings.steady_types_tolerance is not None:  # each job kept on its type (core/stability.py)
        relaid, relaid_shares = steady_allocation(
            state, allocation, settings.steady_types_tolerance, settings.steady_max_split_jobs, columns=columns,
            with_shares=True,
        )
        if relaid_shares is not None:  # the same entries in the same order: the same rows
            allocation, columns = relaid, (columns[0], relaid_shares)
    state.allocation = _install(state, allocation, columns)
    state.policy_state = policy_state
    state.needs_allocation = False
    if isolated_throughputs:
        for job, baseline in zip(jobs.values(), map(isolated_throughputs.get, map(_JOB_ID, jobs.values()))):
            job.isolated_throughput_at_last_solve = baseline
    else:  # no baselines (every policy but finish-time fairness): only a job that has one changes
        with_baseline = map(operator.is_not, map(_BASELINE, jobs.values()), itertools.repeat(None))
        for job in itertools.compress(list(jobs.values()), list(with_baseline)):
            job.isolated_throughput_at_last_solve = None


_JOB_ID = operator.attrgetter("job_id")
_BASELINE = operator.attrgetter("isolated_throughput_at_last_solve")
_FIRST = operator.itemgetter(0)


def _answer_entries(
    fractions: Mapping[tuple[str, ...], Mapping[str, float]], index_of: Mapping[str, int]
) -> dict[Entry, dict[str, float]]:
    """The answer's entries as job-index tuples (a pair's sorted), each with a copy of its
    shares; entries naming a job that has left are dropped. An answer of single jobs only, all
    still here (a policy that does not pack), is mapped in C: one look-up pass, the same dict
    in the same order as the loop."""
    if len(fractions) and set(map(len, fractions)) == {1}:
        indices = list(map(index_of.get, map(_FIRST, fractions)))
        if None not in indices:
            values = fractions.values()
            copy = dict.copy if set(map(type, values)) == {dict} else dict  # the same dicts, faster
            # Made frozen at once: _install keeps it as it is (a 20,000-entry dict copied is ~2 ms)
            return FrozenAllocation(zip(zip(indices), map(copy, values)))
    allocation: dict[Entry, dict[str, float]] = {}
    for job_ids, by_type in fractions.items():
        if len(job_ids) == 1:
            index = index_of.get(job_ids[0])
            if index is not None:
                allocation[(index,)] = dict(by_type)
        elif all(job_id in index_of for job_id in job_ids):
            allocation[tuple(sorted(index_of[j] for j in job_ids))] = dict(by_type)
    return allocation


def allocation_columns(state: MechanismState, allocation: Mapping[Entry, Mapping[str, float]]) -> tuple[np.ndarray, np.ndarray]:
    """The allocation's entries' ledger rows (-1: no ledger, its job left since the request) and
    their shares as rows x the ledgers' types (model.share_matrix), in the allocation's order."""
    count = len(allocation)
    rows = np.fromiter(map(state.entries.row_of.get, allocation, itertools.repeat(-1)), np.intp, count)
    return rows, share_matrix(list(allocation.values()), state.entries.types)


def _install(
    state: MechanismState, allocation: dict[Entry, dict[str, float]], columns: tuple[np.ndarray, np.ndarray]
) -> FrozenAllocation:
    """The allocation as the state keeps it (never changed in place), with its columnar copy in
    the ledgers for the planner's passes (``columns``: allocation_columns of it)."""
    installed = allocation if type(allocation) is FrozenAllocation else FrozenAllocation(allocation)
    rows, shares = columns
    kept = rows >= 0
    if not kept.all():  # entries of jobs gone since the request: no ledger to copy to
        rows, shares = rows[kept], shares[kept]
    state.entries.set_allocation(installed, rows, shares)
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

    def __init__(
        self, entry: Entry, placement: Placement, steps: tuple[int, ...], finish_s: float,
        ended: Literal["", "crashed", "lost", "unreported"] = "",
    ) -> None:
        # Written out (the generated one's work, ~0.2 us less a call): one is built per lease
        # settled, ~60,000 in the simulator's calibration run.
        _SET(self, "entry", entry)
        _SET(self, "placement", placement)
        _SET(self, "steps", steps)
        _SET(self, "finish_s", finish_s)
        _SET(self, "ended", ended)


_SET = object.__setattr__  # a frozen dataclass sets its fields so in its own __init__


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
    jobs = state.jobs
    received = _ReceivedTime(state)
    type_time_s, max_failures = state.type_time_s, settings.max_gang_failures
    finishing_fails = settings.finishing_gang_fails
    for result in sorted(results, key=_FINISH_S, reverse=True):
        entry, steps_of = result.entry, result.steps
        if len(entry) == 1 and len(steps_of) == 1 and not result.ended:
            # A single job's lease that ended as planned (nearly every lease): the general path
            # below with one member, written out (one job per lease, no lists).
            job = jobs.get(entry[0])
            if job is None:
                continue
            finish_s = job.last_finish_s = result.finish_s
            exec_s = finish_s - round_start_s
            steps = steps_of[0]
            if exec_s <= 0 or (steps < job.scale_factor and (finishing_fails or steps < job.total_steps - job.steps_done)):
                state.needs_allocation = True
                job.failures += 1
                if job.failures >= max_failures:
                    done.append(remove_job(state, job.index, dropped=True))
                    received.moved()  # the removal may have moved the ledgers' rows
                continue
            job.failures = 0
            placement = result.placement
            w = placement.accelerator_type
            job.steps_done += steps
            by_type = job.gpu_seconds_by_type
            # (_credit's share, exec_s x GPUs / members: with one member the division is exact)
            by_type[w] = by_type.get(w, 0.0) + exec_s * len(placement.worker_ids)
            row = received.row_of.get(entry)
            if row is not None:  # received.add, written out
                cell = (row, received.column_of[w])
                received.cells[cell] += exec_s
                type_time_s[w] += exec_s
            if job.total_steps - job.steps_done <= 0:
                done.append(remove_job(state, job.index))
                received.moved()
            continue
        members = [(i, steps) for i, steps in zip(entry, steps_of, strict=True) if i in jobs]
        if not members:
            continue
        finish_s = result.finish_s
        for i, _ in members:
            jobs[i].last_finish_s = finish_s
        exec_s = finish_s - round_start_s
        scale_factor = jobs[members[0][0]].scale_factor
        if result.ended:
            _settle_ended_early(state, result, members, exec_s, done, received)
            continue
        if exec_s <= 0 or any(steps < scale_factor and (finishing_fails or steps < jobs[i].steps_remaining) for i, steps in members):
            # A gang that got fewer steps than GPUs: some worker did nothing (section 8.3), unless
            # that was every step it had left (settings.finishing_gang_fails).
            state.needs_allocation = True
            if len(result.entry) == 1:
                job = jobs[members[0][0]]
                job.failures += 1
                if job.failures >= max_failures:
                    done.append(remove_job(state, job.index, dropped=True))
                    received.moved()
            continue
        for i, _ in members:
            jobs[i].failures = 0
        _credit(state, result, members, exec_s, done, received)
    return done


_FINISH_S = operator.attrgetter("finish_s")


class _ReceivedTime:
    """Adds the leases' time to their entries' ledger cells as they are settled (one ``+=`` a
    cell, in settling order: the floats the ledgers always had), through a memoryview of the
    ledgers' array: a Python float read and written without a numpy scalar each way (~3x
    cheaper a cell than indexing the array). A removal may move the ledgers' rows (compact
    replaces ``row_of``; the array stays the same object): ``moved`` looks them up again."""

    __slots__ = ("_ledgers", "row_of", "column_of", "cells")

    def __init__(self, state: MechanismState) -> None:
        self._ledgers = state.entries
        self.moved()

    def moved(self) -> None:
        ledgers = self._ledgers
        self.row_of, self.column_of = ledgers.row_of, ledgers.column_of
        # a float64 array (the ledgers make no other): its cells are Python floats through the view
        self.cells = memoryview(ledgers.received_s)

    def add(self, entry: Entry, w: str, exec_s: float) -> bool:
        """Whether the entry has a ledger (its time then counts)."""
        row = self.row_of.get(entry)
        if row is None:
            return False
        cell = (row, self.column_of[w])
        self.cells[cell] += exec_s
        return True


def _credit(
    state: MechanismState, result: LeaseResult, members: list[tuple[int, int]], exec_s: float, done: list[JobState],
    received: _ReceivedTime,
) -> None:
    """A lease's steps and time to its members and its entry's ledger; the finished retire."""
    w = result.placement.accelerator_type
    share_s = exec_s * len(result.placement.worker_ids) / len(result.entry)
    jobs = state.jobs
    finished = False
    for i, steps in members:
        job = jobs[i]
        job.steps_done += steps
        by_type = job.gpu_seconds_by_type
        by_type[w] = by_type.get(w, 0.0) + share_s
        finished = finished or job.total_steps - job.steps_done <= 0
    if received.add(result.entry, w, exec_s):
        state.type_time_s[w] += exec_s
    if finished:
        for i, _ in members:
            if jobs[i].steps_remaining <= 0:
                done.append(remove_job(state, i))
                received.moved()  # the removal may have moved the ledgers' rows


def _settle_ended_early(
    state: MechanismState, result: LeaseResult, members: list[tuple[int, int]], exec_s: float, done: list[JobState],
    received: _ReceivedTime,
) -> None:
    """A crashed, lost or unreported lease (see settle_round): credit what it did (no time when it
    ran none), and launch it afresh next."""
    if state.previous_assignment.get(result.entry) == result.placement:
        del state.previous_assignment[result.entry]
    _credit(state, result, members, max(exec_s, 0.0), done, received)


def record_first_runs(state: MechanismState, assignment: Mapping[Entry, Placement], now_s: float) -> None:
    for entry in assignment:
        for i in entry:
            job = state.jobs[i]
            if job.first_run_s is None:
                job.first_run_s = now_s
