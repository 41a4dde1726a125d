"""The vectorised expansion of grouped pair time (policy_service/core/pair_expansion.py) gives
the per-group-pair code's job pairs and fractions to the bit (the code it replaced is kept here
as the reference), on random groupings like the simulator's."""

from __future__ import annotations

import numpy as np
import pytest

from policy_service.core import PairShares, expand_pairs
from policy_service.core.allocation import NOISE_FRACTION
from policy_service.core.pair_expansion import expand_group_pairs


def _reference(pairs: PairShares, min_fraction: float = NOISE_FRACTION) -> tuple[np.ndarray, np.ndarray]:
    """allocation.expand_pairs as it was: one north-west corner or matching per group pair."""
    num_types = pairs.pair_time.shape[1]
    if pairs.num_pairs == 0:
        return np.zeros((0, 2), dtype=np.int64), np.zeros((0, num_types))
    order = np.argsort(pairs.group_of_job, kind="stable")
    groups = pairs.group_of_job[order]
    order, groups = order[groups >= 0], groups[groups >= 0]
    bounds = np.searchsorted(groups, np.arange(int(groups.max(initial=-1)) + 2))
    members = [order[bounds[g]:bounds[g + 1]] for g in range(len(bounds) - 1)]
    found_a, found_b, found_f = [], [], []
    totals = pairs.pair_time.sum(axis=1)
    sizes = np.array([len(m) for m in members])
    a_all, b_all = pairs.group_pairs[:, 0], pairs.group_pairs[:, 1]
    single = (totals > min_fraction) & (a_all != b_all) & (sizes[a_all] == 1) & (sizes[b_all] == 1)
    if single.any():
        found_a.append(np.asarray([members[g][0] for g in a_all[single]], dtype=np.int64))
        found_b.append(np.asarray([members[g][0] for g in b_all[single]], dtype=np.int64))
        found_f.append(pairs.pair_time[single])
    for p in np.flatnonzero((totals > min_fraction) & ~single):
        a, b = int(a_all[p]), int(b_all[p])
        share = pairs.pair_time[p] / totals[p]
        total = float(totals[p])
        if a != b:
            jobs_a, jobs_b = members[a], members[b]
            step_a, step_b = total / len(jobs_a), total / len(jobs_b)
            cuts = np.unique(np.concatenate([np.arange(len(jobs_a) + 1) * step_a, np.arange(len(jobs_b) + 1) * step_b]))
            cuts = cuts[cuts <= total * (1 + 1e-12)]
            length = np.diff(cuts)
            middle = cuts[:-1] + length / 2
            index_a = np.minimum((middle / step_a).astype(np.int64), len(jobs_a) - 1)
            index_b = np.minimum((middle / step_b).astype(np.int64), len(jobs_b) - 1)
            keep = length > 0
            first, second, length = jobs_a[index_a[keep]], jobs_b[index_b[keep]], length[keep]
        else:
            jobs = members[a]
            size = len(jobs)
            each = 2.0 * total / size
            paired = size if size % 2 == 0 else size - 3
            first, second = jobs[0:paired:2], jobs[1:paired:2]
            length = np.full(len(first), each)
            if size % 2 == 1:
                tri = jobs[size - 3:]
                first = np.concatenate([first, tri[[0, 1, 2]]])
                second = np.concatenate([second, tri[[1, 2, 0]]])
                length = np.concatenate([length, np.full(3, each / 2)])
        found_a.append(first)
        found_b.append(second)
        found_f.append(length[:, None] * share[None, :])
    job_a = np.concatenate(found_a) if found_a else np.zeros(0, dtype=np.int64)
    job_b = np.concatenate(found_b) if found_b else np.zeros(0, dtype=np.int64)
    fractions = np.concatenate(found_f) if found_f else np.zeros((0, num_types))
    low, high = np.minimum(job_a, job_b), np.maximum(job_a, job_b)
    keep = fractions.sum(axis=1) > min_fraction
    n = len(pairs.group_of_job) + 1
    unique, inverse = np.unique(low[keep] * n + high[keep], return_inverse=True)
    merged = np.zeros((len(unique), num_types))
    np.add.at(merged, inverse, fractions[keep])
    return np.stack([unique // n, unique % n], axis=1).astype(np.int64), merged


def _random_pairs(seed: int) -> PairShares:
    """Groups of 1-9 jobs (some jobs in none), shuffled over job indices, random group pairs
    (self pairs only for groups of two or more), times of mixed magnitudes, some at noise."""
    rng = np.random.default_rng(seed)
    num_groups = int(rng.integers(1, 25))
    sizes = rng.integers(1, 10, num_groups)
    group_of_job = np.concatenate([np.repeat(np.arange(num_groups), sizes), np.full(int(rng.integers(0, 4)), -1)])
    rng.shuffle(group_of_job)
    candidates = [(a, b) for a in range(num_groups) for b in range(a, num_groups) if a != b or sizes[a] >= 2]
    chosen = rng.permutation(len(candidates))[: int(rng.integers(0, len(candidates) + 1))]
    group_pairs = np.asarray([candidates[i] for i in np.sort(chosen)], dtype=np.int64).reshape(-1, 2)
    num_types = int(rng.integers(1, 4))
    pair_time = rng.random((len(group_pairs), num_types)) * 10.0 ** rng.integers(-10, 1, (len(group_pairs), 1))
    pair_time[rng.random(pair_time.shape) < 0.3] = 0.0
    return PairShares(group_of_job, group_pairs, pair_time)


@pytest.mark.parametrize("seed", range(60))
def test_the_vectorised_expansion_is_the_per_pair_one_to_the_bit(seed: int) -> None:
    pairs = _random_pairs(seed)
    expected_jobs, expected_fractions = _reference(pairs)
    jobs, fractions = expand_group_pairs(pairs.group_of_job, pairs.group_pairs, pairs.pair_time, NOISE_FRACTION)
    assert np.array_equal(jobs, expected_jobs)
    assert np.array_equal(fractions, expected_fractions)
    assert jobs.dtype == np.int64
    via_allocation = expand_pairs(pairs)
    assert np.array_equal(via_allocation[0], expected_jobs) and np.array_equal(via_allocation[1], expected_fractions)


def test_cross_group_pairs_of_three_and_two_jobs_overlap_as_the_north_west_corner() -> None:
    # Group 0 = jobs 0, 1, 2 (1/3 of the 0.6 each), group 1 = jobs 3, 4 (0.3 each): cuts at
    # 0, 0.2, 0.3, 0.4, 0.6 -> (0, 3) 0.2, (1, 3) 0.1, (1, 4) 0.1, (2, 4) 0.2.
    pairs = PairShares(np.array([0, 0, 0, 1, 1]), np.array([[0, 1]]), np.array([[0.6]]))
    jobs, fractions = expand_group_pairs(pairs.group_of_job, pairs.group_pairs, pairs.pair_time, NOISE_FRACTION)
    assert jobs.tolist() == [[0, 3], [1, 3], [1, 4], [2, 4]]
    np.testing.assert_allclose(fractions[:, 0], [0.2, 0.1, 0.1, 0.2])
