"""The restricted max-min programs of column generation (pair_columns.py): one HiGHS model that
grows by the columns the prices ask for and sheds the ones they no longer want.

    max t  s.t.  t - level v <= 0,  usage v <= counts,  budget v <= 1,  v >= 0

solved first by interior point and crossover (no basis yet), then re-solved from its last basis
by primal simplex (added columns keep the basis primal feasible).

Why shedding columns: at 2,048 jobs with rows of their own the rounds cost thousands of simplex
pivots, and most of a pivot's time (HiGHS' PRICE, CHUZC and devex updates: ~60% measured) is
proportional to the columns in the model, of which only the basic ones (~3,000 of ~30,000)
matter. A column the caller drops has a strictly negative reduced gain, so it is nonbasic: the
basis stays valid and the next solve starts from it. Exactness does not depend on it: the
caller prices every candidate column, dropped ones included, before it stops.

Why not CLARABEL here: pair columns couple the rows of the two classes they pack, and with
one class per job that coupling graph is close to random, so the interior-point KKT
factorisation fills in (7 ms per iteration at 256 jobs, growing cubically); a simplex basis
stays sparse, and a warm start costs a few hundred pivots instead of thousands.
"""

from __future__ import annotations

import highspy
import numpy as np

from policy_service.core.sparse import sp


class MaxMinMaster:
    """Columns are named by integer codes chosen by the caller (stable across rounds).
    ``solve`` takes the codes and matrices of the current restricted program, deletes the
    model's columns whose codes are absent (nonbasic ones: the caller's contract), adds the
    columns it does not have yet, and returns values in the caller's order with the duals
    (mu (C,) of the level rows, beta (C,) of the time rows, gamma (K,) of the GPU rows; all
    >= 0, sum mu = 1)."""

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
        self.pivots = 0  # simplex iterations over every solve (crossover's included)

    def solve(
        self, codes: np.ndarray, level: sp.spmatrix, budget: sp.spmatrix, usage: sp.spmatrix
    ) -> tuple[np.ndarray | None, float | None, tuple[np.ndarray, np.ndarray, np.ndarray] | None, str]:
        codes = np.asarray(codes, np.int64)
        gone = np.flatnonzero(~np.isin(self._codes, codes))
        if len(gone):
            # Model column 1 + i holds self._codes[i]; HiGHS renumbers the rest in order.
            self._highs.deleteCols(len(gone), (1 + gone).astype(np.int32))
            self._codes = np.delete(self._codes, gone)
        new = np.flatnonzero(~np.isin(codes, self._codes))
        if len(new):
            # Only the new columns' entries: slicing columns of CSC matrices touches nothing else.
            a = sp.vstack([-sp.csc_matrix(level)[:, new], sp.csc_matrix(usage)[:, new],
                           sp.csc_matrix(budget)[:, new]], format="csc")
            a.sort_indices()
            inf = self._highs.getInfinity()
            self._highs.addCols(
                len(new), np.zeros(len(new)), np.zeros(len(new)), np.full(len(new), inf), int(a.nnz),
                a.indptr[:-1].astype(np.int32), a.indices.astype(np.int32), a.data.astype(float),
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
        self.pivots += int(self._highs.getInfo().simplex_iteration_count)
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
