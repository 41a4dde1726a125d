"""The max-min program of fairness.MaxMinFairness._restricted handed to ECOS without cvxpy.

Preset "gavel" solves Gavel's programs as Gavel does: per-job (and per-job-pair) variables, ECOS
through cvxpy. At Gavel's README scale (a 5,500-job trace on 36:36:36, ~17 jobs a program) a
simulation solves ~6,600 of them; ECOS itself was ~0.2 ms of each ~5.7 ms, the rest cvxpy
canonicalising the same five matrix products every time.

cvxpy lays the program out for ECOS as it does for CLARABEL (compiled_packed.standard_form:
columns [t, v]; rows the equalities, v's sign rows, the level, time and GPU rows, the no-self
rows), then splits it: the equality rows are ECOS's A, b, the others its G, h (one nonnegative
cone, no second-order or exponential cone). Here the same arrays, laid out from the Space's
entries in one sort, go to ECOS's C entry point with the options cvxpy gives it (verbose off,
nothing else), so ECOS runs the same iterations and the allocations are the cvxpy path's to the
last bit; the answer is read back as cvxpy reads it (a nonnegative variable's value clipped at
0, the inequality rows' duals as ECOS returns them, ECOS's exit flags in cvxpy's words).
tests/unit/policy/test_compiled_ecos.py holds the arrays to cvxpy's ``get_problem_data(cp.ECOS)``
and the answers to cvxpy's, on random problems.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from policy_service.core.compiled import Csc
from policy_service.core.compiled_packed import PackedSolution
from policy_service.core.sparse import sp

if TYPE_CHECKING:
    from policy_service.core.formulation import Space

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
    """ECOS's standard form: minimise c'z s.t. G z + s = h, s >= 0, A z = b (A, b None when there
    are no equalities, as cvxpy passes them), in CSC form; z = [t, v]. G's rows: v's sign rows,
    then ``num_classes`` level rows, ``num_classes`` time rows, ``num_types`` GPU rows, the
    no-self rows."""

    c: np.ndarray
    g: Csc
    h: np.ndarray
    a: Csc | None
    b: np.ndarray | None
    num_classes: int
    num_types: int

    @property
    def dims(self) -> dict[str, object]:
        """The cone sizes as cvxpy hands them to ecos.solve (its dims_to_solver_dict)."""
        return {"l": self.g.shape[0], "q": [], "e": 0}


@dataclass(frozen=True)
class EcosSolution(PackedSolution):
    """PackedSolution, with ECOS's own time (what cvxpy reports as solver_stats.solve_time)."""

    solve_time_s: float = float("nan")


Triplets = tuple[np.ndarray, np.ndarray, np.ndarray]  # (rows, columns, values)


def space_ecos_data(space: Space, class_coefficients: np.ndarray) -> EcosData:
    """``ecos_data`` of the program over ``space`` whose level matrix is diag(class_coefficients)
    times ``space.throughput()``: ``entry_layout``, or from the matrices where it gives way."""
    data = entry_layout(space, class_coefficients)
    if data is not None:
        return data
    level_matrix = sp.diags(class_coefficients) @ space.throughput()
    return ecos_data(level_matrix, space.budget, space.usage, space.problem.worker_counts, space.balance, space.no_self)


def entry_layout(space: Space, class_coefficients: np.ndarray) -> EcosData | None:
    """The same arrays laid out from the space's entries without building its matrices
    (scipy's construction of the three cost more than ECOS's solve of preset gavel's programs).
    Each entry is the number the matrices hold: the matrix product's only term per entry is
    coefficient x steps/s. None when a (row, column) repeats: scipy sums those in the matrices
    (no Space has one today)."""
    level_rows, level_cols, level_vals = (np.concatenate(part) for part in space.throughput_triplets())
    level = (level_rows, level_cols, class_coefficients[level_rows] * level_vals)
    budget, usage = (tuple(np.concatenate(part) for part in parts) for parts in (space.budget_triplets, space.usage_triplets))
    return _lay_out(
        level, budget, usage, space.num_classes, space.num_vars, space.problem.worker_counts, space.balance, space.no_self
    )


def ecos_data(
    level: sp.spmatrix, budget: sp.spmatrix, usage: sp.spmatrix, counts: np.ndarray,
    balance: sp.spmatrix | None = None, no_self: sp.spmatrix | None = None,
) -> EcosData:
    """The arrays cvxpy's ECOS interface builds for the program over these matrices (the test
    compares each): compiled_packed.standard_form's matrix split at the equality rows,
    assembled in one sort instead of scipy's stacking and conversions."""
    data = _lay_out(
        _triplets(level), _triplets(budget), _triplets(usage), level.shape[0], level.shape[1], counts, balance, no_self
    )
    assert data is not None, "a canonical CSR matrix repeats no (row, column)"
    return data


def _lay_out(
    level: Triplets, budget: Triplets, usage: Triplets, num_classes: int, num_vars: int, counts: np.ndarray,
    balance: sp.spmatrix | None, no_self: sp.spmatrix | None,
) -> EcosData | None:
    """EcosData from the blocks' entries (columns of v), or None when an entry repeats."""
    num_types = len(counts)
    num_ineq = num_vars + 2 * num_classes + num_types
    # G's rows over z = [t, v]: v's sign rows (-v <= 0), the level rows (t - level v <= 0), the
    # time and GPU rows, the no-self rows; each part (rows, columns of z, values).
    parts = [
        (np.arange(num_vars), np.arange(1, num_vars + 1), np.full(num_vars, -1.0)),
        (num_vars + np.arange(num_classes), np.zeros(num_classes, np.int64), np.ones(num_classes)),
        (num_vars + level[0], level[1] + 1, -level[2]),
        (num_vars + num_classes + budget[0], budget[1] + 1, budget[2]),
        (num_vars + 2 * num_classes + usage[0], usage[1] + 1, usage[2]),
    ]
    if no_self is not None and no_self.shape[0]:
        rows, cols, vals = _triplets(no_self)
        parts.append((num_ineq + rows, cols + 1, vals))
        num_ineq += no_self.shape[0]
    h = np.zeros(num_ineq)
    h[num_vars + num_classes:num_vars + 2 * num_classes] = 1.0
    h[num_vars + 2 * num_classes:num_vars + 2 * num_classes + num_types] = counts
    c = np.zeros(num_vars + 1)
    c[0] = -1.0  # maximise t
    g = _csc(parts, (num_ineq, num_vars + 1))
    if g is None:
        return None
    if balance is None or not balance.shape[0]:
        return EcosData(c, g, h, None, None, num_classes, num_types)
    rows, cols, vals = _triplets(balance)
    a = _csc([(rows, cols + 1, vals)], (balance.shape[0], num_vars + 1))
    return EcosData(c, g, h, a, np.zeros(balance.shape[0]), num_classes, num_types)


def _triplets(block: sp.spmatrix) -> Triplets:
    """(rows, columns, values) of a sparse matrix, duplicates summed as scipy sums them."""
    block = block if block.format == "csr" else block.tocsr()  # (the Space's blocks are CSR already)
    if not block.has_canonical_format:
        block = block.copy()
        block.sum_duplicates()
    rows = np.repeat(np.arange(block.shape[0]), np.diff(block.indptr))
    return rows, block.indices.astype(np.int64), block.data


def _csc(parts: list[Triplets], shape: tuple[int, int]) -> Csc | None:
    """The CSC form of the entries, sorted by column then row, without stored zeros (cvxpy's
    form); None when a (row, column) repeats (the blocks' rows never meet: only a block's own
    entries can)."""
    rows, cols, vals = (np.concatenate(column) for column in zip(*parts, strict=True))
    keys = cols * shape[0] + rows
    order = np.argsort(keys)
    keys = keys[order]
    if len(keys) > 1 and not (keys[1:] != keys[:-1]).all():
        return None
    rows, cols, vals = rows[order], cols[order], vals[order]
    kept = vals != 0
    indptr = np.zeros(shape[1] + 1, np.int64)
    np.cumsum(np.bincount(cols[kept], minlength=shape[1]), out=indptr[1:])
    return Csc(vals[kept], rows[kept], indptr, shape)


def solve_ecos(data: EcosData) -> EcosSolution:
    """The program with the options cvxpy passes ECOS; values, level and duals as cvxpy reads
    them (values without level when ECOS stops at its iteration limit, as cvxpy's ``v.value``
    and ``level.value`` are then)."""
    import _ecos  # ECOS is an optional package (preset "gavel"): loaded when used

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
    level_rows = len(values)  # after v's sign rows: the level, time and GPU rows
    time_rows, gpu_rows = level_rows + data.num_classes, level_rows + 2 * data.num_classes
    return EcosSolution(
        values, float(z[0]), status, y[level_rows:time_rows], y[time_rows:gpu_rows],
        y[gpu_rows:gpu_rows + data.num_types], solve_time_s=solve_time_s,
    )
