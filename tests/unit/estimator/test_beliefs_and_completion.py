"""The estimator's arithmetic: combining evidence in log space, and completing a low-rank matrix."""

from __future__ import annotations

import math

import numpy as np
import pytest

from common.messages import Provenance
from estimator_service.core.beliefs import Source, combine
from estimator_service.core.evidence import JobEvidence
from estimator_service.core.completion import CompletionSettings, complete


def measured(values: list[float], sd: float) -> list[Source]:
    """Repeated measurements of one figure, as a job's evidence gives them."""
    job = JobEvidence("j", "c", 1, 0)
    for value in values:
        job.record("v100", "", "w", value, False)
    return job.alone_sources("v100", sd)


def test_precision_weighting_lets_measurements_outweigh_a_guess():
    guess = Source(20.0, 0.5**2, Provenance.USER)  # a user's estimate, 2x too high
    belief = combine([guess, *measured([10.0, 10.0, 10.0], 0.05)])
    assert belief is not None
    assert belief.provenance is Provenance.MEASURED
    # posterior log error = log 2 x (1/0.25) / (1/0.25 + 3/0.0025)
    assert math.log(belief.value / 10.0) == pytest.approx(math.log(2) * 4 / (4 + 1200), rel=1e-9)
    assert belief.confidence > 0.9  # three measurements of sd 5%: within 3%


def test_a_measured_zero_wins_until_positives_outnumber_it():
    assert combine([Source(5.0, 0.01, Provenance.REFERENCE), *measured([0.0], 0.05)]).value == 0.0
    assert combine(measured([0.0, 3.0, 3.0], 0.05)).value == pytest.approx(3.0)
    # a zero from a prior holds only until something positive is measured
    assert combine([Source(0.0, 0.09, Provenance.REFERENCE)]).value == 0.0
    assert combine([Source(0.0, 0.09, Provenance.REFERENCE), *measured([2.0], 0.05)]).value == pytest.approx(2.0)


def test_no_evidence_is_no_belief():
    assert combine([]) is None


def test_completion_recovers_a_low_rank_matrix_from_a_third_of_it():
    # rank 2, and rank 3 once its columns are centred
    rng = np.random.default_rng(3)
    truth = rng.uniform(0.2, 1.0, size=(30, 2)) @ rng.uniform(0.2, 1.0, size=(2, 60)) / 2
    observed = rng.random(truth.shape) < 0.35
    completed = complete(truth, observed, CompletionSettings(rank=3, regularisation=1e-3, iterations=200, tolerance=1e-9))
    hidden = ~observed
    assert np.median(np.abs(completed[hidden] - truth[hidden]) / truth[hidden]) < 0.02


def test_completion_is_deterministic_and_fills_an_empty_row_with_column_means():
    values = np.array([[1.0, 2.0], [3.0, 4.0], [np.nan, np.nan]])
    observed = np.isfinite(values)
    first, second = complete(values, observed), complete(values, observed)
    assert np.array_equal(first, second)
    assert first[2] == pytest.approx([2.0, 3.0], abs=1e-6)
