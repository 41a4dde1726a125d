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

import functools
from dataclasses import dataclass

import clarabel
import highspy
import numpy as np

from policy_service.core.sparse import sp

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
    a, num_rows = _constraint_matrix(tt, np.asarray(gpus_per_class, dtype=float))
    b = np.concatenate(
        [np.zeros(num_classes), np.asarray(counts, dtype=float), np.ones(num_classes), allowed.reshape(-1).astype(float), np.zeros(n_x)]
    )
    q = np.zeros(n_x + 1)
    q[-1] = -1.0  # maximise t
    solution = clarabel.DefaultSolver(
        _zeros(n_x + 1), q, a, b, [clarabel.NonnegativeConeT(num_rows)], _SETTINGS
    ).solve()
    status = _STATUS.get(str(solution.status), "solver_error")
    if not status.startswith("optimal"):
        return None, None, status
    z = np.asarray(solution.x)
    return z[:n_x].reshape(num_classes, num_types), float(z[-1]), status


@dataclass(frozen=True)
class _Csc:
    """A matrix in compressed sparse column form, as CLARABEL reads one (the attributes of a
    scipy ``csc_matrix`` it uses: sorted row indices, no duplicates). Not scipy's own, so that
    the simulator's programs do not load scipy.sparse (policy_service/core/sparse.py);
    tests/unit/policy/test_compiled_matrix.py holds it to scipy's form and CLARABEL to
    accepting it."""

    data: np.ndarray
    indices: np.ndarray
    indptr: np.ndarray
    shape: tuple[int, int]
    has_canonical_format: bool = True


def _constraint_matrix(tt: np.ndarray, gpus_per_class: np.ndarray) -> tuple[_Csc, int]:
    """A of the program above, rows [level (C), capacity (K), budget (C), upper (C*K), lower
    (C*K)], columns [x (C*K, class-major), t], written column by column in CSC form.

    Each x column has the same five entries, in increasing row order: -TT[c, k] in level row c,
    G[c] in capacity row k, 1 in budget row c, 1 in its upper row, -1 in its lower row; t has a 1
    in every level row. Laid out directly, these are the arrays scipy would produce from the
    (row, column, value) triplets (sorted, no duplicates; zeros kept), in half the time of its
    conversion (0.06 against 0.11 ms at 12 classes) and without scipy:
    tests/unit/policy/test_compiled_matrix.py holds them equal.
    """
    num_classes, num_types = tt.shape
    n_x = num_classes * num_types
    capacity, budget = num_classes, num_classes + num_types
    upper = budget + num_classes
    lower = upper + n_x
    cell = np.arange(n_x)
    row_of_cell = cell // num_types
    indices = np.empty(5 * n_x + num_classes, dtype=np.int64)
    data = np.empty(len(indices))
    per_cell = indices[: 5 * n_x].reshape(n_x, 5)
    per_cell[:, 0] = row_of_cell
    per_cell[:, 1] = capacity + cell % num_types
    per_cell[:, 2] = budget + row_of_cell
    per_cell[:, 3] = upper + cell
    per_cell[:, 4] = lower + cell
    indices[5 * n_x:] = np.arange(num_classes)
    values = data[: 5 * n_x].reshape(n_x, 5)
    values[:, 0] = -tt.reshape(-1)
    values[:, 1] = np.repeat(gpus_per_class, num_types)
    values[:, 2] = 1.0
    values[:, 3] = 1.0
    values[:, 4] = -1.0
    data[5 * n_x:] = 1.0
    indptr = np.append(np.arange(0, 5 * n_x + 1, 5), 5 * n_x + num_classes)
    num_rows = lower + n_x
    return _Csc(data, indices, indptr, (num_rows, n_x + 1)), num_rows


@functools.lru_cache(maxsize=64)
def _zeros(n: int) -> _Csc:
    """The (n, n) zero objective matrix of an LP, made once per size (CLARABEL copies what it
    reads; nothing writes it)."""
    return _Csc(np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(n + 1, dtype=np.int64), (n, n))


class MaxMinColumns:
    """max t s.t. level v >= t, budget v <= 1, usage v <= counts, v >= 0: the restricted
    programs of column generation (pair_columns.py), one HiGHS model that grows by columns:
    solved first by interior point and crossover, then re-solved from its last basis (primal
    simplex: added columns keep the basis feasible).

    Why not CLARABEL here: pair columns couple the rows of the two classes they pack, and with
    one class per job that coupling graph is close to random, so the interior-point KKT
    factorisation fills in (7 ms per iteration at 256 jobs, growing cubically); a simplex basis
    stays sparse, and a warm start costs a few hundred pivots instead of thousands.

    Columns are named by integer codes chosen by the caller (stable across rounds); ``solve``
    takes the codes and matrices of the current restricted program, adds the columns the model
    does not have yet, and returns values in the caller's order with the duals (mu (C,) of the
    level rows, beta (C,) of the time rows, gamma (K,) of the GPU rows; all >= 0, sum mu = 1).
    """

    def __init__(self, num_classes: int, counts: np.ndarray) -> None:
        self.num_classes, self.num_types = num_classes, len(counts)
        # highspy's raw model (highspy.Highs is it plus Python callbacks, whose set-up prints a
        # banner on stdout whatever output_flag says: a service and `gavel policy solve --json`
        # must keep stdout clean).
        highs = highspy._Highs()
        highs.setOptionValue("output_flag", False)
        highs.setOptionValue("simplex_strategy", 4)  # primal: added columns keep primal feasibility
        highs.setOptionValue("presolve", "off")  # each round starts from the last basis instead
        # HiGHS' default (1e-7, absolute) would stop short of columns that pair_columns still
        # prices as improving (relative 1e-7 of a cost ~1e-3): rounds that add columns and pivot
        # none. 1e-9 lets the two agree (5 rounds instead of 13 at 1,024 jobs).
        highs.setOptionValue("dual_feasibility_tolerance", 1e-9)
        num_rows = 2 * num_classes + self.num_types
        upper = np.concatenate([np.zeros(num_classes), np.asarray(counts, float), np.ones(num_classes)])
        highs.addRows(num_rows, np.full(num_rows, -highs.getInfinity()), upper, 0,
                      np.zeros(num_rows, np.int32), np.zeros(0, np.int32), np.zeros(0))
        # t: column 0, +1 in every level row (t - level v <= 0), minimise -t.
        highs.addCol(-1.0, 0.0, highs.getInfinity(), num_classes, np.arange(num_classes, dtype=np.int32), np.ones(num_classes))
        self._highs = highs
        self._solved = False
        self._codes = np.zeros(0, np.int64)  # code of model column 1 + i

    def solve(
        self, codes: np.ndarray, level: sp.spmatrix, budget: sp.spmatrix, usage: sp.spmatrix
    ) -> tuple[np.ndarray | None, float | None, tuple[np.ndarray, np.ndarray, np.ndarray] | None, str]:
        codes = np.asarray(codes, np.int64)
        known = np.isin(codes, self._codes)
        new = np.flatnonzero(~known)
        if len(new):
            a = sp.vstack([-sp.csr_matrix(level), sp.csr_matrix(usage), sp.csr_matrix(budget)], format="csr")
            block = sp.csc_matrix(a[:, new])
            block.sort_indices()
            inf = self._highs.getInfinity()
            self._highs.addCols(
                len(new), np.zeros(len(new)), np.zeros(len(new)), np.full(len(new), inf), int(block.nnz),
                block.indptr[:-1].astype(np.int32), block.indices.astype(np.int32), block.data.astype(float),
            )
            self._codes = np.concatenate([self._codes, codes[new]])
        if not self._solved:
            # No basis yet: interior point then crossover to a vertex (0.45 s against 2.4 s of
            # simplex pivots from the slack basis at 1,024 jobs, the seeded columns packing
            # jobs along chains that factorise well); every later round re-solves from the
            # basis by primal simplex.
            self._highs.setOptionValue("solver", "ipm")
        self._highs.run()
        self._highs.setOptionValue("solver", "simplex")
        self._solved = True
        if self._highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None, None, None, "solver_error"
        solution = self._highs.getSolution()
        values = np.asarray(solution.col_value)
        order = np.argsort(self._codes, kind="stable")
        where = order[np.searchsorted(self._codes, codes, sorter=order)]
        y = -np.asarray(solution.row_dual)  # HiGHS: d objective / d upper bound, <= 0 for a minimum
        c, k = self.num_classes, self.num_types
        duals = (y[:c], y[c + k:], y[c:c + k])
        return values[1 + where], float(values[0]), duals, "optimal"
