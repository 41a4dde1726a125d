"""Which workers are lost at time t: a pure function of when each was last heard, the grace and t."""

from __future__ import annotations

from mechanism_service.core.liveness import WAKE_MARGIN, next_check_s, silence_reason, silent_workers


def test_a_worker_is_lost_only_when_silent_for_longer_than_the_grace():
    heard = {"a": 100.0, "b": 120.0, "c": 99.5}
    assert silent_workers(heard, 30.0, 130.0) == ["c"]  # a: silent exactly the grace, not longer
    assert silent_workers(heard, 30.0, 130.5) == ["c", "a"]  # longest silent first
    assert silent_workers({"b": 1.0, "a": 1.0}, 30.0, 40.0) == ["a", "b"]  # ties by id
    assert silent_workers({}, 30.0, 1e9) == []


def test_the_watchdog_wakes_just_after_the_earliest_deadline():
    heard = {"a": 100.0, "b": 120.0}
    wait_s = next_check_s(heard, 30.0, 110.0)
    assert wait_s == 20.0 + 30.0 * WAKE_MARGIN
    assert silent_workers(heard, 30.0, 110.0 + wait_s) == ["a"]  # due by then, and only a
    assert next_check_s(heard, 30.0, 500.0) == 30.0 * WAKE_MARGIN  # overdue: at once (but never a zero spin)
    assert next_check_s({}, 30.0, 0.0) == 30.0 * (1 + WAKE_MARGIN)  # nobody watched: a grace


def test_the_reason_says_how_long_and_the_grace():
    assert silence_reason(100.0, 30.0, 131.25) == "no heartbeat for 31.2 s (grace 30 s)"
