"""A cluster of service processes on a private exchange, removed from the broker afterwards."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker import delete_topology
from tests.support.processes import SERVICE_QUEUES, Cluster


@pytest.fixture
def cluster(broker_url: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(broker_url, tmp_path)
    try:
        yield c
    finally:
        c.stop_all()
        asyncio.run(delete_topology(broker_url, c.exchange, (*SERVICE_QUEUES, "observer")))
