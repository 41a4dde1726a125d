"""The max-min program of fairness.MaxMinFairness._restricted handed to ECOS without cvxpy.

Preset "gavel" solves Gavel's programs as Gavel does: per-job (and per-job-pair) variables, ECOS
through cvxpy. At Gavel's README scale (a 5,500-job trace on 36:36:36) a simulation solves ~6,600
of them, ~5.7 ms each, of which ECOS itself is ~0.2 ms: the rest was cvxpy canonicalising the
same five matrix products every time.

cvxpy lays the program out for ECOS as it does for CLARABEL (compiled_packed.standard_form:
columns [t, v]; rows the equalities, v's sign rows, the level, time and GPU rows, the no-self
rows), then splits it: the equality rows are ECOS's A, b, the others its G, h (one nonnegative
cone, no second-order or exponential cone). Here the same arrays go to ECOS's C entry point with
the options cvxpy gives it (verbose off, nothing else), so ECOS runs the same iterations and the
allocations are the cvxpy path's to the last bit; the answer is mapped back as cvxpy maps it (a
nonnegative variable's value clipped at 0, the inequality rows' duals as ECOS returns them, ECOS's
exit flags in cvxpy's words). tests/unit/policy/test_compiled_ecos.py holds the arrays to
cvxpy's ``get_problem_data(cp.ECOS)`` and the answers to cvxpy's, on random problems.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policy_service.core.compiled import Csc
from policy_service.core.compiled_packed import PackedSolution
from policy_service.core.sparse import sp

# ECOS's exit flags in cvxpy's words (cvxpy's ECOS.STATUS_MAP): "user_limit" (iteration limit)
# carries the last iterate as a solution, as cvxpy keeps it; "solver_error" is what cvxpy turns
# into a SolverError.
ECOS_STATUS = {
    0: "optimal",
    1: "infeasible",
    2: "unbounded",
    10: "optimal_inaccurate",
    11: "infeasible_inaccurate",
    12: "unbounded_inaccurate",
    -1: "user_limit",
    -2: "solver_error",
    -3: "solver_error",
    -4: "solver_error",
    -7: "solver_error",
}
# The statuses cvxpy reads a solution from (cvxpy.settings.SOLUTION_PRESENT).
_SOLUTION_PRESENT = ("optimal", "optimal_inaccurate", "user_limit")


@dataclass(frozen=True)
class EcosData:
    """ECOS's standard form: minimise c'z s.t. G z + s = h, s >= 0 (``num_ineq`` rows), A z = b
    (``num_eq`` rows; A, b None when there are none, as cvxpy passes them), in CSC form."""

    c: np.ndarray
    g: Csc
    h: np.ndarray
    a: Csc | None
    b: np.ndarray | None

    @property
    def dims(self) -> dict[str, object]:
        """The cone sizes as cvxpy hands them to ecos.solve (its dims_to_solver_dict)."""
        return {"l": self.g.shape[0], "q": [], "e": 0}


@dataclass(frozen=True)
class EcosSolution(PackedSolution):
    """PackedSolution, with ECOS's own time (what cvxpy reports as solver_stats.solve_time)."""

    solve_time_s: float = float("nan")


def ecos_data(
    level: sp.spmatrix, budget: sp.spmatrix, usage: sp.spmatrix, counts: np.ndarray,
    balance: sp.spmatrix | None = None, no_self: sp.spmatrix | None = None,
) -> EcosData:
    """The program's arrays as cvxpy's ECOS interface builds them (the test compares each).

    compiled_packed.standard_form's matrix, split at the equality rows, but assembled here from
    the blocks' triplets in one sort: its scipy stacking and conversions cost ~1 ms a program,
    five times ECOS's own time on preset gavel's programs."""
    num_classes, num_vars = level.shape
    num_types = usage.shape[0]
    # G's rows over z = [t, v]: v's sign rows (-v <= 0), the level rows (t - level v <= 0), the
    # time and GPU rows, the no-self rows; each part (rows, columns, values).
    sign_rows = (np.arange(num_vars), np.arange(num_vars) + 1, np.full(num_vars, -1.0))
    t_column = (num_vars + np.arange(num_classes), np.zeros(num_classes, np.int64), np.ones(num_classes))
    parts = [sign_rows, t_column, _triplets(level, num_vars, -1.0), _triplets(budget, num_vars + num_classes),
             _triplets(usage, num_vars + 2 * num_classes)]
    num_ineq = num_vars + 2 * num_classes + num_types
    if no_self is not None and no_self.shape[0]:
        parts.append(_triplets(no_self, num_ineq))
        num_ineq += no_self.shape[0]
    h = np.concatenate([
        np.zeros(num_vars + num_classes), np.ones(num_classes), np.asarray(counts, float),
        np.zeros(num_ineq - num_vars - 2 * num_classes - num_types),
    ])
    c = np.zeros(num_vars + 1)
    c[0] = -1.0  # maximise t
    g = _csc(parts, (num_ineq, num_vars + 1))
    if balance is None or not balance.shape[0]:
        return EcosData(c, g, h, None, None)
    a = _csc([_triplets(balance, 0)], (balance.shape[0], num_vars + 1))
    return EcosData(c, g, h, a, np.zeros(balance.shape[0]))


def _triplets(block: sp.spmatrix, first_row: int, sign: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, columns of z, values) of a block over v whose first row is ``first_row``."""
    block = sp.csr_matrix(block)
    if not block.has_canonical_format:  # (duplicates summed as scipy sums them in standard_form)
        block = block.copy()
        block.sum_duplicates()
    rows = np.repeat(np.arange(first_row, first_row + block.shape[0]), np.diff(block.indptr))
    return rows, block.indices.astype(np.int64) + 1, block.data * sign if sign != 1.0 else block.data


def _csc(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]], shape: tuple[int, int]) -> Csc:
    """The CSC form of the triplets, sorted by column then row, without stored zeros (cvxpy's
    form). Rows of different blocks never meet, so no entry is summed."""
    rows, cols, vals = (np.concatenate(column) for column in zip(*parts, strict=True))
    kept = vals != 0
    rows, cols, vals = rows[kept], cols[kept], vals[kept]
    order = np.argsort(cols * shape[0] + rows)
    indptr = np.zeros(shape[1] + 1, np.int64)
    np.cumsum(np.bincount(cols, minlength=shape[1]), out=indptr[1:])
    return Csc(vals[order], rows[order], indptr, shape)


def solve_ecos_max_min(
    level: sp.spmatrix, budget: sp.spmatrix, usage: sp.spmatrix, counts: np.ndarray,
    balance: sp.spmatrix | None = None, no_self: sp.spmatrix | None = None,
) -> EcosSolution:
    """The program with the options cvxpy passes ECOS; values, level and duals as cvxpy reads
    them (values without level when ECOS stops at its iteration limit, as cvxpy's ``v.value``
    and ``level.value`` are then)."""
    import _ecos  # ECOS is an optional package (preset "gavel"): loaded when used

    data = ecos_data(level, budget, usage, counts, balance, no_self)
    g = data.g
    # ecos.solve's own unpacking of scipy matrices, without its checks and conversions (the
    # arrays are CSC with int64 indices already, as cvxpy's are).
    shape = (g.shape[0], g.shape[1], 0 if data.a is None else data.a.shape[0])
    args = [shape, data.c, g.data, g.indices, g.indptr, data.h, data.dims]
    if data.a is not None:
        args += [data.a.data, data.a.indices, data.a.indptr, data.b]
    solution = _ecos.csolve(*args, verbose=False)
    info = solution["info"]
    status = ECOS_STATUS.get(info["exitFlag"], "solver_error")
    solve_time_s = float(info["timing"]["tsolve"])
    if status not in _SOLUTION_PRESENT:
        return EcosSolution(None, None, status, solve_time_s=solve_time_s)
    z, y = np.asarray(solution["x"]), np.asarray(solution["z"])
    # v >= 0 projected as cvxpy projects a nonneg variable's value (np.maximum(x, 0))
    values = np.maximum(z[1:], 0.0)
    if not status.startswith("optimal"):  # the iteration limit: cvxpy keeps the iterate, no level
        return EcosSolution(values, None, status, solve_time_s=solve_time_s)
    num_classes, num_vars = level.shape
    start = num_vars  # G's rows: v's sign rows, then the level, time and GPU rows
    return EcosSolution(
        values, float(z[0]), status,
        y[start:start + num_classes], y[start + num_classes:start + 2 * num_classes],
        y[start + 2 * num_classes:start + 2 * num_classes + usage.shape[0]],
        solve_time_s=solve_time_s,
    )
