"""The LP a simulation solves hundreds of times, handed to CLARABEL without cvxpy's per-solve work.

Max-min fairness without packing, over classes of interchangeable jobs:

    maximize t  s.t.  sum_k TT[c, k] x[c, k] >= t       (every class's fairness level)
                      sum_c G[c] x[c, k] <= N_k         (each type's GPUs; G = class size x gang)
                      sum_k x[c, k] <= 1                (each job's time)
                      0 <= x[c, k] <= allowed[c, k]

cvxpy spends 2-10 ms canonicalising a problem this small; written directly in CLARABEL's
standard form (minimise q'z subject to Az + s = b, s >= 0), with the matrix assembled from
index arrays in one vectorised step, the same LP takes about 0.7 ms. fairness.py keeps the cvxpy
formulation for every other solver and for packing, and tests/unit/policy checks that both reach
the same optimum.
"""

from __future__ import annotations

import clarabel
import numpy as np
import scipy.sparse as sp

_SETTINGS = clarabel.DefaultSettings()
_SETTINGS.verbose = False

# CLARABEL's statuses, in cvxpy's words (what solving.STATUS_OF understands).
_STATUS = {
    "Solved": "optimal",
    "AlmostSolved": "optimal_inaccurate",
    "PrimalInfeasible": "infeasible",
    "AlmostPrimalInfeasible": "infeasible_inaccurate",
    "DualInfeasible": "unbounded",
}


def solve_max_min(
    weighted_throughputs: np.ndarray,  # (C, K): fairness coefficient x steps/s, >= 0
    gpus_per_class: np.ndarray,  # (C,)
    counts: np.ndarray,  # (K,)
    allowed: np.ndarray,  # (C, K) bool: where a variable may be positive
) -> tuple[np.ndarray | None, float | None, str]:
    """(x (C, K) or None, the max-min level or None, status in cvxpy's words)."""
    tt = np.maximum(np.asarray(weighted_throughputs, dtype=float), 0.0)
    num_classes, num_types = tt.shape
    n_x = num_classes * num_types
    cell = np.arange(n_x)  # x[c, k] is variable c * K + k; t is variable n_x
    row_of_cell = np.repeat(np.arange(num_classes), num_types)
    type_of_cell = np.tile(np.arange(num_types), num_classes)
    level, capacity, budget, upper, lower = 0, num_classes, num_classes + num_types, 2 * num_classes + num_types, None
    lower = upper + n_x
    rows = np.concatenate(
        [
            level + row_of_cell, level + np.arange(num_classes),  # -TT x + t <= 0
            capacity + type_of_cell,  # G x <= N
            budget + row_of_cell,  # sum_k x <= 1
            upper + cell,  # x <= allowed
            lower + cell,  # -x <= 0
        ]
    )
    cols = np.concatenate([cell, np.full(num_classes, n_x), cell, cell, cell, cell])
    values = np.concatenate(
        [
            -tt.reshape(-1), np.ones(num_classes),
            np.repeat(np.asarray(gpus_per_class, dtype=float), num_types),
            np.ones(n_x), np.ones(n_x), -np.ones(n_x),
        ]
    )
    num_rows = lower + n_x
    a = sp.csc_matrix((values, (rows, cols)), shape=(num_rows, n_x + 1))
    b = np.concatenate(
        [np.zeros(num_classes), np.asarray(counts, dtype=float), np.ones(num_classes), allowed.reshape(-1).astype(float), np.zeros(n_x)]
    )
    q = np.zeros(n_x + 1)
    q[-1] = -1.0  # maximise t
    solution = clarabel.DefaultSolver(
        sp.csc_matrix((n_x + 1, n_x + 1)), q, a, b, [clarabel.NonnegativeConeT(num_rows)], _SETTINGS
    ).solve()
    status = _STATUS.get(str(solution.status), "solver_error")
    if not status.startswith("optimal"):
        return None, None, status
    z = np.asarray(solution.x)
    return z[:n_x].reshape(num_classes, num_types), float(z[-1]), status
