"""The packed max-min program where classes collapse, handed to CLARABEL without cvxpy.

fairness.MaxMinFairness._restricted states the program over a Space's variables v (formulation.py):

    maximize t  s.t.  level v >= t,  budget v <= 1,  usage v <= counts,
                      balance v == 0,  no_self v <= 0,  v >= 0

In the simulator jobs of one type share the table's row, classes collapse (~23 classes, ~700
variables at Gavel's paper scale), and each answer solves this once: cvxpy spent ~20 ms of CPU
canonicalising it against ~9 ms in CLARABEL itself (profile of a 36:36:36 run, 4 jobs/h).

Here the matrices go to CLARABEL directly, laid out exactly as cvxpy 1.x lays them out for
CLARABEL (columns [t, v]; rows: the equalities, then v's sign rows, the level, time and GPU
rows, and the no-self rows), so CLARABEL receives the same numbers in the same order and returns
the same iterates: the allocations are the cvxpy path's to the last bit, not just its optimum.
tests/unit/policy/test_compiled_packed.py holds the data to cvxpy's ``get_problem_data`` and the
solutions to cvxpy's on random collapsed problems (both pair forms).
"""

from __future__ import annotations

from dataclasses import dataclass

import clarabel
import numpy as np

from policy_service.core.compiled import CLARABEL_STATUS
from policy_service.core.sparse import sp


@dataclass(frozen=True)
class PackedSolution:
    """values (V,) and level, or None when no solution; duals of the level (C,), time (C,) and
    GPU (K,) rows (>= 0, as cvxpy reports those of the inequality constraints)."""

    values: np.ndarray | None
    level: float | None
    status: str  # cvxpy's words
    level_duals: np.ndarray | None = None
    time_duals: np.ndarray | None = None
    gpu_duals: np.ndarray | None = None


def standard_form(
    level: sp.spmatrix, budget: sp.spmatrix, usage: sp.spmatrix, counts: np.ndarray,
    balance: sp.spmatrix | None = None, no_self: sp.spmatrix | None = None,
) -> tuple[sp.csc_matrix, np.ndarray, np.ndarray, int, int]:
    """(A, b, q, equality rows, inequality rows) of ``minimise q'z s.t. A z + s = b``, s in the
    zero cone (first rows) then the nonnegative cone, z = [t, v]: cvxpy's layout (the test
    compares every array)."""
    num_classes, num_vars = level.shape
    num_types = usage.shape[0]
    balance = sp.csr_matrix((0, num_vars)) if balance is None else sp.csr_matrix(balance)
    no_self = sp.csr_matrix((0, num_vars)) if no_self is None else sp.csr_matrix(no_self)
    # Row blocks over v, and the t column (+1 in the level rows: t - level v <= 0). The blocks'
    # entries laid end to end in their order, each block's row by row, as
    # sp.vstack(blocks, format="coo") lays them (without its per-block checks and copies, ~1 ms
    # of a re-solve).
    level, budget, usage = sp.csr_matrix(level), sp.csr_matrix(budget), sp.csr_matrix(usage)
    identity = np.arange(num_vars)
    parts = [
        _entries(balance),
        (identity, identity, np.full(num_vars, -1.0)),  # -I: v >= 0
        _entries(level, negate=True),
        _entries(budget),
        _entries(usage),
        _entries(no_self),
    ]
    heights = [balance.shape[0], num_vars, num_classes, budget.shape[0], num_types, no_self.shape[0]]
    offsets = np.concatenate([[0], np.cumsum(heights)])
    first_level = balance.shape[0] + num_vars
    rows = np.concatenate(
        [part[0] + offset for part, offset in zip(parts, offsets[:-1].tolist())] + [first_level + np.arange(num_classes)]
    )
    cols = np.concatenate([part[1] + 1 for part in parts] + [np.zeros(num_classes, np.int64)])
    vals = np.concatenate([part[2] for part in parts] + [np.ones(num_classes)])
    a = sp.csc_matrix((vals, (rows, cols)), shape=(int(offsets[-1]), num_vars + 1))
    a.sum_duplicates()
    a.eliminate_zeros()  # cvxpy keeps no stored zeros (a job type with 0 steps/s on a type)
    a.sort_indices()
    b = np.concatenate([
        np.zeros(balance.shape[0] + num_vars + num_classes), np.ones(num_classes),
        np.asarray(counts, float), np.zeros(no_self.shape[0]),
    ])
    q = np.zeros(num_vars + 1)
    q[0] = -1.0  # maximise t
    num_eq = balance.shape[0]
    return a, b, q, num_eq, a.shape[0] - num_eq


def _entries(block: sp.csr_matrix, *, negate: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, columns, values) of a CSR block's stored entries, row by row (its COO form)."""
    coo = block.tocoo()
    return coo.row.astype(np.int64), coo.col.astype(np.int64), -coo.data if negate else coo.data


def solve_packed_max_min(
    level: sp.spmatrix, budget: sp.spmatrix, usage: sp.spmatrix, counts: np.ndarray,
    balance: sp.spmatrix | None = None, no_self: sp.spmatrix | None = None,
) -> PackedSolution:
    """The program above with CLARABEL's default settings (what cvxpy passes it)."""
    a, b, q, num_eq, num_ineq = standard_form(level, budget, usage, counts, balance, no_self)
    cones = ([clarabel.ZeroConeT(num_eq)] if num_eq else []) + [clarabel.NonnegativeConeT(num_ineq)]
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    zero = sp.csc_matrix((a.shape[1], a.shape[1]))
    solution = clarabel.DefaultSolver(zero, q, a, b, cones, settings).solve()
    status = CLARABEL_STATUS.get(str(solution.status), "solver_error")
    if not status.startswith("optimal"):
        return PackedSolution(None, None, status)
    z, y = np.asarray(solution.x), np.asarray(solution.z)
    num_classes, num_vars = level.shape
    start = num_eq + num_vars  # the level rows
    return PackedSolution(
        # v >= 0 projected as cvxpy projects a nonneg variable's value (np.maximum(x, 0))
        np.maximum(z[1:], 0.0), float(z[0]), status,
        y[start:start + num_classes], y[start + num_classes:start + 2 * num_classes],
        y[start + 2 * num_classes:start + 2 * num_classes + usage.shape[0]],
    )
