"""Pair variables for space sharing, between classes of jobs rather than between jobs.

Gavel gives every pair of jobs with one scale factor a variable per worker type: O(n^2) of them
(2M at 2048 jobs). With jobs grouped into classes (grouping.py), one variable per unordered
pair of classes and type suffices: W[a, b, k] = total time jobs of class a spend packed with
jobs of class b on type k, summed over the |a| x |b| concrete pairs. A job of class a then
spends W / |a| of its time with class b, and a job of b spends W / |b| with class a — the
balance "a's time with b, times |a|, equals b's time with a, times |b|" holds by construction,
so no equality constraint is needed. A self pair (a, a) packs two different jobs of class a
(only when |a| >= 2): each job of a spends 2 W / |a| in it.

Ungrouped (every job its own class), W is exactly Gavel's per-job-pair variable.

When classes are much finer than job types, class pairs are quadratic again; the second form
below ("partner keys") is linear in the classes. formulation.build_space picks the smaller one.
This module enumerates both, builds the partner form's realisability rows, and lays partner
variables out as class pairs after a solve.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from policy_service.core.grouping import JobClasses, group_jobs
from policy_service.core.problem import ClassPairSpec, Colocation, Problem
from policy_service.core.sparse import sp


@dataclass(frozen=True, eq=False)
class PairClasses:
    """pairs (P, 2): class pairs a <= b that may share GPUs; throughputs_steps_per_s (P, K, 2):
    [p, k, 0] one a-job's steps/s when packed with a b-job on type k, [p, k, 1] the b-job's."""

    pairs: np.ndarray
    throughputs_steps_per_s: np.ndarray

    @property
    def num_pairs(self) -> int:
        return int(self.pairs.shape[0])

    @staticmethod
    def none(num_types: int) -> PairClasses:
        return PairClasses(np.zeros((0, 2), dtype=np.int64), np.zeros((0, num_types, 2)))


def pair_classes(problem: Problem, classes: JobClasses) -> PairClasses:
    """Every unordered class pair whose colocation keys are listed together.

    Classes must not mix colocation keys (include the key in the grouping columns). Vectorised:
    for each listed key pair (g, h), the |classes of g| x |classes of h| products are laid out
    with one ``repeat`` and decoded with integer division.
    """
    colocation = problem.colocation
    num_types = problem.num_types
    if colocation.num_pairs == 0 or classes.num_classes == 0:
        return PairClasses.none(num_types)
    key_of_class = colocation.key_of_job[classes.representative]
    order = np.argsort(key_of_class, kind="stable")
    sorted_keys = key_of_class[order]
    key_g, key_h = colocation.key_pairs[:, 0], colocation.key_pairs[:, 1]
    start_g = np.searchsorted(sorted_keys, key_g, "left")
    count_g = np.searchsorted(sorted_keys, key_g, "right") - start_g
    start_h = np.searchsorted(sorted_keys, key_h, "left")
    count_h = np.searchsorted(sorted_keys, key_h, "right") - start_h
    products = count_g * count_h
    key_pair = np.repeat(np.arange(colocation.num_pairs), products)
    if len(key_pair) == 0:
        return PairClasses.none(num_types)
    local = np.arange(len(key_pair)) - np.repeat(np.cumsum(products) - products, products)
    i, j = local // count_h[key_pair], local % count_h[key_pair]
    a, b = order[start_g[key_pair] + i], order[start_h[key_pair] + j]
    same_key = key_g[key_pair] == key_h[key_pair]
    # Within one key: each unordered class pair once, and a class with itself only if it has
    # two jobs to pack.
    keep = ~same_key | ((i < j) | ((i == j) & (classes.sizes[a] >= 2)))
    key_pair, a, b = key_pair[keep], a[keep], b[keep]
    row = colocation.throughputs_steps_per_s[key_pair]  # (m, K, 2), column 0 for key g
    swapped = a > b  # the key-g class ends up second: swap the two columns
    rows = row
    if swapped.any():  # (with a key per job in class order, none is: no second 2 M x K x 2 copy)
        rows = np.where(swapped[:, None, None], row[:, :, ::-1], row)
    pairs = np.stack([np.minimum(a, b), np.maximum(a, b)], axis=1)
    # Sorted by (a, b) through one integer code: with a key per job (rows of their own) the
    # pairs come out sorted already and the check is all it costs (a lexsort of 2 M pairs:
    # ~0.3 s at 2,048 jobs).
    code = pairs[:, 0] * (classes.num_classes + 1) + pairs[:, 1]
    if np.all(code[1:] >= code[:-1]):
        return PairClasses(pairs=pairs, throughputs_steps_per_s=rows)
    ordering = np.argsort(code, kind="stable")
    return PairClasses(pairs=pairs[ordering], throughputs_steps_per_s=rows[ordering])


# ------------------------------------------------------------------------------ cell keys
#
# Class colocations (an estimator's model) give each job its own row and each pair of
# colocation classes a fraction per type: a job packed with a job of class h keeps
# ``fraction[own class, h]`` of its own steps/s, whoever that partner is. So what one job gains
# from its packed time depends on the partner's class, not on the partner's row, and the partner
# form below is exact with keys = cells (colocation class, scale factor) even when every job has
# a row of its own: variables O(jobs x classes) where job pairs are O(jobs^2).


@dataclass(frozen=True, eq=False)
class CellColocation:
    """Packing by cells (colocation class, scale factor).

    cell_of_job (n,): -1 = never packed (the job's colocation key is -1); cell_pairs (Q, 2):
    unordered cell pairs u <= v whose classes are listed together, same scale factor, a self
    pair only for a cell of two jobs or more; fractions (Q, K, 2): [q, k, 0] the share of its own
    steps/s a job of cell_pairs[q, 0] keeps when packed with one of cell_pairs[q, 1] on type k.
    """

    cell_of_job: np.ndarray
    cell_pairs: np.ndarray
    fractions: np.ndarray


def class_fraction_table(
    class_pairs: Sequence[ClassPairSpec], worker_types: tuple[str, ...]
) -> tuple[dict[str, int], np.ndarray, np.ndarray]:
    """Class colocations -> (class index by name, fraction (C, C, K, 2), listed (C, C) bool):
    fraction[a, b, k] = (an a-job's fraction, a b-job's) on type k; a type left out cannot host
    the pair (0); a self pair (c, c) is symmetrised (the mean of its two positions) so that the
    jobs of one class stay interchangeable."""
    names = sorted({name for pair in class_pairs for name in pair.classes})
    class_index = {name: c for c, name in enumerate(names)}
    num_classes, num_types = len(names), len(worker_types)
    fraction = np.zeros((num_classes, num_classes, num_types, 2))
    listed = np.zeros((num_classes, num_classes), dtype=bool)
    for pair in class_pairs:
        a, b = class_index[pair.classes[0]], class_index[pair.classes[1]]
        values = np.zeros((num_types, 2))
        for name, value in pair.fractions.items():
            values[worker_types.index(name)] = value
        if a == b:
            values[:] = values.mean(axis=1, keepdims=True)
        fraction[a, b] = values
        fraction[b, a] = values[:, ::-1]
        listed[a, b] = listed[b, a] = True
    return class_index, fraction, listed


def cell_colocation(problem: Problem) -> CellColocation | None:
    """The cells of a problem whose packing comes from class colocations; None otherwise (pairs
    from a table are already keyed by job type; pairs listed job by job do not factorise)."""
    if problem.colocation_source != "classes" or not problem.class_colocations or not problem.colocation_classes:
        return None
    class_index, fraction, listed = class_fraction_table(problem.class_colocations, problem.worker_types)
    class_of_job = np.fromiter((class_index.get(name, -1) for name in problem.colocation_classes), np.int64,
                               problem.num_jobs)
    packable = np.flatnonzero((class_of_job >= 0) & (problem.colocation.key_of_job >= 0))
    cell_of_job = np.full(problem.num_jobs, -1, dtype=np.int64)
    if len(packable) == 0:
        return CellColocation(cell_of_job, np.zeros((0, 2), np.int64), np.zeros((0, problem.num_types, 2)))
    cells = group_jobs([class_of_job[packable], problem.scale_factors[packable]], len(packable))
    cell_of_job[packable] = cells.class_of_job
    cell_class = class_of_job[packable[cells.representative]]
    cell_sf = problem.scale_factors[packable[cells.representative]]
    allowed = (
        listed[cell_class[:, None], cell_class[None, :]]
        & (cell_sf[:, None] == cell_sf[None, :])
        & np.triu(np.ones((cells.num_classes, cells.num_classes), dtype=bool))
    )
    np.fill_diagonal(allowed, np.diag(allowed) & (cells.sizes >= 2))
    u, v = np.nonzero(allowed)  # row-major: sorted by (u, v)
    return CellColocation(
        cell_of_job, np.stack([u, v], axis=1).astype(np.int64), fraction[cell_class[u], cell_class[v]]
    )


def cell_partner_count(problem: Problem, classes: JobClasses, cells: CellColocation) -> int:
    """Partner variables per type with cell keys (before pruning)."""
    if len(cells.cell_pairs) == 0:
        return 0
    size = int(cells.cell_pairs.max()) + 1
    per_cell = np.bincount(cells.cell_pairs[:, 0], minlength=size) + np.bincount(
        cells.cell_pairs[:, 1], minlength=size
    ) - np.bincount(cells.cell_pairs[cells.cell_pairs[:, 0] == cells.cell_pairs[:, 1], 0], minlength=size)
    cell_of_class = cells.cell_of_job[classes.representative]
    return int(per_cell[cell_of_class[cell_of_class >= 0]].sum())


def cell_average_problem(problem: Problem, cells: CellColocation) -> Problem:
    """The problem with every job of a cell at the cell's mean row, packed as the cell pair's
    fractions of those rows: classes collapse to cells again, so its (grouped) program is tiny,
    and with rows within a few % of the mean its packed pairs are a good first guess for the
    per-job program's columns (pair_columns.solve_by_columns ``seed``). Jobs of no cell keep
    their rows."""
    from dataclasses import replace

    cell = cells.cell_of_job
    rows = np.array(problem.throughputs_steps_per_s, dtype=float)
    in_cell = cell >= 0
    if in_cell.any():
        count = np.bincount(cell[in_cell])
        mean = np.zeros((len(count), problem.num_types))
        np.add.at(mean, cell[in_cell], rows[in_cell])
        mean /= np.maximum(count, 1)[:, None]
        rows[in_cell] = mean[cell[in_cell]]
    else:
        mean = np.zeros((0, problem.num_types))
    u, v = cells.cell_pairs[:, 0], cells.cell_pairs[:, 1]
    packed = np.stack([mean[u] * cells.fractions[:, :, 0], mean[v] * cells.fractions[:, :, 1]], axis=2)
    colocation = Colocation(cell.copy(), cells.cell_pairs.copy(), packed)
    for array in (colocation.key_of_job, colocation.key_pairs, colocation.throughputs_steps_per_s, rows):
        array.setflags(write=False)
    # "table": keys are cells already (no second cell keying of this problem).
    return replace(problem, throughputs_steps_per_s=rows, colocation=colocation, colocation_source="table")


# --------------------------------------------------------------------------- partner variables
#
# When classes are much finer than job types (finish-time fairness and makespan read each job's
# steps and arrival, water filling each job's entity), class pairs are O(classes^2) again. A
# second exact formulation keeps pair variables linear in the classes: Z[c, h, k] = total time
# the jobs of class c spend packed with jobs of colocation key h (any class) on type k. What
# makes Z realisable by concrete pairs:
#   - keys g != h: the time g's classes spend with h equals the time h's classes spend with g
#     (one equality per key pair and type); then a transportation plan between the two sides
#     exists (north-west corner);
#   - a self key (g, g): no job may pair with itself, i.e. each job's packed time is at most the
#     packed time of all other jobs of g together. Jobs of a class of two or more satisfy this
#     automatically; a single-job class c needs Z[c] <= sum_{c' != c} Z[c'], one row per class.
# Each pair occupies the GPUs once, while Z counts its time from both sides: usage s * Z / 2.


@dataclass(frozen=True, eq=False)
class PartnerEntries:
    """One entry per (class, listed key pair containing the class's key).

    cls (E,): the class; key_pair (E,): index into colocation.key_pairs; side (E,): 0 if the
    class's key is key_pairs[p, 0] (a self pair (g, g) is listed once, side 0);
    throughputs_steps_per_s (E, K): one job of the class, packed with a job of the partner key.
    """

    cls: np.ndarray
    key_pair: np.ndarray
    side: np.ndarray
    throughputs_steps_per_s: np.ndarray
    partner_throughputs_steps_per_s: np.ndarray
    # With cell keys (CellColocation): the key pairs ``key_pair`` indexes (None: the problem's
    # colocation.key_pairs), and the two sides' fractions (E, K, 2), own first.
    key_pairs: np.ndarray | None = None
    fractions: np.ndarray | None = None

    @property
    def num_entries(self) -> int:
        return len(self.cls)

    def pairs_of(self, problem: Problem) -> np.ndarray:
        """(Q, 2) the key pairs ``key_pair`` indexes."""
        return problem.colocation.key_pairs if self.key_pairs is None else self.key_pairs


def partner_entries(problem: Problem, classes: JobClasses, cells: CellColocation | None = None) -> PartnerEntries:
    """Every (class, key pair) entry, built with array operations. Keys are the colocation's
    (job types from a table, or rows), or the ``cells`` (colocation classes) when given: a
    class's packed steps/s is then its own row times its fraction."""
    num_types = problem.num_types
    empty = PartnerEntries(
        np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64),
        np.zeros((0, num_types)), np.zeros((0, num_types)),
        None if cells is None else cells.cell_pairs, None if cells is None else np.zeros((0, num_types, 2)),
    )
    if cells is not None:
        key_of_job, pairs, pair_table = cells.cell_of_job, cells.cell_pairs, cells.fractions
    else:
        key_of_job = problem.colocation.key_of_job
        pairs, pair_table = problem.colocation.key_pairs, problem.colocation.throughputs_steps_per_s
    if len(pairs) == 0 or classes.num_classes == 0:
        return empty
    count = len(pairs)
    key = np.concatenate([pairs[:, 0], pairs[:, 1]])
    pair_index = np.concatenate([np.arange(count), np.arange(count)])
    side = np.concatenate([np.zeros(count, np.int64), np.ones(count, np.int64)])
    keep = ~((side == 1) & (pairs[pair_index, 0] == pairs[pair_index, 1]))  # self pairs once
    key, pair_index, side = key[keep], pair_index[keep], side[keep]
    order = np.argsort(key, kind="stable")
    key, pair_index, side = key[order], pair_index[order], side[order]
    key_of_class = key_of_job[classes.representative]
    start = np.searchsorted(key, key_of_class, "left")
    stop = np.searchsorted(key, key_of_class, "right")
    per_class = np.where(key_of_class >= 0, stop - start, 0)
    cls = np.repeat(np.arange(classes.num_classes), per_class)
    if len(cls) == 0:
        return empty
    offset = np.arange(len(cls)) - np.repeat(np.cumsum(per_class) - per_class, per_class)
    slot = np.repeat(start, per_class) + offset
    entry_pair, entry_side = pair_index[slot], side[slot]
    table = pair_table[entry_pair]  # (E, K, 2)
    own = np.where(entry_side[:, None] == 0, table[:, :, 0], table[:, :, 1])
    partner = np.where(entry_side[:, None] == 0, table[:, :, 1], table[:, :, 0])
    fractions = None
    if cells is not None:  # fractions of the two sides; own steps/s = the class's row x fraction
        fractions = np.stack([own, partner], axis=2)
        own = problem.throughputs_steps_per_s[classes.representative[cls]] * own
        partner = np.zeros_like(own)  # partners differ job by job: see ``fractions``
    # A self key needs a second job of that key somewhere.
    jobs_of_key = np.bincount(key_of_class[key_of_class >= 0], weights=classes.sizes[key_of_class >= 0],
                              minlength=int(key_of_class.max()) + 1)
    self_pair = pairs[entry_pair, 0] == pairs[entry_pair, 1]
    usable = ~self_pair | (jobs_of_key[key_of_class[cls]] >= 2)
    return PartnerEntries(
        cls[usable], entry_pair[usable], entry_side[usable], own[usable], partner[usable],
        None if cells is None else pairs, None if fractions is None else fractions[usable],
    )


def class_pair_count(problem: Problem, classes: JobClasses) -> tuple[int, int]:
    """(number of class-pair variables, number of partner variables) per type, before pruning."""
    colocation = problem.colocation
    if colocation.num_pairs == 0 or classes.num_classes == 0:
        return 0, 0
    key_of_class = colocation.key_of_job[classes.representative]
    valid = key_of_class >= 0
    per_key = np.bincount(key_of_class[valid], minlength=int(colocation.key_pairs.max()) + 1).astype(float)
    per_key = np.concatenate([per_key, np.zeros(max(0, int(colocation.key_pairs.max()) + 1 - len(per_key)))])
    a, b = per_key[colocation.key_pairs[:, 0]], per_key[colocation.key_pairs[:, 1]]
    same = colocation.key_pairs[:, 0] == colocation.key_pairs[:, 1]
    class_pairs = np.where(same, a * (a + 1) / 2, a * b).sum()
    partners = np.where(same, a, a + b).sum()
    return int(class_pairs), int(partners)


def key_throughputs(problem: Problem) -> np.ndarray:
    """(Q, K) the smallest isolated steps/s among the jobs of each colocation key.

    Jobs of a key share throughputs when they come from the table; with per-job throughputs in
    the input they may not, and the smallest gives the largest packed/alone ratio, so pruning by
    it removes only pairs that are dominated for every job of the key.
    """
    key = problem.colocation.key_of_job
    size = int(max(key.max(initial=-1), problem.colocation.key_pairs.max(initial=-1))) + 1
    table = np.full((size, problem.num_types), np.inf)
    valid = key >= 0
    np.minimum.at(table, key[valid], problem.throughputs_steps_per_s[valid])
    return np.where(np.isinf(table), 0.0, table)


def partner_rows(
    problem: Problem, classes: JobClasses, partners: PartnerEntries,
    e_idx: np.ndarray, k_idx: np.ndarray, cols: np.ndarray, first_aux: int,
) -> tuple[sp.csr_matrix, sp.csr_matrix, int]:
    """Balance rows (one per job-type pair g != h and type) and no-self-pairing rows (one per
    single-job class and type of a self pair), the latter through one auxiliary variable per
    self pair and type holding the pair's total: total == sum Z, 2 Z[c] - total <= 0."""
    key_pairs = partners.pairs_of(problem)
    pair = partners.key_pair[e_idx]
    self_pair = key_pairs[pair, 0] == key_pairs[pair, 1]
    num_types = problem.num_types
    # Balance: + side 0, - side 1.
    cross = ~self_pair
    row_id = pair[cross] * num_types + k_idx[cross]
    rows_unique, row = np.unique(row_id, return_inverse=True)
    sign = np.where(partners.side[e_idx][cross] == 0, 1.0, -1.0)
    balance = sp.coo_matrix((sign, (row, cols[cross])), shape=(len(rows_unique), first_aux))
    # Self pairs: an auxiliary total per (pair, type) with at least one single-job class.
    single = self_pair & (classes.sizes[partners.cls[e_idx]] == 1)
    needed = np.unique(pair[single] * num_types + k_idx[single])
    if len(needed) == 0:
        return balance.tocsr(), sp.csr_matrix((0, first_aux)), 0
    aux_col = first_aux + np.arange(len(needed))
    member = self_pair & np.isin(pair * num_types + k_idx, needed)
    which = np.searchsorted(needed, pair[member] * num_types + k_idx[member])
    # total rows (equalities appended to balance): sum Z - aux == 0
    total_rows = sp.coo_matrix(
        (np.concatenate([np.ones(member.sum()), -np.ones(len(needed))]),
         (np.concatenate([which, np.arange(len(needed))]), np.concatenate([cols[member], aux_col]))),
        shape=(len(needed), first_aux + len(needed)),
    )
    balance = sp.vstack([sp.csr_matrix(balance, shape=(balance.shape[0], first_aux + len(needed))), total_rows])
    singles = np.flatnonzero(single)
    which_single = np.searchsorted(needed, pair[singles] * num_types + k_idx[singles])
    no_self = sp.coo_matrix(
        (np.concatenate([np.full(len(singles), 2.0), -np.ones(len(singles))]),
         (np.concatenate([np.arange(len(singles))] * 2), np.concatenate([cols[singles], aux_col[which_single]]))),
        shape=(len(singles), first_aux + len(needed)),
    )
    return balance.tocsr(), no_self.tocsr(), len(needed)


def partners_to_class_pairs(
    problem: Problem, classes: JobClasses, partners: PartnerEntries, z: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Partner variables Z (E, K) -> class-pair times. For a job-type pair (g, h), g's classes
    and h's classes are laid side by side on one time line (north-west corner); within one job
    type g, the line of g's classes is folded onto itself at half its length, which pairs no job
    with itself when no job holds more than half (the no_self rows)."""
    num_types = z.shape[1]
    sizes = classes.sizes
    found_a: list[np.ndarray] = []
    found_b: list[np.ndarray] = []
    found_w: list[np.ndarray] = []
    found_k: list[np.ndarray] = []
    order = np.lexsort((partners.cls, partners.side, partners.key_pair))
    key_pairs = partners.pairs_of(problem)
    boundaries = np.flatnonzero(np.diff(partners.key_pair[order])) + 1
    for block in np.split(order, boundaries):
        if len(block) == 0:
            continue
        p = partners.key_pair[block[0]]
        self_pair = key_pairs[p, 0] == key_pairs[p, 1]
        for k in range(num_types):
            mass = z[block, k]
            if mass.sum() <= 1e-12:
                continue
            if self_pair:
                first, second, length = _fold(partners.cls[block], mass)
                valid = (first != second) | (sizes[first] >= 2)
                first, second, length = first[valid], second[valid], length[valid]
            else:
                side = partners.side[block]
                left, right = block[side == 0], block[side == 1]
                first, second, length = _north_west(partners.cls[left], z[left, k], partners.cls[right], z[right, k])
            found_a.append(first)
            found_b.append(second)
            found_w.append(length)
            found_k.append(np.full(len(length), k))
    if not found_a:
        return np.zeros((0, 2), np.int64), np.zeros((0, num_types))
    first, second = np.concatenate(found_a), np.concatenate(found_b)
    low, high = np.minimum(first, second), np.maximum(first, second)
    base = classes.num_classes + 1
    codes, inverse = np.unique(low * base + high, return_inverse=True)
    w = np.zeros((len(codes), num_types))
    np.add.at(w, (inverse, np.concatenate(found_k)), np.concatenate(found_w))
    return np.stack([codes // base, codes % base], axis=1), w


def _north_west(
    left: np.ndarray, left_mass: np.ndarray, right: np.ndarray, right_mass: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    total = min(left_mass.sum(), right_mass.sum())  # equal up to solver tolerance
    if total <= 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    left_cut = np.cumsum(left_mass) * (total / left_mass.sum())
    right_cut = np.cumsum(right_mass) * (total / right_mass.sum())
    cuts = np.unique(np.concatenate([[0.0], left_cut, right_cut]))
    cuts = cuts[cuts <= total]
    length = np.diff(cuts)
    middle = cuts[:-1] + length / 2
    i = np.minimum(np.searchsorted(left_cut, middle, "right"), len(left) - 1)
    j = np.minimum(np.searchsorted(right_cut, middle, "right"), len(right) - 1)
    keep = length > 0
    return left[i[keep]], right[j[keep]], length[keep]


def _fold(classes: np.ndarray, mass: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pair the point t of [0, D/2) with t + D/2, classes laid on [0, D) by their masses."""
    total = mass.sum()
    half = total / 2
    cut = np.cumsum(mass)
    cuts = np.unique(np.concatenate([[0.0, half], cut[cut < half], cut[cut > half] - half]))
    cuts = cuts[(cuts >= 0) & (cuts <= half)]
    length = np.diff(cuts)
    middle = cuts[:-1] + length / 2
    i = np.minimum(np.searchsorted(cut, middle, "right"), len(classes) - 1)
    j = np.minimum(np.searchsorted(cut, middle + half, "right"), len(classes) - 1)
    keep = length > 0
    return classes[i[keep]], classes[j[keep]], length[keep]
