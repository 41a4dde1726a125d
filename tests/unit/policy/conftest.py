"""Fixtures for policy tests (builders live in builders.py)."""

from __future__ import annotations

import pytest

from common.throughputs import ThroughputTable
from tests.unit.policy.builders import gavel_table


@pytest.fixture(scope="session")
def table() -> ThroughputTable:
    return gavel_table()
