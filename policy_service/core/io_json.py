"""The documented JSON formats of a policy problem and of an allocation (docs/policies.md).

Pure: dicts in, dicts out (the caller does ``json.load`` / ``json.dump``). A CLI needs three
lines:

    problem = problem_from_json(json.load(file), table)        # ProblemError on bad input
    allocation = make_policy(name).allocate(problem)            # UnknownPolicyError
    json.dump(allocation_to_json(allocation), out)

Every error is a ProblemError whose message is one line starting with the field's JSON path.
Unknown fields are refused (a typo must not pass silently).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from common.errors import ProblemError
from common.throughputs import ThroughputTable
from policy_service.core.allocation import NOISE_FRACTION, Allocation, PairShares, Status, _readonly, expand_pairs
from policy_service.core.problem import AllocationEntry, ClassPairSpec, Entity, JobSpec, PairSpec, Problem
from policy_service.core.validation import build_problem

_TOP_FIELDS = {"worker_types", "jobs", "pairs", "colocations", "entities", "prices_per_hour", "previous_allocation"}
_JOB_FIELDS = {
    "id", "job_type", "scale_factor", "priority_weight", "throughputs", "steps_remaining",
    "time_since_arrival_s", "slo_s", "entity", "isolated_time_s", "colocation_class",
    "attained_service_gpu_s", "time_since_last_run_s", "last_run_s",
}
_REQUIRED_JOB_FIELDS = ("id", "steps_remaining")


def _object(value: object, path: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise ProblemError(f"{path}: expected an object, got {_kind(value)}")
    return value


def _list(value: object, path: str) -> Sequence[object]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ProblemError(f"{path}: expected a list, got {_kind(value)}")
    return value


def _kind(value: object) -> str:
    return {type(None): "null", bool: "a boolean", str: "a string", list: "a list", dict: "an object"}.get(
        type(value), type(value).__name__
    )


def _no_unknown(data: Mapping[str, object], allowed: set[str], path: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        where = f"{path}." if path else ""
        raise ProblemError(f"{where}{unknown[0]}: unknown field (allowed: {', '.join(sorted(allowed))})")


def _string(value: object, path: str, *, nullable: bool = False) -> str | None:
    if value is None and nullable:
        return None
    if not isinstance(value, str):
        raise ProblemError(f"{path}: expected a string, got {_kind(value)}")
    return value


def _num(value: object, path: str, *, nullable: bool = False) -> float | None:
    """A JSON number (the range is checked by build_problem, which names the same path)."""
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProblemError(f"{path}: expected a number, got {_kind(value)}")
    return value  # type: ignore[return-value]


def _int(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ProblemError(f"{path}: expected an integer, got {value!r}")
    return value


def _job(data: object, i: int) -> JobSpec:
    path = f"jobs[{i}]"
    job = _object(data, path)
    _no_unknown(job, _JOB_FIELDS, path)
    for name in _REQUIRED_JOB_FIELDS:
        if name not in job:
            raise ProblemError(f"{path}.{name}: required")
    throughputs = job.get("throughputs")
    if throughputs is not None:
        throughputs = {
            str(k): _num(v, f"{path}.throughputs.{k}") for k, v in _object(throughputs, f"{path}.throughputs").items()
        }
    return JobSpec(
        id=_string(job["id"], f"{path}.id"),  # type: ignore[arg-type]
        steps_remaining=_num(job["steps_remaining"], f"{path}.steps_remaining"),  # type: ignore[arg-type]
        job_type=_string(job.get("job_type"), f"{path}.job_type", nullable=True),
        scale_factor=_int(job.get("scale_factor", 1), f"{path}.scale_factor"),
        priority_weight=_num(job.get("priority_weight", 1.0), f"{path}.priority_weight"),  # type: ignore[arg-type]
        throughputs_steps_per_s=throughputs,  # type: ignore[arg-type]
        time_since_arrival_s=_num(  # type: ignore[arg-type]
            job.get("time_since_arrival_s", 0.0), f"{path}.time_since_arrival_s"
        ),
        slo_s=_num(job.get("slo_s"), f"{path}.slo_s", nullable=True),
        entity=_string(job.get("entity"), f"{path}.entity", nullable=True),
        isolated_time_s=_num(job.get("isolated_time_s", 0.0), f"{path}.isolated_time_s"),  # type: ignore[arg-type]
        colocation_class=_string(job.get("colocation_class", ""), f"{path}.colocation_class"),  # type: ignore[arg-type]
        **{
            name: _num(job.get(name, 0.0), f"{path}.{name}")
            for name in ("attained_service_gpu_s", "time_since_last_run_s", "last_run_s")
        },
    )


def _pair(data: object, p: int) -> PairSpec:
    path = f"pairs[{p}]"
    pair = _object(data, path)
    _no_unknown(pair, {"jobs", "throughputs"}, path)
    jobs = _list(pair.get("jobs"), f"{path}.jobs")
    if len(jobs) != 2:
        raise ProblemError(f"{path}.jobs: expected exactly two job ids, got {len(jobs)}")
    ids = tuple(_string(job_id, f"{path}.jobs[{i}]") for i, job_id in enumerate(jobs))
    throughputs = _by_type_pairs(pair.get("throughputs"), f"{path}.throughputs", "[first job's, second job's] steps/s")
    return PairSpec(ids, throughputs)  # type: ignore[arg-type]


def _by_type_pairs(data: object, path: str, expected: str) -> dict[str, tuple[float, float]]:
    """``{type: [first's, second's]}`` with every number checked, naming its path."""
    out = {}
    for name, value in _object(data, path).items():
        values = _list(value, f"{path}.{name}")
        if len(values) != 2:
            raise ProblemError(f"{path}.{name}: expected {expected}")
        out[str(name)] = (_num(values[0], f"{path}.{name}[0]"), _num(values[1], f"{path}.{name}[1]"))
    return out  # type: ignore[return-value]


def _colocation(data: object, c: int) -> ClassPairSpec:
    path = f"colocations[{c}]"
    entry = _object(data, path)
    _no_unknown(entry, {"classes", "fractions"}, path)
    classes = _list(entry.get("classes"), f"{path}.classes")
    if len(classes) != 2:
        raise ProblemError(f"{path}.classes: expected exactly two class names, got {len(classes)}")
    names = tuple(_string(name, f"{path}.classes[{i}]") for i, name in enumerate(classes))
    fractions = _by_type_pairs(entry.get("fractions"), f"{path}.fractions", "[first class's, second class's] fractions")
    return ClassPairSpec(names, fractions)  # type: ignore[arg-type]


def _entities(data: object) -> list[Entity]:
    entities = []
    for name, value in _object(data, "entities").items():
        path = f"entities.{name}"
        entity = _object(value, path)
        _no_unknown(entity, {"weight", "policy"}, path)
        entities.append(
            Entity(
                name=str(name),
                weight=_num(entity.get("weight", 1.0), f"{path}.weight"),  # type: ignore[arg-type]
                policy=_string(entity.get("policy", "fairness"), f"{path}.policy"),  # type: ignore[arg-type]
            )
        )
    return entities


def _entries(data: object, path: str) -> list[AllocationEntry]:
    entries = []
    for e, value in enumerate(_list(data, path)):
        where = f"{path}[{e}]"
        entry = _object(value, where)
        _no_unknown(entry, {"jobs", "fractions"}, where)
        jobs = tuple(_string(j, f"{where}.jobs[{i}]") for i, j in enumerate(_list(entry.get("jobs"), f"{where}.jobs")))
        fractions = {
            str(k): _num(v, f"{where}.fractions.{k}")
            for k, v in _object(entry.get("fractions"), f"{where}.fractions").items()
        }
        entries.append(AllocationEntry(jobs, fractions))  # type: ignore[arg-type]
    return entries


def problem_from_json(
    data: object,
    table: ThroughputTable | None = None,
    *,
    default_prices_per_hour: Mapping[str, float] | None = None,
) -> Problem:
    """Parse and validate the problem format. ``table`` fills omitted throughputs and pairs;
    ``default_prices_per_hour`` is used when the problem has no ``prices_per_hour`` (the shipped
    common/data/prices.json, read by the caller)."""
    top = _object(data, "problem")
    _no_unknown(top, _TOP_FIELDS, "")
    if "worker_types" not in top:
        raise ProblemError("worker_types: required")
    if "jobs" not in top:
        raise ProblemError("jobs: required")
    worker_counts = {
        str(name): _int(count, f"worker_types.{name}")
        for name, count in _object(top["worker_types"], "worker_types").items()
    }
    jobs = [_job(job, i) for i, job in enumerate(_list(top["jobs"], "jobs"))]
    pairs = None
    if top.get("pairs") is not None:
        pairs = [_pair(pair, p) for p, pair in enumerate(_list(top["pairs"], "pairs"))]
    colocations = None
    if top.get("colocations") is not None:
        colocations = [_colocation(entry, c) for c, entry in enumerate(_list(top["colocations"], "colocations"))]
    entities = _entities(top["entities"]) if top.get("entities") is not None else []
    prices = top.get("prices_per_hour")
    if prices is not None:
        prices = {str(k): _num(v, f"prices_per_hour.{k}") for k, v in _object(prices, "prices_per_hour").items()}
    elif default_prices_per_hour is not None:
        prices = dict(default_prices_per_hour)
    previous = None
    if top.get("previous_allocation") is not None:
        previous = _entries(top["previous_allocation"], "previous_allocation")
    return build_problem(
        worker_counts, jobs, pairs=pairs, entities=entities, prices_per_hour=prices,  # type: ignore[arg-type]
        table=table, previous=previous, colocations=colocations,
    )


def prices_from_json(data: object) -> dict[str, float]:
    """$ per GPU-hour by worker type, from common/data/prices.json (or a plain mapping)."""
    top = _object(data, "prices")
    table = top.get("prices_per_hour", top)
    prices = {}
    for name, value in _object(table, "prices_per_hour").items():
        number = _num(value, f"prices_per_hour.{name}")
        if not math.isfinite(number) or number <= 0:  # type: ignore[arg-type]
            raise ProblemError(f"prices_per_hour.{name}: must be a finite number > 0, got {value!r}")
        prices[str(name)] = float(number)  # type: ignore[arg-type]
    return prices


def _clean(value: float) -> float:
    return 0.0 if abs(value) < NOISE_FRACTION else float(value)


def _fractions(row: np.ndarray, worker_types: Sequence[str], *, exact: bool = False) -> dict[str, float]:
    """Worker type -> value; fractions below NOISE_FRACTION (solver noise) are written as 0."""
    values = row.tolist() if isinstance(row, np.ndarray) else row  # Python floats: the same values, read faster
    return {name: float(values[k]) if exact else _clean(values[k]) for k, name in enumerate(worker_types)}


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def problem_to_json(problem: Problem) -> dict[str, object]:
    """The problem in its JSON format (throughputs always explicit). Pairs are written when the
    problem listed them job by job, class colocations when it had them (with each job's class);
    table-derived pairs are left to the table (parse with it)."""
    jobs = []
    service = problem.service_columns()
    for j, job_id in enumerate(problem.job_ids):
        entity = problem.entities[problem.entity_of_job[j]].name if problem.entity_of_job[j] >= 0 else None
        slo = problem.slo_s[j]
        jobs.append({
            "id": job_id,
            "job_type": problem.job_types[j],
            "scale_factor": int(problem.scale_factors[j]),
            "priority_weight": float(problem.priority_weights[j]),
            "throughputs": _fractions(problem.throughputs_steps_per_s[j], problem.worker_types, exact=True),
            "steps_remaining": float(problem.steps_remaining[j]),
            "time_since_arrival_s": float(problem.time_since_arrival_s[j]),
            "slo_s": None if np.isnan(slo) else float(slo),
            "entity": entity,
            "isolated_time_s": float(problem.isolated_time_s[j]),
        })
        if problem.colocation_classes and problem.colocation_classes[j]:
            jobs[-1]["colocation_class"] = problem.colocation_classes[j]
        for name, column in zip(("attained_service_gpu_s", "time_since_last_run_s", "last_run_s"), service):
            if column[j]:  # written when given, so inputs written before them round-trip unchanged
                jobs[-1][name] = float(column[j])
    out: dict[str, object] = {
        "worker_types": {name: int(problem.worker_counts[k]) for k, name in enumerate(problem.worker_types)},
        "jobs": jobs,
    }
    if problem.colocation_source == "pairs":
        colocation = problem.colocation
        out["pairs"] = [
            {
                "jobs": [problem.job_ids[a], problem.job_ids[b]],
                "throughputs": {
                    name: [float(value) for value in colocation.throughputs_steps_per_s[p, k]]
                    for k, name in enumerate(problem.worker_types)
                },
            }
            for p, (a, b) in enumerate(colocation.key_pairs.tolist())
        ]
    if problem.class_colocations is not None:
        # As given (not the derived key pairs): each job's row times these fractions gives the
        # packed steps/s again, and a self pair is symmetrised again on reading.
        out["colocations"] = [
            {"classes": list(entry.classes), "fractions": {name: list(v) for name, v in entry.fractions.items()}}
            for entry in problem.class_colocations
        ]
    if problem.entities:
        out["entities"] = {e.name: {"weight": e.weight, "policy": e.policy} for e in problem.entities}
    if problem.prices_per_hour is not None:
        out["prices_per_hour"] = _fractions(problem.prices_per_hour, problem.worker_types, exact=True)
    if problem.previous is not None:
        previous = problem.previous
        entries = [
            {"jobs": [problem.job_ids[j]], "fractions": _fractions(previous.job_fractions[j], problem.worker_types)}
            for j in range(problem.num_jobs) if previous.job_fractions[j].any()
        ]
        entries += [
            {
                "jobs": [problem.job_ids[a], problem.job_ids[b]],
                "fractions": _fractions(previous.pair_fractions[p], problem.worker_types),
            }
            for p, (a, b) in enumerate(previous.pair_jobs.tolist())
        ]
        out["previous_allocation"] = entries
    return out


def allocation_to_json(allocation: Allocation) -> dict[str, object]:
    """The allocation format: one entry per job (its time alone) and one per packed job pair
    (grouped pair time expanded to concrete pairs, allocation.expand_pairs)."""
    entries: list[dict[str, object]] = [
        {"jobs": [job_id], "fractions": _fractions(allocation.job_fractions[j], allocation.worker_types)}
        for j, job_id in enumerate(allocation.job_ids)
    ]
    pair_jobs, pair_fractions = expand_pairs(allocation.pairs)
    entries += [
        {
            "jobs": [allocation.job_ids[a], allocation.job_ids[b]],
            "fractions": _fractions(pair_fractions[p], allocation.worker_types),
        }
        for p, (a, b) in enumerate(pair_jobs.tolist())
    ]
    out: dict[str, object] = {
        "policy": allocation.policy,
        "status": str(allocation.status),
        "objective": _finite_or_none(allocation.objective),
        "solve_time_s": float(allocation.solve_time_s),
        "allocation": entries,
    }
    if allocation.reason:
        out["reason"] = allocation.reason
    return out


def allocation_from_json(data: object, problem: Problem) -> Allocation:
    """Parse the allocation format back (pairs become groups of one) for ``problem``'s jobs."""
    top = _object(data, "allocation")
    _no_unknown(top, {"policy", "status", "objective", "solve_time_s", "allocation", "reason"}, "")
    try:
        status = Status(_string(top.get("status"), "status"))
    except ValueError:
        known = ", ".join(s.value for s in Status)
        raise ProblemError(f"status: must be one of {known}, got {top.get('status')!r}") from None
    singles = np.zeros((problem.num_jobs, problem.num_types))
    pair_jobs, pair_fractions = [], []
    for e, entry in enumerate(_entries(top.get("allocation", []), "allocation")):
        row = np.zeros(problem.num_types)
        for name, value in entry.fractions.items():
            if name not in problem.worker_types:
                raise ProblemError(f"allocation[{e}].fractions.{name}: not a worker type of this cluster")
            row[problem.worker_types.index(name)] = value
        for job_id in entry.job_ids:
            if job_id not in problem.job_index:
                raise ProblemError(f"allocation[{e}].jobs: unknown job id {job_id!r}")
        if len(entry.job_ids) == 1:
            singles[problem.job_index[entry.job_ids[0]]] = row
        elif len(entry.job_ids) == 2:
            pair_jobs.append([problem.job_index[j] for j in entry.job_ids])
            pair_fractions.append(row)
        else:
            raise ProblemError(f"allocation[{e}].jobs: expected one or two job ids")
    pairs = (
        PairShares.of_job_pairs(problem.num_jobs, np.asarray(pair_jobs), np.asarray(pair_fractions))
        if pair_jobs else PairShares.none(problem.num_jobs, problem.num_types)
    )
    objective = top.get("objective")
    return Allocation(
        policy=str(top.get("policy", "")),
        status=status,
        job_ids=problem.job_ids,
        worker_types=problem.worker_types,
        job_fractions=_readonly(singles),
        pairs=pairs,
        objective=None if objective is None else float(_num(objective, "objective")),  # type: ignore[arg-type]
        solve_time_s=float(_num(top.get("solve_time_s", 0.0), "solve_time_s")),  # type: ignore[arg-type]
        reason=str(top.get("reason", "")),
    )
