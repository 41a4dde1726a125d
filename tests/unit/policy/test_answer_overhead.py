"""The small-size forms of the simulator's answer path held to the general ones: _repair
without pairs, the cached empty Colocation and PairShares, the admitted columns' range and
runnable checks done on Python numbers, the small grouping's class sizes."""

from __future__ import annotations

import numpy as np
import pytest

from policy_service.core import admitted, formulation, grouping
from policy_service.core.allocation import PairShares
from policy_service.core.problem import Colocation
from tests.support.seeds import sweep
from tests.unit.policy.builders import gavel_table


def _repair_general(x, pairs, w, sizes, scale_factors, counts):  # noqa: ANN001, ANN202
    """formulation._repair as it was before its no-pair branch (the reference)."""
    a, b = pairs[:, 0], pairs[:, 1]
    same = a == b
    time_used = x.sum(axis=1)
    if len(pairs):
        per_pair = w.sum(axis=1)
        np.add.at(time_used, a, np.where(same, 2.0, 1.0) * per_pair / sizes[a])
        np.add.at(time_used, b[~same], per_pair[~same] / sizes[b[~same]])
    factor = np.minimum(1.0, 1.0 / np.maximum(time_used, 1e-300))
    x = x * factor[:, None]
    w = w * np.minimum(factor[a], factor[b])[:, None] if len(pairs) else w
    used = ((sizes * scale_factors)[:, None] * x).sum(axis=0)
    if len(pairs):
        used = used + (scale_factors[a][:, None] * w).sum(axis=0)
    type_factor = np.where(used > counts, counts / np.maximum(used, 1e-300), 1.0)
    return x * type_factor, pairs.astype(np.int64), w * type_factor


@pytest.mark.deep  # 50 seeds under `make test`, all 200 under `make test-deep` (tests/support/seeds.py)
@pytest.mark.parametrize("seed", sweep(200, 50))
def test_repair_without_pairs_matches_general_form(seed: int) -> None:
    rng = np.random.default_rng(seed)
    num_classes, num_types = int(rng.integers(1, 25)), int(rng.integers(1, 5))
    x = rng.uniform(0, 1.5, (num_classes, num_types)) * (rng.random((num_classes, num_types)) < 0.7)
    sizes = rng.integers(1, 6, num_classes).astype(float)
    scale_factors = rng.choice([1.0, 2.0, 4.0, 8.0], num_classes)
    counts = rng.integers(0, 12, num_types).astype(float)
    pairs, w = np.zeros((0, 2), np.int64), np.zeros((0, num_types))
    got = formulation._repair(x, pairs, w, sizes, scale_factors, counts)
    want = _repair_general(x, pairs, w, sizes, scale_factors, counts)
    for g, e in zip(got, want, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape
        assert np.array_equal(g, e)  # bit for bit


def test_cached_empty_shapes_are_readonly_and_equal_to_fresh() -> None:
    for made, fresh in (
        (Colocation.empty(7, 3), Colocation._made_empty(7, 3)),
        (formulation._no_pair_shares(7, 3), PairShares.none(7, 3)),
    ):
        for name in vars(fresh):
            a, b = getattr(made, name), getattr(fresh, name)
            assert not a.flags.writeable
            assert a.dtype == b.dtype and np.array_equal(a, b)


def _numpy_accepts(jobs: admitted.AdmittedJobs, rows: list, counts: np.ndarray) -> bool:
    """The range and runnable checks of admitted_columns in their numpy form (the reference)."""
    n = len(jobs)
    values = np.array((jobs.steps_remaining, jobs.time_since_arrival_s, jobs.isolated_time_s), dtype=float).reshape(3, n)
    limits = np.array([[admitted.MAX_TOTAL_STEPS], [admitted.MAX_TIME_S], [admitted.MAX_TIME_S]])
    if not (np.isfinite(values).all() and (values >= 0).all() and (values <= limits).all()):
        return False
    throughputs = np.array(rows, dtype=float).reshape(n, len(counts))
    fits = counts[None, :] >= np.array(jobs.scale_factors, dtype=np.int64)[:, None]
    return bool((fits & (throughputs > 0)).any(axis=1).all())


@pytest.mark.parametrize("seed", range(60))
def test_admitted_checks_on_python_numbers_match_numpy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    table = gavel_table()
    worker_types = ("v100", "p100", "k80")
    keys = [(job_type, sf) for job_type in sorted(table.job_types) for sf in (1, 2, 4, 8) if table.has_job(job_type, sf)]
    n = int(rng.integers(1, 30))
    picked = [keys[i] for i in rng.integers(0, len(keys), n)]
    odd = [np.nan, np.inf, -np.inf, -1.0, -0.0, 0.0, admitted.MAX_TIME_S, admitted.MAX_TIME_S * 1.000001,
           admitted.MAX_TOTAL_STEPS, admitted.MAX_TOTAL_STEPS * 2, 3, 10**30]

    def column(limit: float) -> tuple:  # noqa: ANN202
        return tuple(
            odd[int(rng.integers(len(odd)))] if rng.random() < 0.03 else float(rng.uniform(0, limit / 1e6))
            for _ in range(n)
        )

    jobs = admitted.AdmittedJobs(
        ids=tuple(f"j{i}" for i in range(n)), job_types=tuple(k[0] for k in picked),
        scale_factors=tuple(k[1] for k in picked), priority_weights=(1.0,) * n,
        steps_remaining=column(admitted.MAX_TOTAL_STEPS), time_since_arrival_s=column(admitted.MAX_TIME_S),
        slo_s=(None,) * n, isolated_time_s=column(admitted.MAX_TIME_S),
    )
    counts = rng.integers(0, 9, 3).astype(float)
    counts[rng.integers(3)] = max(counts.max(), 1.0)
    got = admitted.admitted_columns(jobs, worker_types, counts, table)
    rows = [tuple(float(table.isolated(t, sf, w)) for w in worker_types) for t, sf in picked]
    assert (got is not None) == _numpy_accepts(jobs, rows, counts)



@pytest.mark.parametrize("seed", range(40))
def test_small_grouping_counts_sizes_as_bincount(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    columns = [rng.choice([0.0, 0.5, 1.25, np.nan], size=(n, 3)), rng.choice([1, 2, 4], size=n)]
    classes = grouping.group_jobs(columns, n)
    want = np.bincount(classes.class_of_job, minlength=classes.num_classes).astype(np.int64)
    assert classes.sizes.dtype == np.int64 and np.array_equal(classes.sizes, want)
