"""The packing candidates of a Problem (its Colocation), as build_problem (validation.py) takes
them, in its order of precedence: pairs listed job by job (``colocation_from_pairs``), class
colocations (``validate_colocations``, then ``colocation_from_classes``: an estimator's fractions
per pair of colocation classes, applied to each job's own row), or Gavel's throughput table
(``colocation_from_table``). Each check names the JSON path of the offending field, as
validation.py's do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from common.errors import ProblemError
from common.job_checks import check_number
from common.throughputs import ThroughputTable
from policy_service.core.grouping import group_jobs
from policy_service.core.packing import class_fraction_table
from policy_service.core.problem import ClassPairSpec, Colocation, PairSpec, _readonly

# A colocation fraction is the share of its isolated steps/s a job keeps when packed: in [0, 1].
# Up to 1 + 1e-6 is accepted as rounding (packed / alone computed in floating point can land an
# ulp above 1) and kept as given; more is refused: packing never speeds a job up in this model
# (the estimator clips to 1), and a value like 3.1 is most likely steps/s sent for a fraction.
MAX_COLOCATION_FRACTION = 1.0 + 1e-6


def colocation_from_pairs(
    pairs: Sequence[PairSpec], index: Mapping[str, int], scale_factors: np.ndarray,
    worker_types: tuple[str, ...],
) -> Colocation:
    """Pairs listed job by job: one colocation key per job (its row)."""
    num_jobs, num_types = len(scale_factors), len(worker_types)
    if isinstance(pairs, (tuple, list)) and not pairs:  # no packing (the usual request)
        return Colocation.empty(num_jobs, num_types)
    rows: dict[tuple[int, int], np.ndarray] = {}
    for p, pair in enumerate(pairs):
        path = f"pairs[{p}]"
        if len(pair.job_ids) != 2:
            raise ProblemError(f"{path}.jobs: expected exactly two job ids, got {len(pair.job_ids)}")
        for job_id in pair.job_ids:
            if job_id not in index:
                raise ProblemError(f"{path}.jobs: unknown job id {job_id!r}")
        a, b = index[pair.job_ids[0]], index[pair.job_ids[1]]
        if a == b:
            raise ProblemError(f"{path}.jobs: a job cannot be packed with itself ({pair.job_ids[0]!r})")
        if scale_factors[a] != scale_factors[b]:
            raise ProblemError(
                f"{path}.jobs: jobs {pair.job_ids[0]!r} and {pair.job_ids[1]!r} have different "
                f"scale factors ({scale_factors[a]} and {scale_factors[b]}); only equal gangs share GPUs"
            )
        key = (min(a, b), max(a, b))
        if key in rows:
            raise ProblemError(f"{path}.jobs: duplicate pair {pair.job_ids[0]!r}, {pair.job_ids[1]!r}")
        given = pair.throughputs_steps_per_s
        if not isinstance(given, Mapping):
            raise ProblemError(f"{path}.throughputs: expected an object of worker type -> [steps/s, steps/s]")
        values = np.zeros((num_types, 2))
        for name, value in given.items():
            if name not in worker_types:
                raise ProblemError(f"{path}.throughputs.{name}: not a worker type of this cluster")
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
                raise ProblemError(f"{path}.throughputs.{name}: expected [first job's, second job's] steps/s")
            k = worker_types.index(name)
            values[k, 0] = check_number(value[0], f"{path}.throughputs.{name}[0]")
            values[k, 1] = check_number(value[1], f"{path}.throughputs.{name}[1]")
        rows[key] = values if a < b else values[:, ::-1]
    order = sorted(rows)
    key_pairs = np.asarray(order, dtype=np.int64).reshape(-1, 2)
    table = np.asarray([rows[key] for key in order]).reshape(-1, num_types, 2)
    key_of_job = np.full(num_jobs, -1, dtype=np.int64)
    key_of_job[np.unique(key_pairs)] = np.unique(key_pairs)
    return Colocation(_readonly(key_of_job), _readonly(key_pairs), _readonly(table))


def colocation_from_table(
    job_types: tuple[str | None, ...], scale_factors: np.ndarray, worker_types: tuple[str, ...],
    table: ThroughputTable,
) -> Colocation:
    """Gavel's packing candidates: any two jobs with the same scale factor, looked up by job type.

    One key per (job type, scale factor) present, numbered in the order the jobs name them; a
    self pair (a, a) is symmetrised (the mean of the two positions) so that jobs of one key stay
    interchangeable — Gavel's table is already symmetric, so this changes nothing there. Key
    pairs (a, b), a <= b, in that order, each listed when the table lists the two types together
    on some worker type.

    The table's look-ups are made once a key pair and kept (_pair_lookups), and the key pairs
    laid out with numpy.
    """
    sf_list = scale_factors.tolist()
    named = list(zip(job_types, sf_list))
    keys = dict.fromkeys(named)  # the keys, in the order the jobs first name them
    number = {key: a for a, key in enumerate(keys)}
    key_of_job = np.fromiter(map(number.__getitem__, named), np.int64, len(named))
    by_key = list(keys)
    num_types = len(worker_types)
    steps, listed, where = _pair_lookups(table, worker_types, by_key)
    at = np.fromiter(map(where.__getitem__, by_key), np.int64, len(by_key))
    a, b = np.triu_indices(len(by_key))  # (a, b), a <= b, a then b ascending: the loop's order
    kept = listed[at[a], at[b]]
    a, b = a[kept], b[kept]
    values = steps[at[a], at[b]]  # (P, K, 2), a's steps/s then b's
    same = a == b
    if same.any():
        values[same] = np.broadcast_to(values[same].mean(axis=2, keepdims=True), values[same].shape)
    return Colocation(
        key_of_job=_readonly(key_of_job),
        key_pairs=_readonly(np.stack([a, b], axis=1).astype(np.int64).reshape(-1, 2)),
        throughputs_steps_per_s=_readonly(np.ascontiguousarray(values, dtype=float).reshape(-1, num_types, 2)),
    )


class _Lookups:
    """The table's packed steps/s for every ordered pair of the keys seen so far on one table
    and set of worker types: steps[i, j] (K, 2), (i's, j's) on each type (0.0 where none);
    listed[i, j]: whether the table lists the pair on some type (never for different scale
    factors); where: key -> its index. Grown when a key is first seen (its row and column
    only); never changed otherwise."""

    __slots__ = ("listed", "steps", "table", "where", "worker_types")

    def __init__(self, table: ThroughputTable, worker_types: tuple[str, ...]) -> None:
        self.table, self.worker_types = table, worker_types
        self.where: dict[tuple[str | None, int], int] = {}
        self.steps = np.zeros((0, 0, len(worker_types), 2))
        self.listed = np.zeros((0, 0), dtype=bool)

    def add(self, new: list[tuple[str | None, int]]) -> None:
        old = len(self.where)
        for key in new:
            self.where[key] = len(self.where)
        keys = list(self.where)
        count = len(keys)
        steps = np.zeros((count, count, len(self.worker_types), 2))
        listed = np.zeros((count, count), dtype=bool)
        steps[:old, :old], listed[:old, :old] = self.steps, self.listed
        for i, (type_i, sf_i) in enumerate(keys):
            for j in range(old if i < old else 0, count):  # the pairs with a new key, both orders
                type_j, sf_j = keys[j]
                if sf_i != sf_j:
                    continue
                for k, name in enumerate(self.worker_types):
                    entry = self.table.pair(type_i, type_j, sf_i, name)  # type: ignore[arg-type]
                    if entry is not None:
                        steps[i, j, k] = entry
                        listed[i, j] = True
        self.steps, self.listed = steps, listed


# (id(table), worker types) -> its _Lookups (which holds the table: its id is not reused while
# it is here); the oldest dropped past _LOOKUPS_KEPT
_LOOKUPS: dict[tuple[int, tuple[str, ...]], _Lookups] = {}
_LOOKUPS_KEPT = 16


def _pair_lookups(
    table: ThroughputTable, worker_types: tuple[str, ...], keys: list[tuple[str | None, int]]
) -> tuple[np.ndarray, np.ndarray, dict[tuple[str | None, int], int]]:
    """(steps, listed, where) of _Lookups covering ``keys``, for this table and worker types:
    a simulation asks at every re-solve for nearly the same few dozen keys (~80^2 look-ups,
    ~5 ms a solve when made each time)."""
    lookups = _LOOKUPS.get((id(table), worker_types))
    if lookups is None or lookups.table is not table:
        if len(_LOOKUPS) >= _LOOKUPS_KEPT:
            del _LOOKUPS[next(iter(_LOOKUPS))]
        lookups = _LOOKUPS[(id(table), worker_types)] = _Lookups(table, worker_types)
    new = [key for key in keys if key not in lookups.where]
    if new:
        lookups.add(new)
    return lookups.steps, lookups.listed, lookups.where


def validate_colocations(
    colocations: Sequence[ClassPairSpec], worker_types: tuple[str, ...]
) -> tuple[ClassPairSpec, ...]:
    """Each entry: exactly two non-empty class names, listed once in either order; fractions per
    worker type of this cluster, finite, in [0, MAX_COLOCATION_FRACTION]."""
    if isinstance(colocations, (str, bytes)) or not isinstance(colocations, Sequence):
        raise ProblemError("colocations: expected a list of class pairs")
    first_listed: dict[tuple[str, str], int] = {}
    result = []
    for c, entry in enumerate(colocations):
        path = f"colocations[{c}]"
        classes = entry.classes
        if isinstance(classes, (str, bytes)) or not isinstance(classes, Sequence) or len(classes) != 2:
            got = len(classes) if isinstance(classes, Sequence) and not isinstance(classes, (str, bytes)) else classes
            raise ProblemError(f"{path}.classes: expected exactly two class names, got {got!r}")
        for position, name in enumerate(classes):
            if not isinstance(name, str) or not name:
                raise ProblemError(f"{path}.classes[{position}]: expected a non-empty class name, got {name!r}")
        first, second = classes
        unordered = (min(first, second), max(first, second))
        if unordered in first_listed:
            raise ProblemError(
                f"{path}.classes: duplicate class pair {first!r}, {second!r} "
                f"(also colocations[{first_listed[unordered]}])"
            )
        first_listed[unordered] = c
        given = entry.fractions
        if not isinstance(given, Mapping):
            raise ProblemError(f"{path}.fractions: expected an object of worker type -> [first's, second's] fractions")
        fractions: dict[str, tuple[float, float]] = {}
        for name, value in given.items():
            where = f"{path}.fractions.{name}"
            if name not in worker_types:
                raise ProblemError(f"{where}: not a worker type of this cluster")
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
                raise ProblemError(f"{where}: expected [first class's, second class's] fractions")
            fractions[name] = (
                check_number(value[0], f"{where}[0]", maximum=MAX_COLOCATION_FRACTION),
                check_number(value[1], f"{where}[1]", maximum=MAX_COLOCATION_FRACTION),
            )
        result.append(ClassPairSpec((first, second), fractions))
    return tuple(result)


def colocation_from_classes(
    colocation_classes: tuple[str, ...], scale_factors: np.ndarray, throughputs: np.ndarray,
    class_pairs: Sequence[ClassPairSpec], worker_types: tuple[str, ...],
) -> Colocation:
    """Packing from class colocations: jobs i != j with one scale factor whose classes are listed
    together, at ``throughputs[i] * f_i`` and ``throughputs[j] * f_j``.

    Keys are groups of jobs with equal (class, scale factor, throughput row): jobs with equal
    rows share a key, so they stay interchangeable and the packed programs stay small (one key
    per job type when rows come from one measurement), while jobs whose rows differ get keys of
    their own. A self pair (c, c) is symmetrised (the mean of its two positions), as the table
    path does, so the jobs of one class stay interchangeable. Jobs with no class, or a class
    that no listed pair names, are never packed (key -1).

    Vectorised: one pass over the listed class pairs fills a (C, C, K, 2) fraction array; keys
    are grouped into cells (class, scale factor), and for each allowed cell pair the products of
    their keys are laid out with one ``repeat`` (as packing.pair_classes does), no loop over jobs
    or job pairs.
    """
    num_jobs, num_types = throughputs.shape
    # fraction[a, b, k] = (an a-job's fraction, a b-job's fraction) when they share a GPU of type k
    class_index, fraction, listed = class_fraction_table(class_pairs, worker_types)
    class_of_job = np.fromiter((class_index.get(name, -1) for name in colocation_classes), np.int64, num_jobs)
    packable = np.flatnonzero(class_of_job >= 0)
    if len(packable) == 0:
        return Colocation.empty(num_jobs, num_types)
    keys = group_jobs([class_of_job[packable], scale_factors[packable], throughputs[packable]], len(packable))
    key_of_job = np.full(num_jobs, -1, dtype=np.int64)
    key_of_job[packable] = keys.class_of_job
    representative = packable[keys.representative]
    key_class, key_sf = class_of_job[representative], scale_factors[representative]
    key_rows, key_sizes = throughputs[representative], keys.sizes

    # Cells: keys of one (class, scale factor). Two cells pair when their classes are listed
    # together and their gangs are equal; each unordered cell pair once (u <= v).
    cells = group_jobs([key_class, key_sf], keys.num_classes)
    cell_class, cell_sf = key_class[cells.representative], key_sf[cells.representative]
    allowed = (
        listed[cell_class[:, None], cell_class[None, :]]
        & (cell_sf[:, None] == cell_sf[None, :])
        & np.triu(np.ones((cells.num_classes, cells.num_classes), dtype=bool))
    )
    cell_u, cell_v = np.nonzero(allowed)
    keys_by_cell = np.argsort(cells.class_of_job, kind="stable")
    start = np.cumsum(cells.sizes) - cells.sizes
    count_u, count_v = cells.sizes[cell_u], cells.sizes[cell_v]
    products = count_u * count_v
    which = np.repeat(np.arange(len(cell_u)), products)
    local = np.arange(len(which)) - np.repeat(np.cumsum(products) - products, products)
    i, j = local // count_v[which], local % count_v[which]
    p, q = keys_by_cell[start[cell_u][which] + i], keys_by_cell[start[cell_v][which] + j]
    # Within one cell: each unordered key pair once, a key with itself only if two jobs share it.
    same_cell = cell_u[which] == cell_v[which]
    keep = ~same_cell | (i < j) | ((i == j) & (key_sizes[p] >= 2))
    p, q = p[keep], q[keep]

    f = fraction[key_class[p], key_class[q]]  # (P, K, 2), column 0 for key p
    packed = np.stack([key_rows[p] * f[:, :, 0], key_rows[q] * f[:, :, 1]], axis=2)
    packed = np.where((p > q)[:, None, None], packed[:, :, ::-1], packed)  # column 0 for the lower key
    key_pairs = np.stack([np.minimum(p, q), np.maximum(p, q)], axis=1).astype(np.int64)
    ordering = np.lexsort((key_pairs[:, 1], key_pairs[:, 0]))
    return Colocation(
        key_of_job=_readonly(key_of_job),
        key_pairs=_readonly(key_pairs[ordering].reshape(-1, 2)),
        throughputs_steps_per_s=_readonly(packed[ordering].reshape(-1, num_types, 2)),
    )
