"""The straggler watch remembers a bounded number of workers: the most recently measured."""

from __future__ import annotations

import pytest

from estimator_service.core import stragglers
from estimator_service.core.stragglers import StragglerWatch


def test_the_least_recently_measured_workers_are_forgotten_with_their_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stragglers, "WORKERS_KEPT", 3)
    watch = StragglerWatch(threshold=0.7, jobs=1)
    assert watch.observe("slow", "j", 1.0, 10.0) is not None  # flagged at once (one job is enough here)
    for worker in ("a", "b"):
        watch.observe(worker, "j", 10.0, 10.0)
    watch.observe("slow", "k", 1.0, 10.0)  # measured again: the most recent now
    watch.observe("c", "j", 10.0, 10.0)  # a fourth worker: the least recently measured ("a") goes
    assert list(watch.ratios) == ["b", "slow", "c"] and watch.is_flagged("slow")
    watch.observe("d", "j", 10.0, 10.0)
    watch.observe("e", "j", 10.0, 10.0)
    assert list(watch.ratios) == ["c", "d", "e"]
    assert not watch.is_flagged("slow") and watch.flagged == {}  # gone, with its flag


def test_every_measured_worker_has_a_speed_ratio_flagged_or_not() -> None:
    watch = StragglerWatch(threshold=0.7, jobs=3)
    for job, measured in (("a", 5.0), ("b", 6.0), ("c", 4.0)):
        watch.observe("slow", job, measured, 10.0)  # 0.5, 0.6, 0.4 of the prediction: flagged
    watch.observe("fine", "a", 9.0, 10.0)  # one job: too few to judge, measured all the same
    watch.observe("none", "a", 0.0, 10.0)  # nothing measured: no ratio
    ratios = watch.speed_ratios()
    assert set(ratios) == {"slow", "fine"} and watch.is_flagged("slow") and not watch.is_flagged("fine")
    assert ratios["slow"] == pytest.approx(0.5) and ratios["fine"] == pytest.approx(0.9)
