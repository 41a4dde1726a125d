"""The mechanism's side of the policy conversation: the snapshot it sends when the allocation
is recomputed, and the allocation it reads back. Pure."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping, Sequence

import numpy as np

from common.allocation_columns import PreviousColumns
from common.messages import (
    AllocationComputed,
    AllocationEntry,
    AllocationRequested,
    ClassColocation,
    EntitySpec,
    PolicyJob,
    PolicyProblem,
)
from mechanism_service.core.model import JobState, MechanismState, share_matrix
from mechanism_service.core.rates import EstimatedRates, Rates


def advance_isolated_time(state: MechanismState) -> None:
    """Finish-time fairness measures each job against the time its done steps would have taken
    on its isolated share; add the steps done since the last allocation at the baseline that
    allocation reported (Gavel keeps this inside its FTF policy)."""
    for job in state.jobs.values():  # every job at every reset: plain locals, no property call
        remaining = job.total_steps - job.steps_done  # job.steps_remaining
        baseline = job.isolated_throughput_at_last_solve
        if baseline and job.steps_remaining_at_last_solve is not None:
            job.isolated_time_s += (job.steps_remaining_at_last_solve - remaining) / baseline
        job.steps_remaining_at_last_solve = remaining


def allocation_request(
    state: MechanismState,
    now_s: float,
    *,
    request_id: str,
    policy: str,
    deadline_s: float,
    preset: str = "default",
    seed: int | None = None,
    solver: str | None = None,
    packing: bool = False,
    rates: Rates | None = None,
) -> AllocationRequested:
    """The whole snapshot a stateless policy replica needs: throughputs by job type (the policy
    service holds the table) or, with estimated ``rates``, each job's own row and the packed
    fractions per pair of colocation classes; the current allocation for the policies that keep
    jobs in place.

    Jobs the cluster as it is cannot run (a gang larger than what is left of every type it runs
    on, after workers were lost) are left out: the policy would refuse the whole problem because
    of them. They stay admitted and are sent again once workers that fit them join. A type left
    with 0 GPUs stays in (the policy accepts zero counts, and a stateful policy may name it)."""
    explicit = rates is not None and rates.explicit
    running = runnable_jobs(state)
    jobs = tuple(
        PolicyJob(
            job_id=job.job_id,
            job_type=job.job_type,
            scale_factor=job.scale_factor,
            priority_weight=job.priority_weight,
            steps_remaining=job.steps_remaining,
            time_since_arrival_s=now_s - job.arrival_s,
            slo_s=job.slo_s,
            entity=job.entity,
            isolated_time_s=job.isolated_time_s,
            throughputs_steps_per_s=(
                {w: v[0] for w, v in state.entries[(job.index,)].throughputs.items()} if explicit else None
            ),
            colocation_class=rates.class_of(job) if explicit and packing else "",  # type: ignore[union-attr]
            attained_service_gpu_s=attained_gpu_s,
            time_since_last_run_s=since_run_s,
            last_run_s=last_run_s,
        )
        for job, (attained_gpu_s, since_run_s, last_run_s) in zip(running, [service_of(state, j, now_s) for j in running])
    )
    colocations = class_colocations(state, running, rates) if explicit and packing else None  # type: ignore[arg-type]
    previous = previous_entries(state)
    return AllocationRequested(
        request_id=request_id,
        policy=policy,
        # pairs: None lets the policy service take every packable pair from its table; () says
        # this policy does not pack (building the pair table would be wasted work)
        problem=PolicyProblem(
            worker_types=dict(state.gpus), jobs=jobs, pairs=None if packing else (), previous=previous,
            colocations=colocations,
            # every entity a job names, weighted equally: a job's entity must be one the problem
            # defines, or the policy refuses the problem (hierarchical policies share by them)
            entities=tuple(EntitySpec(name) for name in sorted({j.entity for j in jobs if j.entity is not None})),
        ),
        deadline_s=deadline_s,
        solver=solver,
        preset=preset,
        seed=seed,
        policy_state=state.policy_state,
    )


def service_of(state: MechanismState, job: JobState, now_s: float) -> tuple[float, float, float]:
    """What the job has run, as PolicyJob says it: GPU-seconds in all, seconds since its last
    run ended (since arrival if it never ran), the length of its last uninterrupted run (from
    when it began, ``run_started_s``, to when it last ran, ``last_finish_s``)."""
    last = job.last_finish_s
    started = state.run_started_s.get(job.index)
    since_s = now_s - (job.arrival_s if last is None else last)
    last_run_s = last - started if last is not None and started is not None and last > started else 0.0
    return float(sum(job.gpu_seconds_by_type.values())), max(0.0, since_s), last_run_s


# allocation_request's job fields, in AdmittedSnapshot's column order
AdmittedColumns = tuple[tuple[object, ...], ...]


def admitted_snapshot(
    state: MechanismState, now_s: float, *, rates: Rates | None = None, with_previous: bool = True,
    with_service: bool = True,
) -> tuple[dict[str, int], AdmittedColumns, PreviousColumns | tuple[AllocationEntry, ...]] | None:
    """What allocation_request would send, for a policy called in this process (the simulator's
    fast path), without a PolicyJob per job built only to be read back field by field: (worker
    types, the jobs' fields column by column -- ids, job types, scale factors, priority weights,
    steps remaining, time since arrival, SLOs, isolated times, then what each ran (service_of)
    --, the allocation in force: previous_columns). The same jobs, values and entries as the request; None when
    the request carries more than that (each job's own throughputs, colocation classes,
    entities), so the caller sends it. ``with_previous=False``: no entries of the allocation in
    force, for a policy that never reads them (policy_service.answer.reads_previous);
    ``with_service=False``: not what each job ran (zeros), for a policy that never reads it."""
    if rates is not None and rates.explicit:
        return None
    running = runnable_jobs(state)
    if any(job.entity is not None for job in running):
        return None
    rows = [
        (job.job_id, job.job_type, job.scale_factor, job.priority_weight, job.total_steps - job.steps_done,
         now_s - job.arrival_s, job.slo_s, job.isolated_time_s)
        for job in running
    ]
    columns = tuple(zip(*rows)) if rows else ((),) * 8
    if with_service and running:
        columns += tuple(zip(*(service_of(state, job, now_s) for job in running)))
    return dict(state.gpus), columns, previous_columns(state) if with_previous else ()


def class_colocations(state: MechanismState, jobs: Sequence[JobState], rates: EstimatedRates) -> tuple[ClassColocation, ...]:
    """The packed fractions of every pair of the jobs' colocation classes (same gang size), on
    the cluster's types: n jobs of C classes cost C^2 / 2 rows, not n^2 / 2 pairs."""
    first_of: dict[str, JobState] = {}
    for job in jobs:
        first_of.setdefault(rates.class_of(job), job)
    classes = sorted(first_of)
    out = []
    for i, a in enumerate(classes):
        for b in classes[i:]:
            job_a, job_b = first_of[a], first_of[b]
            if job_a.scale_factor != job_b.scale_factor:
                continue
            fractions = {}
            for w in state.gpus:
                f = rates.fraction(a, b, w, job_a, job_b)
                if f is not None and (f[0] > 0 or f[1] > 0):
                    fractions[w] = f
            if fractions:
                out.append(ClassColocation((a, b), fractions))
    return tuple(out)


def previous_entries(state: MechanismState) -> tuple[AllocationEntry, ...]:
    """The allocation in force, entries of jobs still here with some time on some type."""
    jobs = state.jobs
    out = []
    for entry, fractions in state.allocation.items():
        if len(entry) == 1:  # most entries: one job, looked up once
            job = jobs.get(entry[0])
            if job is None:
                continue
            job_ids: tuple[str, ...] = (job.job_id,)
        elif all(i in jobs for i in entry):
            job_ids = state.job_ids_of(entry)
        else:
            continue
        if any(v > 0 for v in fractions.values()):
            out.append(AllocationEntry(job_ids, dict(fractions)))
    return tuple(out)


def previous_columns(state: MechanismState) -> PreviousColumns | tuple[AllocationEntry, ...]:
    """previous_entries' entries as arrays (PreviousColumns), for a policy called in this process:
    the allocation in force is ~800 entries with time and thousands without at a packed
    re-solve of 120:120:120, and a Python pass over them (an entry object, the job ids looked
    up a member at a time) cost ~15 ms of it. The shares are the ledgers' columnar copy of the
    allocation in force (the same floats as its dicts) when it mirrors it, else read from the
    dicts a type at a time. Entries whose types are not the cluster's (a type gone since):
    previous_entries itself, whose entries the policy then refuses as before."""
    allocation, ledgers, jobs = state.allocation, state.entries, state.jobs
    types = tuple(ledgers.types)
    if not allocation:
        return ()
    if set(types) != set(state.gpus):
        return previous_entries(state)
    keys = list(allocation)
    count = len(keys)
    sizes = np.fromiter(map(len, keys), np.int64, count)
    if not ((sizes == 1) | (sizes == 2)).all():
        return previous_entries(state)
    first = np.fromiter(map(_FIRST, keys), np.int64, count)
    last = np.fromiter(map(_LAST, keys), np.int64, count)
    shares = None
    if ledgers.allocation_of is allocation:
        rows = np.fromiter(map(ledgers.row_of.get, keys, itertools.repeat(-1)), np.intp, count)
        if (rows >= 0).all():
            shares = ledgers.allocation[rows]
    if shares is None:
        shares = share_matrix(list(allocation.values()), types)
    # the jobs still here, numbered in the state's order (the job ids the members name)
    present = np.fromiter(jobs, np.int64, len(jobs))
    size = int(max(present.max(initial=-1), first.max(initial=-1), last.max(initial=-1))) + 1
    position = np.full(size, -1, dtype=np.int64)
    position[present] = np.arange(len(present))
    members = np.stack([position[first], position[last]], axis=1)
    kept = (members >= 0).all(axis=1) & (shares > 0).any(axis=1)
    return PreviousColumns(
        job_ids=tuple(map(_JOB_ID, jobs.values())),
        members=members[kept],
        single=(sizes == 1)[kept],
        types=types,
        fractions=shares[kept],
    )


_FIRST = operator.itemgetter(0)
_LAST = operator.itemgetter(-1)
_JOB_ID = operator.attrgetter("job_id")


def runnable_jobs(state: MechanismState) -> list[JobState]:
    """The jobs some type here can run (runs_here), in admission order: the jobs' ledger rows'
    throughputs read as one (jobs x types) array, not a ledger view a job (every job at every
    reset)."""
    jobs = list(state.jobs.values())
    if not jobs:
        return jobs
    ledgers, gpus = state.entries, state.gpus
    rows = list(map(ledgers.row_of.__getitem__, zip(map(_INDEX, jobs))))  # each job's own entry, (index,)
    rates = ledgers.throughputs[np.array(rows)[:, None], list(map(ledgers.column_of.__getitem__, gpus)), 0]
    fits = np.fromiter(gpus.values(), float, len(gpus)) >= np.fromiter(map(_SCALE, jobs), float, len(jobs))[:, None]
    runs = (fits & (rates > 0)).any(axis=1)
    return jobs if runs.all() else list(itertools.compress(jobs, runs.tolist()))


_INDEX = operator.attrgetter("index")
_SCALE = operator.attrgetter("scale_factor")


def runs_here(state: MechanismState, index: int) -> bool:
    """Whether some type here has enough GPUs for job ``index``'s gang and runs it (admission
    checked this, but a cluster that lost workers may have shrunk since)."""
    return _runs_on(tuple(state.gpus.items()), state.jobs[index].scale_factor, state.entries[(index,)].throughputs)


def _runs_on(gpus: Sequence[tuple[str, int]], scale_factor: int, throughputs: Mapping[str, Sequence[float]]) -> bool:
    for w, count in gpus:
        if count >= scale_factor and throughputs[w][0] > 0:
            return True
    return False


def allocation_fractions(reply: AllocationComputed) -> dict[tuple[str, ...], Mapping[str, float]]:
    return {entry.job_ids: entry.fractions for entry in reply.entries}
