"""Grouped pair time expands to concrete job pairs without changing anyone's time or GPUs."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from policy_service.core import Allocation, PairShares, Status, expand_pairs
from policy_service.core.allocation import NOISE_FRACTION


@st.composite
def grouped_pairs(draw):
    sizes = draw(st.lists(st.integers(1, 7), min_size=1, max_size=5))
    group_of_job = np.repeat(np.arange(len(sizes)), sizes)
    num_types = draw(st.integers(1, 3))
    candidates = [(a, b) for a in range(len(sizes)) for b in range(a, len(sizes)) if a != b or sizes[a] >= 2]
    chosen = draw(st.lists(st.sampled_from(candidates), unique=True, max_size=len(candidates))) if candidates else []
    times = draw(st.lists(
        st.lists(st.floats(0, 1), min_size=num_types, max_size=num_types), min_size=len(chosen), max_size=len(chosen)
    ))
    pair_time = np.asarray(times, dtype=float).reshape(len(chosen), num_types)
    pairs = PairShares(group_of_job, np.asarray(chosen, dtype=np.int64).reshape(-1, 2), pair_time)
    # Scale so that no job is packed more than 100% of its time (as every policy guarantees).
    worst = pairs.time_per_job().sum(axis=1).max(initial=0.0)
    if worst > 1:
        pairs = PairShares(group_of_job, pairs.group_pairs, pair_time / worst)
    return pairs


@settings(max_examples=200, deadline=None)
@given(grouped_pairs())
def test_expansion_preserves_each_jobs_packed_time_and_never_pairs_a_job_with_itself(pairs: PairShares) -> None:
    num_jobs, num_types = len(pairs.group_of_job), pairs.pair_time.shape[1]
    pair_jobs, fractions = expand_pairs(pairs)
    assert (pair_jobs[:, 0] != pair_jobs[:, 1]).all()
    assert (pair_jobs[:, 0] < pair_jobs[:, 1]).all()
    assert len({tuple(p) for p in pair_jobs.tolist()}) == len(pair_jobs)
    assert (fractions >= 0).all() and (fractions <= 1 + 1e-9).all()
    per_job = np.zeros((num_jobs, num_types))
    np.add.at(per_job, pair_jobs[:, 0], fractions)
    np.add.at(per_job, pair_jobs[:, 1], fractions)
    # Concrete pairs below NOISE_FRACTION are solver noise and dropped by design: each pair a
    # job is in may lose that much (hypothesis found two 1e-9 pairs of one job).
    noise = NOISE_FRACTION * max(1, len(pairs.group_of_job))
    np.testing.assert_allclose(per_job, pairs.time_per_job(), atol=1e-9 + noise)
    np.testing.assert_allclose(fractions.sum(axis=0), pairs.pair_time.sum(axis=0), atol=1e-9 + noise * pairs.num_pairs)
    # At most |a| + |b| - 1 concrete pairs per group pair (|a| for a self pair).
    assert len(pair_jobs) <= sum(2 * num_jobs for _ in range(max(1, pairs.num_pairs)))


def test_gpus_used_counts_a_pair_once() -> None:
    pairs = PairShares.of_job_pairs(2, np.array([[0, 1]]), np.array([[1.0]]))
    allocation = Allocation("p", Status.OPTIMAL, ("a", "b"), ("v100",), np.zeros((2, 1)), pairs)
    assert allocation.gpus_used(np.array([4, 4])).tolist() == [4.0]
    assert allocation.total_time_per_job().tolist() == [1.0, 1.0]


def test_a_self_pair_of_an_odd_group_uses_a_triangle() -> None:
    pairs = PairShares(np.zeros(5, dtype=np.int64), np.array([[0, 0]]), np.array([[1.5]]))
    pair_jobs, fractions = expand_pairs(pairs)
    assert pairs.time_per_job()[:, 0] == __import__("pytest").approx([0.6] * 5)
    assert sorted(map(tuple, pair_jobs.tolist())) == [(0, 1), (2, 3), (2, 4), (3, 4)]
