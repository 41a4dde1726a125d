"""Reaching the test broker: an AMQP URL that works, or a clear failure under `make test`/CI."""

from __future__ import annotations

import os

from common.config import DEFAULT_AMQP_URL


def amqp_url() -> str:
    return os.environ.get("GAVEL_AMQP_URL") or DEFAULT_AMQP_URL


def broker_required() -> bool:
    """`make test` and CI set GAVEL_REQUIRE_BROKER=1: an unreachable broker is then a failure."""
    return os.environ.get("GAVEL_REQUIRE_BROKER") == "1" or os.environ.get("CI", "") not in ("", "0", "false")


async def delete_topology(url: str, exchange: str, queues: tuple[str, ...] = ()) -> None:
    """Remove what a test (or a process it started) declared on the broker under ``exchange``."""
    from common.config import BusSettings
    from common.transport.rabbit import RabbitBus

    bus = RabbitBus(BusSettings(kind="amqp", amqp_url=url, exchange=exchange), source="cleanup")
    await bus.start()
    await bus.delete_topology(f"{exchange}.{q}" for q in queues)
    await bus.close()
