"""group_jobs groups up to SMALL_GROUPING jobs through a dict of rows instead of np.unique: the
same classes, numbered the same way, whichever path runs."""

from __future__ import annotations

import numpy as np
import pytest

import policy_service.core.grouping as grouping


def _columns(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    rows = rng.choice([0.0, -0.0, 0.5, 1.25, np.nan, np.inf], size=(n, 3))  # few values: classes repeat
    scale = rng.choice([1, 2, 4], size=n)
    weight = rng.choice([1.0, 2.0], size=n)
    return [rows, scale, weight]


@pytest.mark.parametrize("n,seed", [(1, 0), (2, 1), (17, 2), (60, 3), (256, 4)])
def test_the_dict_path_makes_np_uniques_classes(n: int, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    columns = _columns(np.random.default_rng(seed), n)
    small = grouping.group_jobs(columns, n)
    monkeypatch.setattr(grouping, "SMALL_GROUPING", -1)  # every size through np.unique
    large = grouping.group_jobs(columns, n)
    for name in ("class_of_job", "representative", "sizes"):
        got, want = getattr(small, name), getattr(large, name)
        assert got.dtype == want.dtype == np.int64
        assert np.array_equal(got, want), name


def test_equal_rows_share_a_class_and_nan_equals_nan() -> None:
    rows = np.array([[1.0, np.nan], [2.0, 0.0], [1.0, np.nan], [2.0, -0.0], [1.0, 3.0]])
    classes = grouping.group_jobs([rows], len(rows))
    assert classes.class_of_job.tolist() == [0, 1, 0, 1, 2]
    assert classes.representative.tolist() == [0, 1, 4]
    assert classes.sizes.tolist() == [2, 2, 1]
