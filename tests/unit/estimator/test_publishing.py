"""A figure is published again only when it says something new (estimator_service/core/publishing.py)."""

from __future__ import annotations

from common.messages import ColocationEstimate, JobThroughput, Provenance
from estimator_service.core.publishing import differs

REF, MEASURED = Provenance.REFERENCE, Provenance.MEASURED


def row(v100: float, confidence: float, provenance: Provenance = REF) -> JobThroughput:
    return JobThroughput("j", {"v100": v100}, {"v100": provenance}, {"v100": confidence}, "c")


def test_a_move_within_the_figures_own_uncertainty_is_not_published_again():
    known_within_30_percent = 0.1  # confidence 0.1: sd 0.3 (log)
    assert not differs(row(10.0, known_within_30_percent), row(11.0, known_within_30_percent), 0.005, 1.0)
    assert differs(row(10.0, known_within_30_percent), row(14.0, known_within_30_percent), 0.005, 1.0)
    assert differs(row(10.0, known_within_30_percent), row(11.0, known_within_30_percent), 0.005, 0.0)  # the rule off


def test_a_confident_figure_moves_by_the_tolerance_and_zeros_and_provenance_always_count():
    assert differs(row(10.0, 0.99), row(10.2, 0.99), 0.005, 1.0)  # sd 0.01: a 2% move is news
    assert not differs(row(10.0, 0.99), row(10.03, 0.99), 0.005, 1.0)
    assert differs(row(10.0, 0.01), row(0.0, 0.01), 0.005, 1.0)  # cannot run there
    assert differs(row(10.0, 0.1), row(10.5, 0.9, MEASURED), 0.005, 1.0)  # measured now
    assert differs(None, row(10.0, 0.1), 0.005, 1.0)


def test_a_pairs_fractions_move_with_the_confidence_of_its_weaker_member():
    def pair(a: float, b: float, confidence: float) -> ColocationEstimate:
        return ColocationEstimate(("a", "b"), {"k80": (a, b)}, {"k80": REF}, {"k80": confidence})

    assert not differs(pair(0.5, 0.6, 0.2), pair(0.55, 0.6, 0.2), 0.005, 1.0)  # sd 0.2: a 10% move
    assert differs(pair(0.5, 0.6, 0.2), pair(0.5, 0.8, 0.2), 0.005, 1.0)
