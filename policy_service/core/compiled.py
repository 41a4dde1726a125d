"""Compiled programs for the LPs a simulation solves hundreds of times.

cvxpy spends most of a small solve canonicalising the problem. For max-min fairness without
packing, the program's structure depends only on how many classes and types there are, so it is
compiled once per (class capacity, types) with the data as parameters (cvxpy's DPP), and every
later solve only substitutes numbers: about 2 ms instead of 5-10 ms.

The padding rows (capacity above the problem's class count) are pinned to zero, so the program
solved is exactly the problem's own LP: the answer depends on the problem alone, never on which
problems came before (the cache only saves compilation).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import cvxpy as cp
import numpy as np


@dataclass(frozen=True, eq=False)
class MaxMinProgram:
    """maximize t  s.t.  sum_k TT[c, k] x[c, k] >= present_c t,  gangs @ x <= N,
    sum_k x[c, k] <= 1,  0 <= x <= allowed."""

    program: cp.Problem
    x: cp.Variable
    level: cp.Variable
    weighted_throughputs: cp.Parameter  # (C, K) coefficient x throughput
    gpus_per_class: cp.Parameter  # (C,) class size x scale factor
    present: cp.Parameter  # (C,) 1 for real classes, 0 for padding
    counts: cp.Parameter  # (K,)
    allowed: cp.Parameter  # (C, K) 1 where a variable may be positive


@functools.lru_cache(maxsize=32)
def max_min_program(capacity: int, num_types: int) -> MaxMinProgram:
    x = cp.Variable((capacity, num_types), nonneg=True)
    level = cp.Variable()
    tt = cp.Parameter((capacity, num_types), nonneg=True)
    gpus = cp.Parameter(capacity, nonneg=True)
    present = cp.Parameter(capacity, nonneg=True)
    counts = cp.Parameter(num_types, nonneg=True)
    allowed = cp.Parameter((capacity, num_types), nonneg=True)
    program = cp.Problem(
        cp.Maximize(level),
        [
            cp.sum(cp.multiply(tt, x), axis=1) >= cp.multiply(present, level),
            gpus @ x <= counts,
            cp.sum(x, axis=1) <= 1,
            x <= allowed,
        ],
    )
    return MaxMinProgram(program, x, level, tt, gpus, present, counts, allowed)


def capacity_for(num_classes: int) -> int:
    """Round up to a power of two (at least 8): few distinct programs, little padding."""
    return max(8, 1 << (max(num_classes, 1) - 1).bit_length())


def solve_max_min(
    weighted_throughputs: np.ndarray,  # (C, K)
    gpus_per_class: np.ndarray,  # (C,)
    counts: np.ndarray,  # (K,)
    allowed: np.ndarray,  # (C, K) bool
    solver: str,
) -> tuple[np.ndarray | None, float | None, str]:
    """(x (C, K) or None, level or None, cvxpy status)."""
    num_classes, num_types = weighted_throughputs.shape
    capacity = capacity_for(num_classes)
    compiled = max_min_program(capacity, num_types)
    pad = capacity - num_classes
    compiled.weighted_throughputs.value = np.pad(np.maximum(weighted_throughputs, 0.0), ((0, pad), (0, 0)))
    compiled.gpus_per_class.value = np.pad(gpus_per_class.astype(float), (0, pad))
    compiled.present.value = np.pad(np.ones(num_classes), (0, pad))
    compiled.counts.value = counts.astype(float)
    compiled.allowed.value = np.pad(allowed.astype(float), ((0, pad), (0, 0)))
    compiled.program.solve(solver=solver)
    if compiled.x.value is None:
        return None, None, compiled.program.status
    return np.asarray(compiled.x.value)[:num_classes], float(compiled.level.value), compiled.program.status
