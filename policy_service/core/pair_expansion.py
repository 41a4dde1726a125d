"""Grouped pair time -> concrete job pairs (allocation.expand_pairs), every group pair at once.

The layout is allocation.expand_pairs' (see its docstring): between two different groups the
jobs of each are laid side by side on [0, total) and every overlap is a pair ("north-west
corner"); inside one group jobs are matched two by two. It used to run one small numpy call
chain per group pair: at Gavel's paper scale (36:36:36, ~60 jobs in ~23 classes) ~165 group
pairs an answer, ~0.1 ms each, more time than the packed program's solve. Here the cut points of
all group pairs are laid out in one array, sorted once by (group pair, position), and the
overlaps read off with array operations; the arithmetic is element by element the per-pair
code's (the same float operations in the same order), so the pairs and fractions are identical
to the bit (tests/unit/policy/test_pair_expansion.py holds them to the per-pair code).
"""

from __future__ import annotations

import numpy as np


def expand_group_pairs(
    group_of_job: np.ndarray, group_pairs: np.ndarray, pair_time: np.ndarray, min_fraction: float
) -> tuple[np.ndarray, np.ndarray]:
    """((Q, 2) job indices, (Q, K) fractions) of allocation.expand_pairs."""
    num_types = pair_time.shape[1]
    num_jobs = len(group_of_job)
    if len(group_pairs) == 0:
        return np.zeros((0, 2), dtype=np.int64), np.zeros((0, num_types))
    order = np.argsort(group_of_job, kind="stable")  # jobs by group, by index within a group
    groups = group_of_job[order]
    valid = groups >= 0
    order, groups = order[valid], groups[valid]
    num_groups = int(groups.max(initial=-1)) + 1
    start = np.searchsorted(groups, np.arange(num_groups + 1))
    sizes = np.diff(start)
    totals = pair_time.sum(axis=1)
    a_all, b_all = group_pairs[:, 0], group_pairs[:, 1]
    used = totals > min_fraction
    single = used & (a_all != b_all) & (sizes[a_all] == 1) & (sizes[b_all] == 1)
    cross = np.flatnonzero(used & ~single & (a_all != b_all))
    within = np.flatnonzero(used & ~single & (a_all == b_all))

    pieces_p, pieces_a, pieces_b, pieces_len = [], [], [], []
    if len(cross):
        p, job_a, job_b, length = _north_west_all(order, start, sizes, a_all[cross], b_all[cross], totals[cross])
        pieces_p.append(cross[p])
        pieces_a.append(job_a)
        pieces_b.append(job_b)
        pieces_len.append(length)
    for p in within:  # one per group at most (~20 an answer): the per-pair code as it was
        jobs = order[start[a_all[p]]:start[a_all[p] + 1]]
        job_a, job_b, length = _matching(jobs, float(totals[p]))
        pieces_p.append(np.full(len(length), p))
        pieces_a.append(job_a)
        pieces_b.append(job_b)
        pieces_len.append(length)

    found_a = [order[start[a_all[single]]]]
    found_b = [order[start[b_all[single]]]]
    found_f = [pair_time[single]]
    if pieces_p:
        p = np.concatenate(pieces_p)
        by_pair = np.argsort(p, kind="stable")  # group pair order, each pair's pieces in order
        p = p[by_pair]
        share = pair_time[p] / totals[p][:, None]  # (K,) how each group pair's time splits over types
        found_a.append(np.concatenate(pieces_a)[by_pair])
        found_b.append(np.concatenate(pieces_b)[by_pair])
        found_f.append(np.concatenate(pieces_len)[by_pair][:, None] * share)
    job_a = np.concatenate(found_a).astype(np.int64)
    job_b = np.concatenate(found_b).astype(np.int64)
    fractions = np.concatenate(found_f)
    low, high = np.minimum(job_a, job_b), np.maximum(job_a, job_b)
    keep = fractions.sum(axis=1) > min_fraction
    codes = low[keep] * (num_jobs + 1) + high[keep]
    unique, inverse = np.unique(codes, return_inverse=True)
    merged = np.zeros((len(unique), num_types))
    np.add.at(merged, inverse, fractions[keep])
    pair_jobs = np.stack([unique // (num_jobs + 1), unique % (num_jobs + 1)], axis=1)
    return pair_jobs.astype(np.int64), merged


def _north_west_all(
    order: np.ndarray, start: np.ndarray, sizes: np.ndarray, a: np.ndarray, b: np.ndarray, totals: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For group pairs (a[i], b[i]) with pair time totals[i]: (i of each overlap, its a-job, its
    b-job, its length). a's jobs cover totals / |a| each, b's totals / |b|."""
    size_a, size_b = sizes[a], sizes[b]
    step_a, step_b = totals / size_a, totals / size_b
    # Cut points: i * step_a for i = 0..|a|, j * step_b for j = 0..|b|, tagged by group pair.
    count = size_a + 1 + size_b + 1
    owner = np.repeat(np.arange(len(a)), count)
    rank = np.arange(len(owner)) - np.repeat(np.cumsum(count) - count, count)
    from_a = rank <= size_a[owner]
    multiple = np.where(from_a, rank, rank - size_a[owner] - 1)
    cuts = multiple * np.where(from_a, step_a[owner], step_b[owner])
    by = np.lexsort((cuts, owner))
    owner, cuts = owner[by], cuts[by]
    # np.unique per pair, then the cut at most the pair's total (up to rounding)
    first = np.ones(len(cuts), dtype=bool)
    first[1:] = (owner[1:] != owner[:-1]) | (cuts[1:] != cuts[:-1])
    owner, cuts = owner[first], cuts[first]
    inside = cuts <= totals[owner] * (1 + 1e-12)
    owner, cuts = owner[inside], cuts[inside]
    # Consecutive cuts of one pair bound an overlap.
    same = owner[1:] == owner[:-1]
    pair = owner[:-1][same]
    length = (cuts[1:] - cuts[:-1])[same]
    middle = cuts[:-1][same] + length / 2
    index_a = np.minimum((middle / step_a[pair]).astype(np.int64), size_a[pair] - 1)
    index_b = np.minimum((middle / step_b[pair]).astype(np.int64), size_b[pair] - 1)
    keep = length > 0
    pair, index_a, index_b, length = pair[keep], index_a[keep], index_b[keep], length[keep]
    return pair, order[start[a[pair]] + index_a], order[start[b[pair]] + index_b], length


def _matching(jobs: np.ndarray, total: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs inside one group: each job must be packed 2 * total / size of the time."""
    size = len(jobs)
    each = 2.0 * total / size
    paired = size if size % 2 == 0 else size - 3
    first, second = jobs[0:paired:2], jobs[1:paired:2]
    lengths = np.full(len(first), each)
    if size % 2 == 1:  # a triangle: three edges of each/2 give each of its jobs `each`
        tri = jobs[size - 3:]
        first = np.concatenate([first, tri[[0, 1, 2]]])
        second = np.concatenate([second, tri[[1, 2, 0]]])
        lengths = np.concatenate([lengths, np.full(3, each / 2)])
    return first, second, lengths
