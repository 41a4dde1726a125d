"""A consumer process that takes one delivery and never acknowledges it (until it is killed).

Usage: python -m tests.support.hold_one AMQP_URL EXCHANGE QUEUE BINDING
Prints "ready" once subscribed and "holding <job id>" when it has the message.
"""

from __future__ import annotations

import asyncio
import sys

from common.bus import Delivery
from common.config import BusSettings
from common.log import configure_logging
from common.transport.rabbit import RabbitBus


async def main(url: str, exchange: str, queue: str, binding: str) -> None:
    configure_logging()  # to stderr: stdout carries the protocol lines
    bus = RabbitBus(BusSettings(kind="amqp", amqp_url=url, exchange=exchange), source="hold-one")
    await bus.start()
    forever = asyncio.Event()

    async def hold(delivery: Delivery) -> None:
        print(f"holding {delivery.message.spec.job_id}", flush=True)  # type: ignore[attr-defined]
        await forever.wait()

    await bus.subscribe(queue, [binding], hold, prefetch=1)
    print("ready", flush=True)
    await forever.wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
