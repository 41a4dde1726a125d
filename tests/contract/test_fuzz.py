"""Hostile bodies at a live subscription: each ends handled or dead-lettered with a reason, and
the subscription keeps consuming. Runs against every bus."""

from __future__ import annotations

import asyncio

import pytest

from common.bus import Delivery
from common.codec import DEFAULT_CODEC
from common.errors import DecodeError
from tests.support.fuzz import hostile_bodies
from tests.support.messages import submitted
from tests.support.seeds import deep
from tests.support.waiting import Collector

N_BODIES = 10_000
# On RabbitMQ every dead letter is a confirmed publish (~4-12 ms each on 2 cores): under `make test`
# it takes the corpus's first 2,500 bodies (every kind of hostile body, in the same proportions:
# the corpus cycles through its kinds), all 10,000 under `make test-deep`. The in-memory buses
# take all 10,000 in both tiers: the decoder and the dead-lettering are the same code.
RABBIT_BODIES = N_BODIES if deep() else 2_500


@pytest.mark.slow  # 10,000 hostile bodies: ~7-9 s in memory; on RabbitMQ 2,500 ~10-30 s (10,000: 40-120 s, make test-deep)
@pytest.mark.deep
@pytest.mark.timeout(600)
async def test_hostile_bodies_are_dead_lettered_with_reasons_and_consuming_continues(harness):
    bus = await harness.connect()
    handled = Collector()

    async def strict_handler(d: Delivery) -> None:
        # What a service does with a message that decoded but makes no sense to it.
        if d.routing_key != d.message.routing_key():
            raise TypeError(f"{type(d.message).__name__} arrived on {d.routing_key}")
        await handled(d)

    await bus.subscribe("mechanism", ["job.submitted"], strict_handler, prefetch=256)
    n_bodies = RABBIT_BODIES if harness.is_rabbit else N_BODIES
    bodies = list(hostile_bodies(n_bodies, seed=7))
    expected_good = 0
    for body in bodies:
        try:
            expected_good += DEFAULT_CODEC.decode(body).message.routing_key() == "job.submitted"
        except DecodeError:
            pass

    window = 256
    for start in range(0, n_bodies, window):
        await asyncio.gather(*(bus.publish_raw("job.submitted", b) for b in bodies[start : start + window]))

    letters = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 400  # RabbitMQ took ~120 s on 2 busy cores (each dead letter a confirmed publish)
    while len(handled.deliveries) + len(letters) < n_bodies:
        batch = await bus.take_dead_letters(5000)
        letters.extend(batch)
        assert loop.time() < deadline, f"{len(handled.deliveries)} handled + {len(letters)} dead of {n_bodies}"
        if not batch:
            await asyncio.sleep(0.05)

    assert len(handled.deliveries) == expected_good
    assert len(handled.deliveries) + len(letters) == n_bodies
    assert all(letter.reason and letter.queue == "mechanism" for letter in letters)
    for letter in letters:  # each dead letter really was bad, and says how
        if letter.reason.startswith("undecodable: "):
            try:
                DEFAULT_CODEC.decode(letter.body)
            except DecodeError as e:
                assert letter.reason == f"undecodable: {e.reason}"
            else:
                raise AssertionError(f"decodable body dead-lettered as undecodable: {letter.reason}")
        else:
            assert letter.reason.startswith("handler failed: TypeError")

    # Still consuming after all that.
    await bus.publish(submitted(99_999))
    await handled.wait_until(lambda: any(d.message == submitted(99_999) for d in handled.deliveries))
