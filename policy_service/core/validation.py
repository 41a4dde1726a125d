"""build_problem: the one validated constructor of a Problem.

Every check names the JSON path of the offending field, so the CLI prints one line and exits 2:
ids unique; scale factors integers that fit on some worker type; throughputs finite, >= 0 and
positive on some type that fits the gang; weights, steps, times, SLOs and prices in range;
entities and pairs that refer to what exists. Throughputs and pairs missing from the input come
from Gavel's throughput table when one is given. Packing comes from, in order of precedence:
pairs listed job by job, class colocations (an estimator's fractions per pair of colocation
classes, applied to each job's own row), the table, or nowhere; colocation.py builds each.

A job's own fields are checked by common/job_checks.py, the same function `gavel submit` and the
mechanism use, so a job they accept is never refused here for its fields. An error that is one
job's fault carries its id (``ProblemError.job_ids``): the mechanism sets that job aside and
solves again rather than failing every solve. The simulator's own jobs skip what was checked when
it admitted them (admitted.py).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping, Sequence

import numpy as np

from common.errors import ProblemError
from common.job_checks import (
    MAX_TIME_S,
    MAX_TOTAL_STEPS,
    check_integer,
    check_job,
    check_number,
)
from common.throughputs import ThroughputTable
from policy_service.core.admitted import (
    MAX_SERVICE_GPU_S,
    AdmittedJobs,
    Columns,
    admitted_columns,
)
from policy_service.core.colocation import (
    colocation_from_classes,
    colocation_from_pairs,
    colocation_from_table,
    validate_colocations,
)
from policy_service.core.previous import previous_allocation
from policy_service.core.problem import (
    ENTITY_POLICIES,
    AllocationEntry,
    ClassPairSpec,
    Colocation,
    Entity,
    JobSpec,
    PairSpec,
    Problem,
    _readonly,
)


def build_problem(
    worker_counts: Mapping[str, int],
    jobs: Sequence[JobSpec] | AdmittedJobs,
    *,
    pairs: Sequence[PairSpec] | None = None,
    entities: Sequence[Entity] = (),
    prices_per_hour: Mapping[str, float] | None = None,
    table: ThroughputTable | None = None,
    previous: Sequence[AllocationEntry] | None = None,
    policy_state: str | None = None,
    colocations: Sequence[ClassPairSpec] | None = None,
    admitted: bool = False,
) -> Problem:
    """Validate and assemble a Problem.

    Throughputs missing from a job come from ``table`` (by job type and scale factor); a job
    that gives its own is not looked up, so its job type may be unknown to the table. Pairs:
    ``pairs`` when given (job by job; ``[]`` means no packing), else ``colocations`` when given
    (two different jobs with one scale factor whose colocation classes are listed together, each
    at its own throughputs times its class's fraction; ``[]`` means no packing), else every pair
    of jobs with the same scale factor whose job types the table lists together (Gavel's
    behaviour), else none. ``previous`` entries naming jobs not in the problem (finished since)
    are ignored.

    ``admitted``: the jobs come from a caller in this process that admitted them itself (the
    simulator's mechanism): each job's own fields passed common/job_checks.py at admission, the
    check made here, and cannot change since, so they are not checked again (admitted.py).
    Everything else still is: the computed values (steps left, times) and whether each job can
    run, vectorised; on any doubt, and for any input but the simulator's (throughputs of the
    jobs' own, entities, class colocations), the checks below run job by job, so an error is
    the one they raise. The problem is the same either way (tests/unit/policy/test_admitted_problem.py).
    """
    worker_types, counts = _validate_worker_types(worker_counts, table)
    num_types = len(worker_types)
    class_pairs = None if colocations is None else validate_colocations(colocations, worker_types)
    entity_list = _validate_entities(entities)
    entity_index = {entity.name: e for e, entity in enumerate(entity_list)}

    num_jobs = len(jobs)
    shortcut = jobs if isinstance(jobs, AdmittedJobs) else AdmittedJobs.of(jobs) if admitted else None
    columns = None
    if admitted and shortcut is not None and class_pairs is None and not entity_list and table is not None:
        columns = admitted_columns(shortcut, worker_types, counts, table)
    if columns is None:
        specs = jobs.specs() if isinstance(jobs, AdmittedJobs) else jobs
        columns = _checked_columns(specs, worker_types, counts, table, entity_index, class_pairs is not None)
    throughputs, scale_factors, weights, steps, waited, slo, isolated_time, entity_of_job, seen, service = columns

    if shortcut is not None:
        job_ids, job_types, colocation_classes = shortcut.ids, shortcut.job_types, ("",) * num_jobs
    else:
        job_ids = tuple(job.id for job in jobs)  # type: ignore[union-attr]
        job_types = tuple(job.job_type for job in jobs)  # type: ignore[union-attr]
        colocation_classes = tuple(job.colocation_class for job in jobs)  # type: ignore[union-attr]
    if pairs is not None:
        colocation = colocation_from_pairs(pairs, seen, scale_factors, worker_types)
        source = "pairs"
    elif class_pairs is not None:
        colocation = colocation_from_classes(colocation_classes, scale_factors, throughputs, class_pairs, worker_types)
        source = "classes"
    elif table is not None:
        colocation = colocation_from_table(job_types, scale_factors, worker_types, table)
        source = "table"
    else:
        colocation = Colocation.empty(num_jobs, num_types)
        source = "none"

    return Problem(
        worker_types=worker_types,
        worker_counts=_readonly(counts),
        job_ids=job_ids,
        job_types=job_types,
        scale_factors=_readonly(scale_factors),
        priority_weights=_readonly(weights),
        throughputs_steps_per_s=_readonly(throughputs),
        steps_remaining=_readonly(steps),
        time_since_arrival_s=_readonly(waited),
        slo_s=_readonly(slo),
        isolated_time_s=_readonly(isolated_time),
        entity_of_job=_readonly(entity_of_job),
        entities=entity_list,
        colocation=colocation,
        prices_per_hour=_validate_prices(prices_per_hour, worker_types, counts),
        previous=previous_allocation(previous, seen, worker_types),
        colocation_source=source,
        policy_state=policy_state,
        colocation_classes=colocation_classes if any(colocation_classes) else (),
        class_colocations=class_pairs,
        attained_service_gpu_s=_readonly(service[0]),
        time_since_last_run_s=_readonly(service[1]),
        last_run_s=_readonly(service[2]),
    )


def _checked_columns(
    jobs: Sequence[JobSpec], worker_types: tuple[str, ...], counts: np.ndarray, table: ThroughputTable | None,
    entity_index: Mapping[str, int], colocations_given: bool,
) -> Columns:
    """The per-job arrays, every field of every job checked in order: the first error is the
    first job's first bad field."""
    num_jobs, num_types = len(jobs), len(worker_types)
    throughputs = np.zeros((num_jobs, num_types))
    scale_factors = np.zeros(num_jobs, dtype=np.int64)
    weights = np.zeros(num_jobs)
    steps = np.zeros(num_jobs)
    waited = np.zeros(num_jobs)
    slo = np.full(num_jobs, np.nan)
    isolated_time = np.zeros(num_jobs)
    entity_of_job = np.full(num_jobs, -1, dtype=np.int64)
    service: list[tuple[float, float, float]] = []  # attained GPU-seconds, since the last run, the last run
    seen: dict[str, int] = {}
    table_rows: dict[tuple[str, int], tuple[float, ...]] = {}  # the table looked up once per job key
    count_list = counts.tolist()
    for i, job in enumerate(jobs):
        path = f"jobs[{i}]"
        try:
            _check_job(job, path, entity_index)
            if job.id in seen:
                raise ProblemError(f"{path}.id: duplicate job id {job.id!r} (also jobs[{seen[job.id]}])")
            scale_factors[i] = int(job.scale_factor)
            weights[i] = float(job.priority_weight)
            steps[i] = check_number(job.steps_remaining, f"{path}.steps_remaining", maximum=MAX_TOTAL_STEPS)
            waited[i] = check_number(job.time_since_arrival_s, f"{path}.time_since_arrival_s", maximum=MAX_TIME_S)
            isolated_time[i] = check_number(job.isolated_time_s, f"{path}.isolated_time_s", maximum=MAX_TIME_S)
            service.append(_service(job, path))
            if job.slo_s is not None:
                slo[i] = float(job.slo_s)
            if job.entity is not None:
                entity_of_job[i] = entity_index[job.entity]
            _check_colocation_class(job, path, colocations_given)
            row = _job_throughputs(job, path, worker_types, table, table_rows)
            throughputs[i] = row
            _check_runnable(path, job, int(scale_factors[i]), row, count_list)
        except ProblemError as e:
            # This job alone is at fault: say which, so a caller can set it aside and solve the rest.
            raise ProblemError(str(e), job_ids=(job.id,) if isinstance(job.id, str) else ()) from None
        seen[job.id] = i
    service_columns = np.array(service, dtype=float).reshape(num_jobs, 3).T.copy()
    return throughputs, scale_factors, weights, steps, waited, slo, isolated_time, entity_of_job, seen, service_columns


def _service(job: JobSpec, path: str) -> tuple[float, float, float]:
    """What the job has run, checked: plain floats in range as they are (what a mechanism sends,
    without building three field paths a job), anything else through check_number."""
    attained, since_s, last_s = job.attained_service_gpu_s, job.time_since_last_run_s, job.last_run_s
    if (
        # (exactly float: anything else, a bool or a numpy scalar, goes through check_number)
        type(attained) is float and type(since_s) is float and type(last_s) is float
        and 0.0 <= attained <= MAX_SERVICE_GPU_S and 0.0 <= since_s <= MAX_TIME_S and 0.0 <= last_s <= MAX_TIME_S
    ):
        return attained, since_s, last_s
    return (
        check_number(attained, f"{path}.attained_service_gpu_s", maximum=MAX_SERVICE_GPU_S),
        check_number(since_s, f"{path}.time_since_last_run_s", maximum=MAX_TIME_S),
        check_number(last_s, f"{path}.last_run_s", maximum=MAX_TIME_S),
    )


def _check_job(job: JobSpec, path: str, entity_index: Mapping[str, int]) -> None:
    """The fields every caller checks the same way (common/job_checks.py), then what only a
    problem knows: the entity must be one of the problem's."""
    check_job(
        job_id=job.id, job_type=job.job_type, scale_factor=job.scale_factor,
        priority_weight=job.priority_weight, slo_s=job.slo_s, entity=job.entity, path=f"{path}.", id_field="id",
    )
    if job.entity is not None and job.entity not in entity_index:
        known = ", ".join(sorted(entity_index)) or "none defined"
        raise ProblemError(f"{path}.entity: unknown entity {job.entity!r} (entities: {known})")


# Clusters whose counts passed _validate_worker_types' shortcut: (name, count) items -> (the table
# they were checked against, held weakly; names; counts, read-only). A simulation asks about one.
_KNOWN_CLUSTERS: dict[tuple[tuple[str, int], ...], tuple[weakref.ref, tuple[str, ...], np.ndarray]] = {}


def _validate_worker_types(
    worker_counts: Mapping[str, int], table: ThroughputTable | None
) -> tuple[tuple[str, ...], np.ndarray]:
    if not isinstance(worker_counts, Mapping) or not worker_counts:
        raise ProblemError("worker_types: expected a non-empty object of worker type -> GPU count")
    if table is not None and set(map(type, worker_counts.values())) == {int}:
        # Plain counts (every request of a simulation): the same cluster's answer kept (the
        # counts are ints, so the items are the key; the array is read-only, as a Problem's)
        items = tuple(worker_counts.items())
        known = _KNOWN_CLUSTERS.get(items)
        if known is not None and known[0]() is table:
            return known[1], known[2]
        if (
            min(worker_counts.values()) >= 0 and worker_counts.keys() <= set(table.accelerator_types)
            and sum(worker_counts.values()) > 0
        ):
            # Counts of known types: what the loop below accepts, without its per-type checks
            # (a known type's name is a non-empty string).
            counts = _readonly(np.asarray(list(worker_counts.values()), dtype=float))
            if len(_KNOWN_CLUSTERS) >= 16:
                _KNOWN_CLUSTERS.clear()
            _KNOWN_CLUSTERS[items] = (weakref.ref(table), tuple(worker_counts), counts)
            return tuple(worker_counts), counts
    names = []
    counts = []
    for name, count in worker_counts.items():
        if not isinstance(name, str) or not name:
            raise ProblemError(f"worker_types: {name!r} is not a worker type name")
        counts.append(check_integer(count, f"worker_types.{name}", minimum=0))
        names.append(name)
        if table is not None and name not in table.accelerator_types:
            raise ProblemError(
                f"worker_types.{name}: not in the throughput table "
                f"(known: {', '.join(table.accelerator_types)})"
            )
    array = np.asarray(counts, dtype=float)
    if array.sum() <= 0:
        raise ProblemError("worker_types: the cluster has no GPUs (every count is 0)")
    return tuple(names), array


def _validate_entities(entities: Sequence[Entity]) -> tuple[Entity, ...]:
    names: set[str] = set()
    for entity in entities:
        path = f"entities.{entity.name}"
        if not isinstance(entity.name, str) or not entity.name:
            raise ProblemError(f"entities: {entity.name!r} is not an entity name")
        if entity.name in names:
            raise ProblemError(f"{path}: duplicate entity")
        names.add(entity.name)
        check_number(entity.weight, f"{path}.weight", strict=True)
        if entity.policy not in ENTITY_POLICIES:
            raise ProblemError(f"{path}.policy: must be one of {', '.join(ENTITY_POLICIES)}, got {entity.policy!r}")
    return tuple(Entity(e.name, float(e.weight), e.policy) for e in entities)


def _check_colocation_class(job: JobSpec, path: str, colocations_given: bool) -> None:
    """A job's class is a string; with class colocations, a job that has one must bring its own
    throughputs: the fractions scale the job's own measured row, and a table row stands for a
    whole job type, not for this job."""
    if not isinstance(job.colocation_class, str):
        raise ProblemError(f"{path}.colocation_class: expected a string, got {type(job.colocation_class).__name__}")
    if colocations_given and job.colocation_class and job.throughputs_steps_per_s is None:
        raise ProblemError(
            f"{path}.throughputs: required for a job with a colocation class "
            f"({job.colocation_class!r}) when colocations are given"
        )


def _job_throughputs(
    job: JobSpec, path: str, worker_types: tuple[str, ...], table: ThroughputTable | None,
    table_rows: dict[tuple[str, int], tuple[float, ...]],
) -> tuple[float, ...]:
    """The job's steps/s per worker type: its own, or the table's row (kept in ``table_rows`` by
    (job type, scale factor), so that the jobs of one key look the table up once)."""
    # The table is consulted only for a job without its own throughputs: a job that brings them
    # may be of a type (or a scale factor) the table has never seen, e.g. a user's own script.
    if job.throughputs_steps_per_s is None and (job.job_type, job.scale_factor) in table_rows:
        return table_rows[job.job_type, job.scale_factor]  # type: ignore[index]  # checked when stored
    if table is not None and job.throughputs_steps_per_s is None:
        if job.job_type is None:
            raise ProblemError(f"{path}.job_type: required when a throughput table is given")
        if not table.has_job(job.job_type, int(job.scale_factor)):
            if job.job_type not in table.job_types:
                raise ProblemError(f"{path}.job_type: unknown job type {job.job_type!r} (not in the throughput table)")
            raise ProblemError(
                f"{path}.scale_factor: the throughput table has no {job.job_type!r} "
                f"with scale factor {job.scale_factor}"
            )
    given = job.throughputs_steps_per_s
    if given is None:
        if table is None:
            raise ProblemError(f"{path}.throughputs: required (no throughput table given)")
        job_type = str(job.job_type)
        row = tuple(float(table.isolated(job_type, int(job.scale_factor), name)) for name in worker_types)
        if isinstance(job.job_type, str) and type(job.scale_factor) is int:  # the key of a later hit
            table_rows[job.job_type, job.scale_factor] = row
        return row
    if not isinstance(given, Mapping):
        raise ProblemError(f"{path}.throughputs: expected an object of worker type -> steps/s")
    for name in given:
        if name not in worker_types:
            raise ProblemError(f"{path}.throughputs.{name}: not a worker type of this cluster")
    row = []
    for name in worker_types:
        if name not in given:
            raise ProblemError(f"{path}.throughputs: missing worker type {name!r}")
        row.append(float(check_number(given[name], f"{path}.throughputs.{name}")))
    return tuple(row)


def _check_runnable(
    path: str, job: JobSpec, scale_factor: int, throughputs: tuple[float, ...], counts: list[float]
) -> None:
    # In Python, not numpy: two small array reductions per job cost more than the job's other
    # checks together (tens of jobs a problem, hundreds of problems a simulation).
    fits = [k for k, count in enumerate(counts) if count >= scale_factor]
    if not fits:
        raise ProblemError(
            f"{path}.scale_factor: {scale_factor} GPUs is more than any worker type has "
            f"(largest: {int(max(counts))})"
        )
    if not any(throughputs[k] > 0 for k in fits):
        raise ProblemError(
            f"{path}.throughputs: job {job.id!r} has zero throughput on every worker type "
            f"with at least {scale_factor} GPUs, so it can never run"
        )


def _validate_prices(
    prices: Mapping[str, float] | None, worker_types: tuple[str, ...], counts: np.ndarray
) -> np.ndarray | None:
    if prices is None:
        return None
    if not isinstance(prices, Mapping):
        raise ProblemError("prices_per_hour: expected an object of worker type -> $ per GPU-hour")
    if prices.keys() >= set(worker_types):
        given = [prices[name] for name in worker_types]
        if set(map(type, given)) == {float} and all(0.0 < v < math.inf for v in given):
            return _readonly(np.array(given, dtype=float))  # plain positive prices of every type
    values = np.zeros(len(worker_types))
    for k, name in enumerate(worker_types):
        if name in prices:
            values[k] = check_number(prices[name], f"prices_per_hour.{name}", strict=True)
        elif counts[k] > 0:
            raise ProblemError(f"prices_per_hour: missing worker type {name!r}")
    return _readonly(values)
