"""Hostile input end to end (issue 13): while a trace runs through the services on the in-memory
bus, hostile bodies are published on every routing key a service consumes -- random bytes,
mutated messages, msgpack of the wrong shape, and well-formed messages of another key. No
service stops, every one of them is dead-lettered with its reason, and the trace's results are
an undisturbed run's to the bit. A sweep (mark `deep`): 2,500 bodies a key under `make test`
(~40,000 in all), 10,000 under `make test-deep` (~160,000), the same seeded bodies' first ones."""

from __future__ import annotations

import collections

import pytest

from common.bus import Delivery
from common.codec import DEFAULT_CODEC
from common.messages import RoundStarted
from mechanism_service.core.settings import preset
from policy_service.service import shipped_context
from sim.driver import simulate_services
from sim.fastpath import RunConfig
from sim.traces import read_trace
from tests.support.data import REFERENCE
from tests.support.fuzz import hostile_bodies, poison_for
from tests.support.seeds import sweep

BODIES_PER_KEY = len(sweep(10_000, 2_500))  # tests/support/seeds.py
COMMAND_KINDS = ("run", "extend", "kill", "rendezvous", "fenced")  # worker.cmd.<worker>.<kind>


class Poisoner:
    """Publishes the hostile bodies on every key the services bound, half at the third round's
    start and half at the fortieth: while the trace runs."""

    name = "poisoner"

    def __init__(self) -> None:
        self.bus = None
        self.rounds = 0
        self.sent: collections.Counter[str] = collections.Counter()

    async def start(self, bus) -> None:  # noqa: ANN001 - a Bus
        self.bus = bus
        await bus.subscribe(self.name, [RoundStarted.ROUTING_KEY], self._round, durable=False)

    async def stop(self) -> None:
        return None

    async def _round(self, d: Delivery) -> None:
        self.rounds += 1
        if self.rounds not in (3, 40):
            return
        for key in consumed_keys(self.bus._bus.broker):  # noqa: SLF001 - the test's own bus
            half = BODIES_PER_KEY // 2
            for body in poison_for(key, list(hostile_bodies(half, seed=self.rounds))):
                await self.bus.publish_raw(key, body)
                self.sent[key] += 1


def consumed_keys(broker) -> list[str]:  # noqa: ANN001 - an InMemoryBroker
    """Every routing key the services' queues are bound to, the poisoner's own queue aside; of
    the workers' command keys (a wildcard per worker, the same handler), the first worker's,
    once per kind of command."""
    keys = set()
    bindings = broker._bindings  # noqa: SLF001 - the test's own broker
    commands = [pattern for pattern, queue in bindings if "*" in pattern and queue != Poisoner.name]
    for pattern, queue in bindings:
        if queue == Poisoner.name or "*" in pattern:
            continue
        keys.add(pattern)
    keys.update(commands[0].replace("*", kind) for kind in COMMAND_KINDS)
    return sorted(keys)


@pytest.mark.deep
@pytest.mark.slow  # two runs of a trace and the bodies: ~10 s under make test, ~30-80 s deep
async def test_hostile_bodies_on_every_key_while_a_trace_runs_are_dead_lettered_and_change_nothing() -> None:
    context = shipped_context()
    trace = read_trace(REFERENCE / "static_n32_seed0.trace")
    config = RunConfig("max_min_fairness_perf", {"v100": 4, "p100": 4, "k80": 4}, preset("default", "max_min_fairness_perf"))
    undisturbed = await simulate_services(trace, config, context)
    poisoner = Poisoner()
    poisoned = await simulate_services(trace, config, context, observers=[poisoner])

    assert poisoner.rounds > 40  # both halves went out while jobs were running
    assert poisoned.jobs == undisturbed.jobs  # each job's start, completion, steps and GPU time
    assert poisoned.rounds == undisturbed.rounds
    keys = consumed_keys(poisoner.bus._bus.broker)  # noqa: SLF001
    assert {"job.submitted", "job.progress", "allocation.computed", "allocation.requested", "worker.registered"} <= set(keys)
    assert any(k.startswith("worker.cmd.") for k in keys)
    assert set(poisoner.sent) == set(keys) and min(poisoner.sent.values()) > BODIES_PER_KEY * 0.9

    letters = poisoner.bus._bus.broker.take_dead_letters(10**7)  # noqa: SLF001
    by_key = collections.Counter(letter.routing_key for letter in letters)
    assert by_key == poisoner.sent  # every one, none lost, nothing else
    reasons = collections.Counter(letter.reason.split(":")[0] for letter in letters)
    assert set(reasons) == {"undecodable", "handler failed"}, reasons
    for letter in letters:  # each says why: undecodable, or of another key (the host's check)
        if letter.reason.startswith("handler failed"):
            message = DEFAULT_CODEC.decode(letter.body).message
            assert letter.reason == (
                f"handler failed: MisroutedError: a {type(message).__name__} belongs on {message.routing_key()}, "
                f"it arrived on {letter.routing_key}"
            )
