"""The simulator's shortcut through build_problem (its ``admitted``): jobs a caller in this process
admitted itself, passed column by column (``AdmittedJobs``), and their per-job arrays built without
the job-by-job checks (``admitted_columns``) when nothing calls for them.

The simulator's mechanism checked each job's own fields (common/job_checks.py) at admission, and
they cannot change since; what it computes (steps left, times) and whether each job can run are
checked here, vectorised. On any doubt ``admitted_columns`` says None and build_problem runs the
job-by-job checks (validation.py), so an error is the one they raise; the problem is the same either
way (tests/unit/policy/test_admitted_problem.py). The table's rows are cached across problems.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from common.job_checks import MAX_SCALE_FACTOR, MAX_TIME_S, MAX_TOTAL_STEPS
from common.throughputs import ThroughputTable
from policy_service.core.problem import JobSpec

# A problem's per-job arrays: (throughputs, scale factors, weights, steps, waited, SLOs, isolated
# times, entities, job id -> row, (3, n) what the jobs ran: attained GPU-seconds, since the last
# run, the last run's length)
Columns = tuple
# attained GPU-seconds: a time's bound times the largest gang
MAX_SERVICE_GPU_S = MAX_TIME_S * MAX_SCALE_FACTOR


@dataclass(frozen=True)
class AdmittedJobs:
    """Jobs a caller in this process admitted itself, field by field (build_problem's
    ``admitted`` shortcut, without a JobSpec per job): no throughputs, entity or colocation
    class of their own, so the table gives every row. Any value the shortcut cannot vouch for
    sends them through the job-by-job checks (``specs``), whose error is then the one raised."""

    ids: tuple[str, ...]
    job_types: tuple[str, ...]
    scale_factors: tuple[int, ...]
    priority_weights: tuple[float, ...]
    steps_remaining: tuple[float, ...]
    time_since_arrival_s: tuple[float, ...]
    slo_s: tuple[float | None, ...]
    isolated_time_s: tuple[float, ...]
    # What each job ran (JobSpec's fields of the name); () when not given: zeros
    attained_service_gpu_s: tuple[float, ...] = ()
    time_since_last_run_s: tuple[float, ...] = ()
    last_run_s: tuple[float, ...] = ()

    def __len__(self) -> int:
        return len(self.ids)

    def service(self) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
        """(attained GPU-seconds, since the last run, the last run's length), zeros when not given."""
        zeros = (0.0,) * len(self.ids)
        return tuple(  # type: ignore[return-value]
            column if column else zeros
            for column in (self.attained_service_gpu_s, self.time_since_last_run_s, self.last_run_s)
        )

    def specs(self) -> list[JobSpec]:
        return [
            JobSpec(
                id=job_id, steps_remaining=steps, job_type=job_type, scale_factor=sf, priority_weight=weight,
                time_since_arrival_s=waited, slo_s=slo, isolated_time_s=isolated,
                attained_service_gpu_s=attained, time_since_last_run_s=since_run, last_run_s=last_run,
            )
            for job_id, job_type, sf, weight, steps, waited, slo, isolated, attained, since_run, last_run in zip(
                self.ids, self.job_types, self.scale_factors, self.priority_weights, self.steps_remaining,
                self.time_since_arrival_s, self.slo_s, self.isolated_time_s, *self.service(), strict=True,
            )
        ]

    @staticmethod
    def of(jobs: Sequence[JobSpec]) -> AdmittedJobs | None:
        """The jobs column by column, or None when one brings what the shortcut leaves to the
        checks (its own throughputs, an entity, a colocation class)."""
        if any(j.throughputs_steps_per_s is not None or j.entity is not None or j.colocation_class != "" for j in jobs):
            return None
        return AdmittedJobs(
            tuple(j.id for j in jobs), tuple(j.job_type for j in jobs), tuple(j.scale_factor for j in jobs),  # type: ignore[misc]
            tuple(j.priority_weight for j in jobs), tuple(j.steps_remaining for j in jobs),
            tuple(j.time_since_arrival_s for j in jobs), tuple(j.slo_s for j in jobs),
            tuple(j.isolated_time_s for j in jobs), tuple(j.attained_service_gpu_s for j in jobs),
            tuple(j.time_since_last_run_s for j in jobs), tuple(j.last_run_s for j in jobs),
        )


def admitted_columns(
    jobs: AdmittedJobs, worker_types: tuple[str, ...], counts: np.ndarray, table: ThroughputTable,
) -> Columns | None:
    """The per-job arrays of admitted jobs (build_problem's ``admitted``), column by column, or
    None when anything needs the job-by-job checks: an id or key of another type, a repeated
    id, a key the table lacks, a value out of range, a job that cannot run."""
    num_jobs, num_types = len(jobs), len(worker_types)
    ids, job_types, scale_factors_given = jobs.ids, jobs.job_types, jobs.scale_factors
    if not _all_of_type(ids, str) or not _all_of_type(job_types, str) or not _all_of_type(scale_factors_given, int):
        return None
    seen = dict(zip(ids, range(num_jobs)))
    if len(seen) != num_jobs:
        return None
    table_rows, runnable = _table_rows(table, worker_types)
    rows = []
    for key in zip(job_types, scale_factors_given):
        row = table_rows.get(key)
        if row is None:
            if not table.has_job(*key):
                return None
            row = table_rows[key] = tuple(float(table.isolated(key[0], key[1], w)) for w in worker_types)
        rows.append(row)
    numbers = (jobs.steps_remaining, jobs.time_since_arrival_s, jobs.isolated_time_s, *jobs.service())
    if not all(_all_numbers(column) for column in numbers):
        return None
    try:
        values = np.array(numbers, dtype=float).reshape(6, num_jobs)
    except OverflowError:  # an int beyond any float: out of range
        return None
    # In range, as one array (a NaN fails both comparisons, an infinity the upper one); each
    # limit is a float exactly, and an int column's values compare as the ints do below 2**53,
    # above every limit.
    if not ((values >= 0.0) & (values <= _LIMITS)).all():
        return None
    # Each job can run somewhere (a type with enough GPUs where it has a throughput): a property
    # of its key and the counts, answered once and kept with the table's rows.
    counts_key = tuple(counts.tolist())
    for key, row in zip(zip(job_types, scale_factors_given), rows):
        runs = runnable.get((key, counts_key))
        if runs is None:
            runs = runnable[key, counts_key] = any(count >= key[1] and steps_per_s > 0 for count, steps_per_s in zip(counts_key, row))
        if not runs:
            return None
    # (flat from the rows: half the time of np.array on a list of tuples)
    throughputs = np.fromiter(itertools.chain.from_iterable(rows), float, num_jobs * num_types).reshape(num_jobs, num_types)
    scale_factors = np.array(scale_factors_given, dtype=np.int64)
    slo = np.array([np.nan if v is None else float(v) for v in jobs.slo_s], dtype=float)
    weights = np.array([float(v) for v in jobs.priority_weights], dtype=float)
    return (
        throughputs, scale_factors, weights, values[0].copy(), values[1].copy(), slo, values[2].copy(),
        np.full(num_jobs, -1, dtype=np.int64), seen, values[3:].copy(),
    )


# The upper bound of each of admitted_columns' six number columns, as a (6, 1) column
_LIMITS = np.array([MAX_TOTAL_STEPS, MAX_TIME_S, MAX_TIME_S, MAX_SERVICE_GPU_S, MAX_TIME_S, MAX_TIME_S], dtype=float)[:, None]


def _all_of_type(values: Sequence[object], kind: type) -> bool:
    """Every value exactly of ``kind`` (a bool is not an int here, nor a numpy scalar a float)."""
    return set(map(type, values)) <= {kind}


def _all_numbers(values: Sequence[object]) -> bool:
    return set(map(type, values)) <= {float, int}


# The rows of the table last read, by (job type, scale factor), for the worker types of the
# problem, and whether each key runs on given counts: a simulation's hundreds of problems look up
# the same few dozen keys on one cluster (the table is read-only; one held weakly, so a new table
# is read afresh).
_ROWS_CACHE: list[tuple[weakref.ref, tuple[str, ...], dict[tuple[str, int], tuple[float, ...]], dict[tuple, bool]]] = []


def _table_rows(
    table: ThroughputTable, worker_types: tuple[str, ...]
) -> tuple[dict[tuple[str, int], tuple[float, ...]], dict[tuple, bool]]:
    for ref, types, rows, runnable in _ROWS_CACHE:
        if ref() is table and types == worker_types:
            return rows, runnable
    rows, runnable = {}, {}
    _ROWS_CACHE.insert(0, (weakref.ref(table), worker_types, rows, runnable))
    del _ROWS_CACHE[4:]
    return rows, runnable
