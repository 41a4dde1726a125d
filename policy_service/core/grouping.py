"""Classes of interchangeable jobs.

Two jobs are interchangeable for a policy when every number of theirs that enters its program is
equal (throughputs, scale factor, priority weight, colocation key, and whatever else the policy
reads: steps remaining for makespan, arrival for FTF, ...). The program is then invariant under
swapping them; being convex, it has an optimal solution that treats them alike (average any
optimum over the swaps), so one set of variables per class loses nothing. 2048 jobs drawn from
Gavel's 83 (job type, scale factor) keys become at most 83 classes for max-min fairness.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Up to this many jobs, rows are grouped through a dict of tuples (first appearance numbers the
# classes, as below): ~10x faster than np.unique(axis=0)'s sort of a structured view at the few
# dozen jobs a simulation solves hundreds of times (0.3 ms an answer). The same classes: tuples
# compare floats as floats, as np.unique does (0.0 == -0.0), and NaN is encoded apart first.
SMALL_GROUPING = 256


@dataclass(frozen=True, eq=False)
class JobClasses:
    """class_of_job (n,): class of each job; representative (C,): its first job; sizes (C,)."""

    class_of_job: np.ndarray
    representative: np.ndarray
    sizes: np.ndarray

    @property
    def num_classes(self) -> int:
        return len(self.representative)

    @staticmethod
    def singletons(num_jobs: int) -> JobClasses:
        """Every job its own class (the ungrouped, per-job formulation)."""
        return JobClasses(
            class_of_job=np.arange(num_jobs, dtype=np.int64),
            representative=np.arange(num_jobs, dtype=np.int64),
            sizes=np.ones(num_jobs, dtype=np.int64),
        )


def group_jobs(columns: Sequence[np.ndarray], num_jobs: int, *, enabled: bool = True) -> JobClasses:
    """Group jobs whose values agree in every column (each (n,) or (n, d)); NaN equals NaN.

    Classes are numbered in order of their first job, so the result does not depend on numpy's
    sort order. With ``enabled=False`` every job is its own class.
    """
    if not enabled or num_jobs == 0:
        return JobClasses.singletons(num_jobs)
    blocks = [np.asarray(column, dtype=float).reshape(num_jobs, -1) for column in columns]
    keys = np.concatenate(blocks, axis=1) if blocks else np.zeros((num_jobs, 1))
    is_nan = np.isnan(keys)
    has_nan = bool(is_nan.any())
    if num_jobs <= SMALL_GROUPING and not has_nan:
        return _group_rows(keys.tolist())  # no NaN: the rows compare as they are
    # np.unique does not treat NaN as equal to itself: encode NaN apart from every number.
    keys = np.concatenate([np.where(is_nan, 0.0, keys), is_nan.astype(float)], axis=1)
    if num_jobs <= SMALL_GROUPING:
        return _group_rows(keys.tolist())
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(first, kind="stable")  # classes by first appearance
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    class_of_job = rank[inverse].astype(np.int64)
    return JobClasses(
        class_of_job=class_of_job,
        representative=first[order].astype(np.int64),
        sizes=np.bincount(class_of_job, minlength=len(order)).astype(np.int64),
    )


def _group_rows(rows: list[list[float]]) -> JobClasses:
    """group_jobs over rows given as lists, by a dict (classes in order of first appearance)."""
    class_by_row: dict[tuple[float, ...], int] = {}
    first: list[int] = []
    sizes: list[int] = []
    class_of_job = []
    for i, row in enumerate(map(tuple, rows)):
        c = class_by_row.get(row)
        if c is None:
            c = class_by_row[row] = len(first)
            first.append(i)
            sizes.append(0)
        sizes[c] += 1
        class_of_job.append(c)
    return JobClasses(
        class_of_job=np.array(class_of_job, dtype=np.int64),
        representative=np.array(first, dtype=np.int64),
        sizes=np.array(sizes, dtype=np.int64),  # (counted here: what bincount of the classes gives)
    )
