"""GAVEL_SUBMISSIONS_MAX_LENGTH: the bound of the mechanism's submissions queue (issue 13), and the
queue arguments it becomes (common/topology.py)."""

from __future__ import annotations

import pytest

from common.config import DEFAULT_SUBMISSIONS_MAX_LENGTH, BusSettings
from common.errors import ConfigError
from common.topology import ESTIMATOR_INPUTS, MECHANISM_SUBMISSIONS, bound_arguments, queue_bounds


def test_the_default_bound_and_none() -> None:
    assert BusSettings.from_env({}).submissions_max_length == DEFAULT_SUBMISSIONS_MAX_LENGTH == 100_000
    assert BusSettings.from_env({"GAVEL_SUBMISSIONS_MAX_LENGTH": "500"}).submissions_max_length == 500
    assert BusSettings.from_env({"GAVEL_SUBMISSIONS_MAX_LENGTH": "None"}).submissions_max_length is None


@pytest.mark.parametrize("raw", ["0", "-5", "lots", "1.5"])
def test_a_bad_bound_names_the_variable(raw: str) -> None:
    with pytest.raises(ConfigError) as e:
        BusSettings.from_env({"GAVEL_SUBMISSIONS_MAX_LENGTH": raw})
    assert str(e.value) == f"GAVEL_SUBMISSIONS_MAX_LENGTH must be a positive integer or 'none', got {raw!r}"


def test_only_the_mechanisms_submissions_are_bounded_and_publishes_past_it_are_refused() -> None:
    """Refused (a nack the submitter hears of), never RabbitMQ's default drop-head, which would
    drop accepted submissions without a word; the estimator's inputs (workers' progress) never."""
    assert queue_bounds(7) == {MECHANISM_SUBMISSIONS.name: 7}
    assert ESTIMATOR_INPUTS.name not in queue_bounds(7)
    assert queue_bounds(None) == {}
    assert bound_arguments(7) == {"x-max-length": 7, "x-overflow": "reject-publish"}
    assert bound_arguments(None) == {}
