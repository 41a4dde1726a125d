"""Leave one job type out: how well the estimator knows a type it was never shown.

For a job type T of a throughput table: the reference set is the table without T; a job of T is
submitted beside one job of every reference class of its size; it is measured alone on one
feature type only, and packed with references on a fraction f of the (feature type, reference)
cells, chosen at random (seeded). Both jobs of a packed run report, as workers would, with the
table's true figures. Then the estimator's figures are compared with the table's:

- isolated: the absolute percentage error of T's steps/s alone on the other feature types;
- colocated: of the packed fractions (both directions) on the cells that were not measured, where
  the true fraction is positive (a true zero has no percentage error; ``zero_misses`` counts the
  true zeros estimated positive);
- matching: whether T was matched to the reference nearest its true row (cosine distance over
  every cell, both directions).

Used by tests/unit/estimator/test_holdout.py and bench/estimator_accuracy.py.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from common.messages import JobProgress, JobSpec
from common.throughputs import ThroughputTable
from estimator_service.core.colocation import cosine_distances
from estimator_service.core.estimator import Estimator
from estimator_service.core.reference import class_of, reference_set
from estimator_service.core.settings import EstimatorSettings

NEW_JOB = "held-out"


@dataclass(frozen=True, slots=True)
class HoldoutResult:
    job_type: str
    fraction: float
    seed: int
    isolated_errors: tuple[float, ...]
    colocated_errors: tuple[float, ...]
    zero_misses: int
    matched: bool | None  # None: nothing measured packed, so nothing was matched


def holdout(
    table: ThroughputTable, job_type: str, fraction: float, seed: int,
    settings: EstimatorSettings = EstimatorSettings(), scale_factor: int = 1,
) -> HoldoutResult:
    references = reference_set(table, exclude=[job_type])
    group = references.group(scale_factor)
    assert group is not None, f"no reference of scale factor {scale_factor}"
    rng = np.random.default_rng([seed, sum(job_type.encode())])
    estimator = Estimator(references, settings)
    partners = {}
    for i, name in enumerate(group.classes):
        partner_type = table_type(name)
        partners[name] = f"ref-{i}"
        estimator.submitted(JobSpec(f"ref-{i}", partner_type, 10**6, scale_factor))
    estimator.submitted(JobSpec(NEW_JOB, job_type, 10**6, scale_factor))
    types = references.feature_types
    measured_type = types[int(rng.integers(len(types)))]
    reports = [_report(NEW_JOB, measured_type, table.isolated(job_type, scale_factor, measured_type), "alone")]
    cells = [(w, name) for w in types for name in group.classes]
    chosen = rng.choice(len(cells), size=max(1, round(fraction * len(cells))), replace=False) if fraction > 0 else []
    measured_cells = {cells[i] for i in chosen}
    for n, (w, name) in enumerate(sorted(measured_cells)):
        pair = table.pair(job_type, table_type(name), scale_factor, w)
        if pair is None:
            continue
        lease = f"packed-{n}"
        reports.append(_report(NEW_JOB, w, pair[0], lease, partners[name]))
        reports.append(_report(partners[name], w, pair[1], lease, NEW_JOB))
    for report in reports:
        estimator.progress(report)
    picture = estimator.everything()
    row = next(j for j in picture.jobs if j.job_id == NEW_JOB)
    isolated_errors = tuple(
        _ape(row.throughputs_steps_per_s[w], table.isolated(job_type, scale_factor, w))
        for w in types if w != measured_type and table.isolated(job_type, scale_factor, w) > 0
    )
    mine = class_of(job_type, scale_factor)
    fractions = {c.classes: c.fractions for c in picture.colocations}
    colocated, zero_misses = [], 0
    for w in types:
        alone = table.isolated(job_type, scale_factor, w)
        for name in group.classes:
            if (w, name) in measured_cells:
                continue
            pair = table.pair(job_type, table_type(name), scale_factor, w)
            partner_alone = table.isolated(table_type(name), scale_factor, w)
            if pair is None or not alone > 0 or not partner_alone > 0:
                continue
            key = (mine, name) if mine <= name else (name, mine)
            estimate = fractions[key][w]
            mine_estimate, theirs_estimate = estimate if key[0] == mine else estimate[::-1]
            for truth, guess in ((pair[0] / alone, mine_estimate), (pair[1] / partner_alone, theirs_estimate)):
                if truth > 0:
                    colocated.append(_ape(guess, truth))
                elif guess > 0:
                    zero_misses += 1
    matched = None
    if measured_cells:
        match = estimator.colocation.match(mine, scale_factor)
        nearest = _true_nearest(table, job_type, scale_factor, group.classes, types, estimator)
        matched = match == nearest
    return HoldoutResult(job_type, fraction, seed, isolated_errors, tuple(colocated), zero_misses, matched)


def table_type(name: str) -> str:
    """The job type of a class name ``"('Model (batch size N)', 1)"``."""
    return name[2 : name.rindex("',")]


def _report(job_id: str, accelerator_type: str, steps_per_s: float, lease_id: str, partner: str = "") -> JobProgress:
    return JobProgress(
        job_id, "bench-worker", lease_id, 0, 1, 360.0, steps_per_s, accelerator_type=accelerator_type,
        packed_with=(partner,) if partner else (),
    )


def _ape(estimate: float, truth: float) -> float:
    return abs(estimate - truth) / truth


def _true_nearest(table, job_type, scale_factor, classes, types, estimator) -> int:  # noqa: ANN001
    """The reference whose (completed) row is nearest the held-out type's true row."""
    model = estimator.colocation.model(scale_factor)
    row = np.full(model.references.shape[1], np.nan)
    for p, w in enumerate(types):
        alone = table.isolated(job_type, scale_factor, w)
        for r, name in enumerate(classes):
            pair = table.pair(job_type, table_type(name), scale_factor, w)
            partner_alone = table.isolated(table_type(name), scale_factor, w)
            if pair is None:
                continue
            if alone > 0:
                row[model.column(0, p, r)] = min(1.0, pair[0] / alone)
            if partner_alone > 0:
                row[model.column(1, p, r)] = min(1.0, pair[1] / partner_alone)
    known = np.isfinite(row)
    return int(np.argmin(cosine_distances(np.where(known, row, 0.0), np.where(known, model.references, 0.0))))


def summarise(results: Iterable[HoldoutResult]) -> dict[str, float | int]:
    """Median and p90 errors, isolated and colocated, and the share matched to the true nearest."""
    results = list(results)
    isolated = [e for r in results for e in r.isolated_errors]
    colocated = [e for r in results for e in r.colocated_errors]
    matched = [r.matched for r in results if r.matched is not None]
    return {
        "trials": len(results),
        "isolated_median": _quantile(isolated, 0.5),
        "isolated_p90": _quantile(isolated, 0.9),
        "colocated_median": _quantile(colocated, 0.5),
        "colocated_p90": _quantile(colocated, 0.9),
        "zero_misses": sum(r.zero_misses for r in results),
        "matched_share": sum(matched) / len(matched) if matched else float("nan"),
    }


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    if q == 0.5:
        return float(statistics.median(values))
    return float(np.quantile(values, q))
