"""How wrong the estimates the policy used were: one sample per allocation request, measured
against the simulator's true table (docs/estimator.md, "Error over time").

    isolated    mean absolute percentage error of each job's steps/s alone, over every job and
                type of the request where the truth is positive;
    colocated   the same for the packed steps/s of every pair of jobs the policy could pack (same
                gang size, their classes' pair listed), both members, on every listed type where
                the truth is positive.

Requests that carry no throughputs (the estimator in oracle mode: the policy reads the table)
give no sample. Vectorised per pair of classes: jobs of one class on one type share the true
figure, so the cost grows with classes squared, not jobs squared.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from common.messages import AllocationRequested, PolicyJob
from common.throughputs import ThroughputTable


@dataclass(frozen=True, slots=True)
class EstimationSample:
    time_s: float
    isolated_mape: float | None  # None: nothing to compare
    colocated_mape: float | None
    isolated_figures: int
    colocated_figures: int


def sample(request: AllocationRequested, table: ThroughputTable, time_s: float) -> EstimationSample | None:
    jobs = [j for j in request.problem.jobs if j.throughputs_steps_per_s is not None]
    if not jobs:
        return None
    types = list(request.problem.worker_types)
    isolated = _isolated_errors(jobs, types, table)
    colocated_sum, colocated_count = _colocated_errors(request, jobs, table)
    return EstimationSample(
        time_s,
        float(np.mean(isolated)) if isolated.size else None,
        colocated_sum / colocated_count if colocated_count else None,
        int(isolated.size),
        colocated_count,
    )


def _isolated_errors(jobs: Sequence[PolicyJob], types: Sequence[str], table: ThroughputTable) -> np.ndarray:
    errors = []
    for job in jobs:
        for w in types:
            truth = table.isolated_steps_per_s.get((job.job_type, job.scale_factor, w), 0.0)
            if truth > 0:
                errors.append(abs(job.throughputs_steps_per_s[w] - truth) / truth)  # type: ignore[index]
    return np.asarray(errors)


def _colocated_errors(request: AllocationRequested, jobs: Sequence[PolicyJob], table: ThroughputTable) -> tuple[float, int]:
    """(sum of absolute percentage errors, how many figures)."""
    colocations = request.problem.colocations or ()
    if not colocations:
        return 0.0, 0
    by_class: dict[str, list[PolicyJob]] = defaultdict(list)
    for job in jobs:
        if job.colocation_class:
            by_class[job.colocation_class].append(job)
    total, count = 0.0, 0
    for pair in colocations:
        a, b = pair.classes
        members_a, members_b = by_class.get(a, []), by_class.get(b, [])
        if not members_a or not members_b or members_a[0].scale_factor != members_b[0].scale_factor:
            continue
        # pairs of distinct jobs: |A| x |B|, or |A| (|A| - 1) / 2 within one class
        pairs = len(members_a) * (len(members_a) - 1) // 2 if a == b else len(members_a) * len(members_b)
        if pairs == 0:
            continue
        type_a, type_b, sf = members_a[0].job_type, members_b[0].job_type, members_a[0].scale_factor
        for w, (f_a, f_b) in pair.fractions.items():
            truth = table.pair(type_a, type_b, sf, w)
            if truth is None:
                continue
            for members, fraction, true_rate, partners in (
                (members_a, f_a, truth[0], len(members_b) if a != b else len(members_a) - 1),
                (members_b, f_b, truth[1], len(members_a) if a != b else 0),
            ):
                if true_rate <= 0 or partners == 0:
                    continue
                estimates = np.array([m.throughputs_steps_per_s[w] for m in members]) * fraction  # type: ignore[index]
                total += float(np.sum(np.abs(estimates - true_rate) / true_rate)) * partners
                count += len(members) * partners
    return total, count
