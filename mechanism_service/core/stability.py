"""Among the allocations that give every job what the policy's answer gives it, the one that
keeps each job on the type it ran on (issue 12's third piece of migration-aware rounds,
docs/mechanism.md "What a move costs").

A policy's optimum is rarely unique. Max-min fairness fixes the lowest level and little else,
and jobs with the same throughputs are interchangeable: the simulator's policies solve one row
per class of such jobs, so every member of a class gets the same split, say 0.3 of a V100 and
0.2 of a P100, and the priorities then realise the split by moving each member between the two
types round after round. Those members could as well be split between them (some all on V100,
the others all on P100): the same time on each type, the same throughput for every job.

``steady_allocation`` re-solves the answer's single-job entries as a small LP:

    maximise   sum_j  T[j, home_j] x[j, home_j] / L_j      (the share of each job's work done on
                                                             its home type, every job weighted alike)
    subject to (1 - tol) L_j <= sum_k T[j, k] x[j, k] <= L_j (each job's throughput as the answer's,
                                                             L_j = sum_k T[j, k] a[j, k])
               sum_k x[j, k] <= 1 - its time in pairs
               sum_j s_j x[j, k] <= N_k - the pairs' GPUs on k
               x >= 0, x[j, k] = 0 where the answer gives the job no time

where ``home_j`` is the type the installed allocation (the last answer, re-laid) gives the job
most time on, else (a new job) the type the answer gives it most time on: among the answers
that give every job what this one gives it, the one closest to the last. Every job keeps its
throughput (to ``tol``), so every objective that is a function of the jobs' throughputs
(max-min fairness, finish-time fairness, total throughput) keeps its value: the policy's answer
is only re-laid over the types. Packed pairs are kept as the answer gives them. A simplex
(HiGHS, dual) returns a vertex, so few jobs stay split. If the LP is not solved the answer is
kept as it is. When every job's whole level fits on its home type, that is the LP's only
optimum and it is returned without a solve (``_all_on_home``).

Pure: values in, values out (the state is read, never written).
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Iterable, Mapping
from typing import Literal, overload

import numpy as np

from mechanism_service.core.model import Entry, MechanismState, share_matrix

Allocation = dict[Entry, dict[str, float]]

# A share below this is the solver's noise, not time the policy gives the job on the type.
SUPPORT_SHARE = 1e-6
# A share the LP returns at or below this is its noise: no time on the type.
_ZERO_SHARE = 1e-9


@overload
def steady_allocation(
    state: MechanismState, answer: Allocation, tolerance: float, max_split_jobs: int | None = None,
    *, columns: tuple[np.ndarray, np.ndarray] | None = None, with_shares: Literal[False] = False,
) -> Allocation: ...


@overload
def steady_allocation(
    state: MechanismState, answer: Allocation, tolerance: float, max_split_jobs: int | None = None,
    *, columns: tuple[np.ndarray, np.ndarray] | None = None, with_shares: Literal[True],
) -> tuple[Allocation, np.ndarray | None]: ...


def steady_allocation(
    state: MechanismState, answer: Allocation, tolerance: float, max_split_jobs: int | None = None,
    *, columns: tuple[np.ndarray, np.ndarray] | None = None, with_shares: bool = False,
) -> Allocation | tuple[Allocation, np.ndarray | None]:
    """``answer`` with its single-job entries re-laid so each job runs on its home type as much
    as its throughput allows (module docstring); the state's ``allocation`` is the one installed
    before this answer. An answer that splits more than ``max_split_jobs`` jobs over several
    types is returned as it is: the LP's cost grows faster than its size, and it is paid inside
    a round boundary (docs/mechanism.md, "A boundary at cluster scale"). ``columns``: the
    answer's entries' ledger rows (-1: none) and shares over the ledgers' types, in the answer's
    order (reducers.allocation_columns), when the caller has them; gathered here otherwise.
    Returns ``answer`` itself when nothing is re-laid. ``with_shares``: a pair, the allocation
    and, when it is re-laid, its shares over the ledgers' types row for row as ``columns`` (the
    same floats as share_matrix of it: the re-laid rows are the solved shares, 0.0 where the dict
    names none; None when nothing is re-laid), so the caller need not gather them again."""
    relaid, shares = _steady(state, answer, tolerance, max_split_jobs, columns)
    return (relaid, shares) if with_shares else relaid


def _steady(
    state: MechanismState, answer: Allocation, tolerance: float, max_split_jobs: int | None,
    columns: tuple[np.ndarray, np.ndarray] | None,
) -> tuple[Allocation, np.ndarray | None]:
    """steady_allocation's work: the allocation and its shares (None when nothing is re-laid)."""
    types = list(state.gpus)
    ledgers = state.entries
    count = len(answer)
    if columns is None:
        columns = (
            np.fromiter(map(ledgers.row_of.get, answer, itertools.repeat(-1)), np.intp, count),
            share_matrix(list(answer.values()), ledgers.types),
        )
    answer_rows, answer_shares = columns
    # the single-job entries the answer gives some share (an empty one gives none): every entry,
    # most often (an unpacked policy's answer gives each job some time), told without an array
    every_single = count > 0 and set(map(len, answer)) == {1} and all(answer.values())
    if every_single:
        lengths = None
        chosen = _positions(count)
    else:
        lengths = np.fromiter(map(len, answer), np.intp, count)
        given = np.fromiter(map(bool, answer.values()), bool, count)
        single = (lengths == 1) & given
        chosen = single.nonzero()[0]
    if not len(chosen) or len(types) < 2:
        return answer, None
    # (every entry: the rows and shares as given, the same values as gathered, C-ordered alike)
    whole = every_single and answer_shares.flags.c_contiguous
    rows = answer_rows if whole else answer_rows[chosen]
    columns_of_types = _columns_of(tuple(ledgers.types), tuple(types))
    rates = ledgers.throughputs[rows[:, None], columns_of_types, 0]
    # (Column-major, as the column gather makes it: the sums over jobs below add in that order,
    # and the LP's bounds are the same floats only when they do.)
    shares = (answer_shares if whole else answer_shares[chosen])[:, columns_of_types]
    runs = rates > 0.0
    if (rows < 0).any():  # an entry whose job left since the request runs nowhere
        runs &= (rows >= 0)[:, None]
    rates = np.where(runs, rates, 0.0)
    # Only the types the answer gives a job: a job is never moved to a type where the policy
    # found it comparatively slow (a short job held on its slowest type loses the most).
    support = (shares > SUPPORT_SHARE) & runs
    types_given = support.sum(axis=1)
    split = int(np.count_nonzero(types_given >= 2))
    if split == 0 or (max_split_jobs is not None and split > max_split_jobs):
        return answer, None  # no job is split (nothing to re-lay), or too many to re-lay in a boundary
    singles = list(answer) if every_single else list(itertools.compress(answer, single.tolist()))
    laid = types_given > 0  # every job the answer gives time
    scale = np.fromiter(map(_SCALE, map(state.jobs.__getitem__, map(_FIRST, singles))), float, len(singles))
    budget = np.ones(len(singles))
    capacity = np.fromiter(map(state.gpus.__getitem__, types), float, len(types))
    if not every_single:
        paired = ((lengths == 2) & given).tolist()
        if any(paired):  # pairs stay as they are: what they take is not offered
            _take_pairs(state, answer, paired, singles, types, budget, capacity)
    used = scale[:, None] * shares
    # The answer itself must be feasible (a solver's answer may overshoot by its tolerance).
    budget = np.maximum(budget, shares.sum(axis=1))
    capacity = np.maximum(capacity, used.sum(axis=0))
    everyone = bool(laid.all())
    if not everyone:
        capacity = capacity - used[~laid].sum(axis=0)
    most_given = shares.argmax(axis=1)
    home = _home_types(state, singles, rows, most_given, types, columns_of_types)
    home = np.where(support[_positions(len(home)), home], home, most_given)
    levels = (rates * shares).sum(axis=1)
    problem = (
        (rates, levels, budget, scale, capacity, support, home) if everyone
        else (rates[laid], levels[laid], budget[laid], scale[laid], capacity, support[laid], home[laid])
    )
    solved = _all_on_home(*problem)
    if solved is None:
        solved = _solve(*problem, tolerance)
    if solved is None:
        return answer, None
    relaid = singles if everyone else list(itertools.compress(singles, laid.tolist()))
    # Each job's positive shares: a solved share is > _ZERO_SHARE or exactly 0.0, so its truth
    # is "> 0.0" (compress in C, ~30% less than a comprehension's test).
    solved_rows = solved.tolist()
    relaid_shares = map(dict, map(itertools.compress, map(zip, itertools.repeat(types), solved_rows), solved_rows))
    # The re-laid rows' shares: a share the dict does not name is 0.0, and a ledger type outside
    # ``types`` is named by none.
    if whole and everyone:  # every entry re-laid: the answer's entries in its order, all new
        out = dict(zip(relaid, relaid_shares, strict=True))
        out_shares = np.zeros_like(answer_shares)
        out_shares[:, columns_of_types] = solved
        return out, out_shares
    out = dict(answer)
    out.update(zip(relaid, relaid_shares, strict=True))
    out_shares = answer_shares.copy()
    positions = chosen if everyone else chosen[laid]
    out_shares[positions] = 0.0
    out_shares[positions[:, None], columns_of_types] = solved
    return out, out_shares


_SCALE = operator.attrgetter("scale_factor")
_FIRST = operator.itemgetter(0)


@functools.lru_cache(maxsize=256)
def _positions(n: int) -> np.ndarray:
    """np.arange(n), made once per n (read-only: only ever an index)."""
    positions = np.arange(n)
    positions.setflags(write=False)
    return positions


@functools.lru_cache(maxsize=64)
def _columns_of(ledger_types: tuple[str, ...], types: tuple[str, ...]) -> np.ndarray:
    """(K,) the ledgers' column of each of ``types`` (Ledgers.column_of: a type's position in
    the ledgers' types), made once per pair of orders (read-only)."""
    column_of = {w: k for k, w in enumerate(ledger_types)}
    columns = np.fromiter(map(column_of.__getitem__, types), np.intp, len(types))
    columns.setflags(write=False)
    return columns


def _take_pairs(
    state: MechanismState, answer: Allocation, paired: list[bool], singles: list[Entry], types: list[str],
    budget: np.ndarray, capacity: np.ndarray,
) -> None:
    """Take the answer's packed pairs' time out of ``capacity`` (each type's GPUs) and
    ``budget`` (each single job's time), in place, pair after pair in the answer's order."""
    index = {e[0]: r for r, e in enumerate(singles)}
    for entry in itertools.compress(answer, paired):
        by_type = answer[entry]
        taken = np.array([by_type.get(w, 0.0) for w in types])
        capacity -= taken * state.jobs[entry[0]].scale_factor
        for j in entry:
            if j in index:
                budget[index[j]] -= taken.sum()


def _all_on_home(
    rates: np.ndarray, levels: np.ndarray, budget: np.ndarray, scale: np.ndarray, capacity: np.ndarray,
    support: np.ndarray, home: np.ndarray,
) -> np.ndarray | None:
    """The LP's optimum without the LP when every job fits on its home type, else None.

    A job's term in the objective, T[j, home] x[j, home] / L_j, is at most 1 (its level row), so
    the objective is at most the number of jobs, reached only with every job's whole level on
    its home type and nothing elsewhere: x[j, home] = L_j / T[j, home]. When that fits every
    job's time and every type's GPUs it is the LP's only optimum. (HiGHS returns it to within its
    tolerances, ~1e-9 relative; here it is exact.) About one answer in ten on the calibration
    trace, and each skips a solve (~1 ms, most of it HiGHS' set-up)."""
    n, num_types = rates.shape
    jobs = _positions(n)
    if not support[jobs, home].all():
        return None
    need = levels / rates[jobs, home]  # the time on its home type that gives a job its whole level
    on_home = np.bincount(home, weights=scale * need, minlength=num_types)
    if (need > budget).any() or (on_home > capacity).any() or (need <= _ZERO_SHARE).any():
        return None
    x = np.zeros((n, num_types))
    x[jobs, home] = need
    return x


def _home_types(
    state: MechanismState, singles: list[Entry], rows: np.ndarray, most_given: np.ndarray, types: list[str],
    columns_of_types: np.ndarray,
) -> np.ndarray:
    """(n,) the column of each job's home type: where the installed allocation gives it most
    time, else (a new job) where the answer does. The installed allocation, not the type the job
    ran on last round: a round's type is the realisation of a split, and pulling a job towards it
    drags short jobs onto their slow type when that round happened to be there (on the
    continuous trace, worst FTF ratio 1.37 against 1.10, average JCT 0.5% higher).

    Read from the ledgers' columnar copy of the installed allocation when they hold it (every
    boundary after the first) and its columns are the types; a job whose most time is on two
    types alike takes the first its allocation names, as the allocation's own order says."""
    installed = state.allocation
    ledgers = state.entries
    home = most_given  # ``most_given``: (n,) the column the answer gives each job most time on
    if ledgers.allocation_of is not installed or len(ledgers.types) != len(types) or (rows < 0).any():
        return _home_types_of(installed, singles, range(len(singles)), types, home)
    held = ledgers.allocation[rows][:, columns_of_types]
    best = held.argmax(axis=1)
    most = held[_positions(len(best)), best]
    home = np.where(most > 0.0, best, home)
    tied = (most > 0.0) & ((held == most[:, None]).sum(axis=1) > 1)
    if tied.any():
        home = _home_types_of(installed, singles, tied.nonzero()[0].tolist(), types, home)
    return home


def _home_types_of(
    installed: Allocation, singles: list[Entry], which: Iterable[int], types: list[str], home: np.ndarray,
) -> np.ndarray:
    """``home`` with the jobs ``which`` (positions in ``singles``) given the type their installed
    allocation gives most time, the first it names among equals."""
    column = {w: k for k, w in enumerate(types)}
    home = home.copy()
    for r in which:
        before: Mapping[str, float] = installed.get(singles[r], {})
        if before:
            w = max(before, key=before.__getitem__)
            if before[w] > 0.0 and w in column:
                home[r] = column[w]
    return home


@functools.cache
def _highs():  # noqa: ANN202 - highspy is imported lazily
    """One solver object for every re-lay (setting its options cost more than a small solve);
    each solve passes its whole model, so nothing carries over but the options: the same model
    gives the same vertex whatever was solved before."""
    import highspy  # noqa: PLC0415

    highs = highspy._Highs()  # the raw model: highspy.Highs prints a banner on stdout
    highs.setOptionValue("output_flag", False)
    highs.setOptionValue("solver", "simplex")
    return highs


@functools.lru_cache(maxsize=64)
def _structure(n: int, num_types: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The LP's arrays that depend on its shape only, made once a shape (the simulator's answers
    have a few dozen shapes): column starts, row indices, zero lower bounds, integrality (all
    continuous). Read-only: HiGHS copies what it is passed."""
    cells = n * num_types  # column x[j, k] = cell j * K + k
    # Rows: levels (n), budgets (n), capacities (K). Every column has three entries, in row
    # order (level j, budget n + j, capacity 2n + k): the column-wise matrix is written directly.
    job_of, type_of = np.divmod(np.arange(cells, dtype=np.int32), np.int32(num_types))
    index = np.stack([job_of, n + job_of, 2 * n + type_of], axis=1).reshape(-1)
    start = np.arange(0, 3 * cells + 1, 3, dtype=np.int32)
    arrays = (start, index, np.zeros(cells), np.zeros(cells, dtype=np.int32))
    for array in arrays:
        array.setflags(write=False)
    return arrays


@functools.lru_cache(maxsize=64)
def _shape_arrays(n: int, num_types: int, tolerance: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The LP's arrays that depend on its shape and tolerance only, made once (like
    ``_structure``): row lower bounds, the level rows' upper bounds (ones), each job's first
    cell (j * K), and the coefficients' template, (n, K, 3) with every budget coefficient 1.0
    (the rest filled per solve). Read-only: HiGHS copies what it is passed, a solve copies the
    template."""
    row_lower = np.full(2 * n + num_types, -_INF)
    # A job's throughput stays within [1 - tol, 1] of the answer's: more on its home type would
    # be time taken from the others' share of the GPUs, not the answer re-laid.
    row_lower[:n] = 1.0 - tolerance
    value_template = np.empty((n, num_types, 3))
    value_template[:, :, 1] = 1.0
    arrays = (row_lower, np.ones(n), np.arange(n) * num_types, value_template)
    for array in arrays:
        array.setflags(write=False)
    return arrays


def _solve(
    rates: np.ndarray, levels: np.ndarray, budget: np.ndarray, scale: np.ndarray, capacity: np.ndarray,
    support: np.ndarray, home: np.ndarray, tolerance: float,
) -> np.ndarray | None:
    """The LP of the module docstring, one HiGHS dual simplex: (n, K) or None. The model goes to
    HiGHS as arrays (passModel's column-wise form), the same model as a HighsLp built field by
    field, without the per-field conversions."""
    import highspy  # noqa: PLC0415 - only a mechanism that re-lays allocations loads the solver

    n, num_types = rates.shape
    relative = rates / levels[:, None]  # a job's throughput per unit of time, as a share of its level
    cells = n * num_types
    start, index, zeros, continuous = _structure(n, num_types)
    row_lower, ones, job_cells, value_template = _shape_arrays(n, num_types, tolerance)
    value = value_template.copy()  # each column's (level, budget, capacity) coefficients
    value[:, :, 0] = relative
    value[:, :, 2] = scale[:, None]
    cost = np.zeros(cells)
    home_cells = job_cells + home
    cost[home_cells] = -relative.reshape(-1)[home_cells]  # HiGHS minimises
    row_upper = np.concatenate((ones, budget, capacity))
    highs = _highs()
    status = highs.passModel(
        cells, 2 * n + num_types, 3 * cells, _COLWISE, _MINIMIZE, 0.0, cost, zeros, support.reshape(-1).astype(float),
        row_lower, row_upper, start, index, value.reshape(-1), continuous,
    )
    if status == highspy.HighsStatus.kError:
        return None
    highs.run()
    if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    x = np.asarray(highs.getSolution().col_value).reshape(n, num_types)
    return np.where(x > _ZERO_SHARE, x, 0.0)


_COLWISE = 1  # highspy.MatrixFormat.kColwise
_INF = float("inf")  # highspy.kHighsInf
_MINIMIZE = 1  # highspy.ObjSense.kMinimize
