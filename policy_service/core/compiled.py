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
import threading
from dataclasses import dataclass

import clarabel
import numpy as np

_SETTINGS = clarabel.DefaultSettings()
_SETTINGS.verbose = False

# CLARABEL's statuses, in cvxpy's words (cvxpy's CLARABEL.STATUS_MAP for the ones that carry a
# solution, what solving.STATUS_OF understands); anything else is a failure, as cvxpy makes it.
# compiled_packed.py reads them too.
CLARABEL_STATUS = {
    "Solved": "optimal",
    "AlmostSolved": "optimal_inaccurate",
    "PrimalInfeasible": "infeasible",
    "AlmostPrimalInfeasible": "infeasible_inaccurate",
    "DualInfeasible": "unbounded",
    "AlmostDualInfeasible": "unbounded_inaccurate",
}


def solve_max_min(
    weighted_throughputs: np.ndarray,  # (C, K): fairness coefficient x steps/s, >= 0
    gpus_per_class: np.ndarray,  # (C,)
    counts: np.ndarray,  # (K,)
    allowed: np.ndarray,  # (C, K) bool: where a variable may be positive
) -> tuple[np.ndarray | None, float | None, str]:
    """(x (C, K) or None, the max-min level or None, status in cvxpy's words). x is read-only:
    a program solved again (the same arrays, to the bit) gets the answer kept from the last time
    (``_SOLVED``)."""
    tt = np.maximum(np.asarray(weighted_throughputs, dtype=float), 0.0)
    gpus_per_class = np.asarray(gpus_per_class, dtype=float)
    counts = np.asarray(counts, dtype=float)
    allowed = np.asarray(allowed, dtype=bool)
    key = (tt.shape, tt.tobytes(), gpus_per_class.tobytes(), counts.tobytes(), allowed.tobytes())
    with _SOLVED_LOCK:
        solved = _SOLVED.pop(key, None)
    if solved is None:
        solved = _solve_max_min(tt, gpus_per_class, counts, allowed)
    with _SOLVED_LOCK:
        while len(_SOLVED) >= _KEPT_SOLUTIONS:  # the ones unused longest make room
            del _SOLVED[next(iter(_SOLVED))]
        _SOLVED[key] = solved  # (last: the most recently used)
    return solved


# The programs last solved and their answers, by their arrays' bytes: a simulation meets the same
# program again (~5% of the README sweep point's 9,247 re-solves: the same classes at the same
# counts), and CLARABEL, a deterministic solver, answers the same arrays with the same floats.
# (A lock around the dict's few operations, not the solve: answers may run in threads, answer.py.)
_SOLVED: dict[tuple, tuple[np.ndarray | None, float | None, str]] = {}
_SOLVED_LOCK = threading.Lock()
_KEPT_SOLUTIONS = 64


def _solve_max_min(
    tt: np.ndarray, gpus_per_class: np.ndarray, counts: np.ndarray, allowed: np.ndarray,
) -> tuple[np.ndarray | None, float | None, str]:
    """solve_max_min's solve: one CLARABEL call."""
    num_classes, num_types = tt.shape
    n_x = num_classes * num_types
    a, _ = _constraint_matrix(tt, gpus_per_class)
    b_template, q, cones = _vectors(num_classes, num_types)
    # b: [0 (level rows), N (capacity), 1 (budget), allowed (upper), 0 (lower)]
    b = b_template.copy()
    b[num_classes:num_classes + num_types] = counts
    b[2 * num_classes + num_types:2 * num_classes + num_types + n_x] = allowed.reshape(-1)
    # (vectors as lists: CLARABEL's binding reads a list's floats faster than an array's, Csc)
    solution = clarabel.DefaultSolver(_zeros(n_x + 1), q, a, b.tolist(), cones, _SETTINGS).solve()
    status = CLARABEL_STATUS.get(str(solution.status), "solver_error")
    if not status.startswith("optimal"):
        return None, None, status
    z = np.asarray(solution.x)
    x = z[:n_x].reshape(num_classes, num_types)
    x.setflags(write=False)  # kept in _SOLVED, handed out again
    return x, float(z[-1]), status


@dataclass(frozen=True)
class Csc:
    """A matrix in compressed sparse column form, as CLARABEL reads one (the attributes of a
    scipy ``csc_matrix`` it uses: sorted row indices, no duplicates). Not scipy's own, so that
    the simulator's programs do not load scipy.sparse (policy_service/core/sparse.py);
    tests/unit/policy/test_compiled_matrix.py holds it to scipy's form and CLARABEL to
    accepting it. Arrays or lists: CLARABEL's binding copies either into its own vectors, a
    list's numbers faster (~15 us of a max-min program's ~75 us set-up)."""

    data: np.ndarray | list[float]
    indices: np.ndarray | list[int]
    indptr: np.ndarray | list[int]
    shape: tuple[int, int]
    has_canonical_format: bool = True


def _constraint_matrix(tt: np.ndarray, gpus_per_class: np.ndarray) -> tuple[Csc, int]:
    """A of the program above, rows [level (C), capacity (K), budget (C), upper (C*K), lower
    (C*K)], columns [x (C*K, class-major), t], written column by column in CSC form.

    Each x column has the same five entries, in increasing row order: -TT[c, k] in level row c,
    G[c] in capacity row k, 1 in budget row c, 1 in its upper row, -1 in its lower row; t has a 1
    in every level row. Laid out directly, these are the arrays scipy would produce from the
    (row, column, value) triplets (sorted, no duplicates; zeros kept), in half the time of its
    conversion (0.06 against 0.11 ms at 12 classes) and without scipy:
    tests/unit/policy/test_compiled_matrix.py holds them equal. Everything but TT and G depends
    on the shape alone, so it is laid out once per (C, K) (_layout) and only those two are
    written per solve.
    """
    num_classes, num_types = tt.shape
    n_x = num_classes * num_types
    indices, indptr, constants, num_rows = _layout(num_classes, num_types)
    data = constants.copy()
    values = data[: 5 * n_x].reshape(n_x, 5)
    values[:, 0] = -tt.reshape(-1)
    values[:, 1] = np.repeat(gpus_per_class, num_types)
    return Csc(data.tolist(), indices, indptr, (num_rows, n_x + 1)), num_rows


@functools.lru_cache(maxsize=256)
def _layout(num_classes: int, num_types: int) -> tuple[list[int], list[int], np.ndarray, int]:
    """(row indices, column pointers, the data's constant entries with zeros where TT and G go,
    number of rows) of _constraint_matrix's A at one shape, the indices as lists (Csc). Never
    written: CLARABEL copies what it reads, and a simulation solves a few dozen shapes hundreds
    of times."""
    n_x = num_classes * num_types
    capacity, budget = num_classes, num_classes + num_types
    upper = budget + num_classes
    lower = upper + n_x
    cell = np.arange(n_x)
    row_of_cell = cell // num_types
    indices = np.empty(5 * n_x + num_classes, dtype=np.int64)
    data = np.zeros(len(indices))
    per_cell = indices[: 5 * n_x].reshape(n_x, 5)
    per_cell[:, 0] = row_of_cell
    per_cell[:, 1] = capacity + cell % num_types
    per_cell[:, 2] = budget + row_of_cell
    per_cell[:, 3] = upper + cell
    per_cell[:, 4] = lower + cell
    indices[5 * n_x:] = np.arange(num_classes)
    values = data[: 5 * n_x].reshape(n_x, 5)
    values[:, 2] = 1.0
    values[:, 3] = 1.0
    values[:, 4] = -1.0
    data[5 * n_x:] = 1.0
    indptr = np.append(np.arange(0, 5 * n_x + 1, 5), 5 * n_x + num_classes)
    data.setflags(write=False)
    return indices.tolist(), indptr.tolist(), data, lower + n_x


@functools.lru_cache(maxsize=256)
def _vectors(num_classes: int, num_types: int) -> tuple[np.ndarray, list[float], list]:
    """The program's vectors at one shape, made once: b with zeros and ones where they are
    constant (a solve copies it and writes the counts and the upper bounds), q (maximise t, a
    list: Csc) and the cone. Never written: CLARABEL copies what it reads."""
    n_x = num_classes * num_types
    b = np.zeros(2 * num_classes + num_types + 2 * n_x)
    b[num_classes + num_types:2 * num_classes + num_types] = 1.0
    q = np.zeros(n_x + 1)
    q[-1] = -1.0  # maximise t
    b.setflags(write=False)
    return b, q.tolist(), [clarabel.NonnegativeConeT(len(b))]


@functools.lru_cache(maxsize=64)
def _zeros(n: int) -> Csc:
    """The (n, n) zero objective matrix of an LP, made once per size, as lists (Csc; CLARABEL
    copies what it reads; nothing writes it)."""
    return Csc([], [], [0] * (n + 1), (n, n))

