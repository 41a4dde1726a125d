"""The retention rule (mechanism_service/core/retention.py): which finished jobs a mechanism
forgets, and when."""

from __future__ import annotations

import math

import pytest

from common.errors import ConfigError
from mechanism_service.core.retention import KEEP_ALL, LIVE, Retention, excess, expired_jobs

ENDED = {"a": 10.0, "b": 20.0, "c": 30.0, "d": 40.0}  # in the order they ended


def test_a_job_goes_once_it_is_as_old_as_the_rule_and_not_before() -> None:
    rule = Retention(finished_s=15.0, finished_jobs=None)
    assert expired_jobs(ENDED, 24.9, rule) == []
    assert expired_jobs(ENDED, 25.0, rule) == ["a"]  # ended 15 s ago
    assert expired_jobs(ENDED, 45.0, rule) == ["a", "b", "c"]


def test_beyond_the_count_the_oldest_go_whatever_their_age() -> None:
    rule = Retention(finished_s=None, finished_jobs=1)
    assert expired_jobs(ENDED, 0.0, rule) == ["a", "b", "c"]
    assert expired_jobs(ENDED, 0.0, Retention(finished_s=None, finished_jobs=4)) == []


def test_age_and_count_together_forget_each_job_once() -> None:
    rule = Retention(finished_s=15.0, finished_jobs=3)
    assert expired_jobs(ENDED, 35.0, rule) == ["a", "b"]  # "a" by count and age, "b" by age


def test_the_walk_stops_at_the_first_job_young_enough() -> None:
    # ended_at_s is in end order: a later job is never older, so nothing past it is looked at
    ended = {"a": 10.0, "b": 50.0, "c": 20.0}
    assert expired_jobs(ended, 40.0, Retention(finished_s=15.0, finished_jobs=None)) == ["a"]


def test_keep_all_forgets_nothing_and_the_live_default_bounds_everything() -> None:
    assert KEEP_ALL.keeps_all and expired_jobs(ENDED, 1e12, KEEP_ALL) == []
    assert not LIVE.keeps_all
    assert None not in (LIVE.finished_s, LIVE.finished_jobs, LIVE.rounds, LIVE.lost_workers)
    assert excess(10, None) == 0 and excess(10, 4) == 6 and excess(3, 4) == 0


@pytest.mark.parametrize("field", ["finished_s", "finished_jobs", "rounds", "lost_workers"])
@pytest.mark.parametrize("bad", [-1, math.nan])
def test_a_negative_or_nan_limit_is_refused_with_its_name(field: str, bad: float) -> None:
    with pytest.raises(ConfigError, match=field):
        Retention(**{field: bad})  # type: ignore[arg-type]
