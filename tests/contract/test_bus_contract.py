"""The bus contract (common/bus.py), run against InMemoryBus (objects and serialized) and RabbitBus."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import sys

import pytest

from common.bus import Delivery
from common.errors import BusClosedError, EncodeError, NameClaimedError, SubscriptionError, UnroutableError
from common.messages import AllocationComputed, JobRejected, KillJobs, RunJobs, SolveStatus
from common.transport.memory import InMemoryBus
from tests.support.messages import submitted, wire
from tests.support.waiting import Collector, eventually, until


def job_ids(c: Collector) -> list[str]:
    return [d.message.spec.job_id for d in c.deliveries]  # type: ignore[attr-defined]


async def test_topic_wildcards_match_as_amqp(harness):
    bus = await harness.connect()
    hash_c, star_c, mid_c = Collector(), Collector(), Collector()
    await bus.subscribe("hash", ["a.#"], hash_c)
    await bus.subscribe("star", ["a.*"], star_c)
    await bus.subscribe("mid", ["*.b.#"], mid_c)
    body = wire(submitted(1))
    for key in ("a", "a.b", "a.b.c", "x.b", "b"):
        await bus.publish_raw(key, body, mandatory=False)
    await hash_c.wait_for_count(3)
    await star_c.wait_for_count(1)
    await mid_c.wait_for_count(3)
    # One more message to every queue: when it arrives, nothing else can still be on the way.
    for key in ("a.z", "q.b"):
        await bus.publish_raw(key, body, mandatory=False)
    await hash_c.wait_for_count(4)
    await star_c.wait_for_count(2)
    await mid_c.wait_for_count(4)
    assert [d.routing_key for d in hash_c.deliveries] == ["a", "a.b", "a.b.c", "a.z"]  # '#' = zero or more
    assert [d.routing_key for d in star_c.deliveries] == ["a.b", "a.z"]  # '*' = exactly one
    assert [d.routing_key for d in mid_c.deliveries] == ["a.b", "a.b.c", "x.b", "q.b"]


async def test_competing_consumers_share_a_queue_each_message_once(harness):
    bus_a = await harness.connect("a")
    bus_b = await harness.connect("b")
    both_busy = asyncio.Event()
    seen: dict[str, list[str]] = {"a": [], "b": []}

    def handler(name: str):
        async def handle(d: Delivery) -> None:
            seen[name].append(d.message.spec.job_id)  # type: ignore[attr-defined]
            if seen["a"] and seen["b"]:
                both_busy.set()
            # Hold the first delivery until both consumers have one: with prefetch 1 the broker
            # must then hand the second message to the other consumer.
            await both_busy.wait()

        return handle

    await bus_a.subscribe("work", ["job.submitted"], handler("a"), prefetch=1)
    await bus_b.subscribe("work", ["job.submitted"], handler("b"), prefetch=1)
    for i in range(20):
        await bus_a.publish(submitted(i))
    await eventually(lambda: len(seen["a"]) + len(seen["b"]) == 20)
    assert seen["a"] and seen["b"]
    assert sorted(seen["a"] + seen["b"], key=int) == [str(i) for i in range(20)]


async def test_each_distinct_queue_gets_its_own_copy(harness):
    bus = await harness.connect()
    mech, est = Collector(), Collector()
    await bus.subscribe("mechanism", ["job.submitted"], mech)
    await bus.subscribe("estimator", ["job.*"], est)
    for i in range(10):
        await bus.publish(submitted(i))
    await mech.wait_for_count(10)
    await est.wait_for_count(10)
    assert job_ids(mech) == job_ids(est) == [str(i) for i in range(10)]


async def test_worker_commands_reach_only_their_worker(harness):
    bus = await harness.connect()
    w1, w2, fleet = Collector(), Collector(), Collector()
    await bus.subscribe("worker.w1", ["worker.cmd.w1.*"], w1)
    await bus.subscribe("worker.w2", ["worker.cmd.w2.*"], w2)
    with pytest.raises(UnroutableError):  # a worker nobody has registered
        await bus.publish(RunJobs("w9", 3, "lease-3", 7, ("j1",), (0,), 360.0))
    await bus.subscribe("fleet-audit", ["worker.cmd.#"], fleet)
    run = RunJobs("w1", 3, "lease-1", 7, ("j1",), (0,), 360.0, (500,))
    kill = KillJobs("w2", 3, "lease-2", 7, "preempted")
    await bus.publish(run)
    await bus.publish(kill)
    await fleet.wait_for_count(2)
    await w1.wait_for_count(1)
    await w2.wait_for_count(1)
    assert w1.messages == [run] and w2.messages == [kill]
    assert [d.routing_key for d in fleet.deliveries] == ["worker.cmd.w1.run", "worker.cmd.w2.kill"]


async def test_handler_exception_is_dead_lettered_with_reason_and_consuming_continues(harness):
    bus = await harness.connect()
    handled = Collector()

    async def handler(d: Delivery) -> None:
        if d.message.spec.job_id == "13":  # type: ignore[attr-defined]
            raise ValueError("job 13 is cursed")
        await handled(d)

    await bus.subscribe("mechanism", ["job.submitted"], handler)
    for i in (12, 13, 14):
        await bus.publish(submitted(i))
    await handled.wait_for_count(2)
    assert job_ids(handled) == ["12", "14"]
    letters = await _take_dead_letters(bus, 1)
    assert len(letters) == 1
    (letter,) = letters
    assert letter.queue == "mechanism" and letter.routing_key == "job.submitted"
    assert "ValueError" in letter.reason and "job 13 is cursed" in letter.reason
    from common.codec import DEFAULT_CODEC

    assert DEFAULT_CODEC.decode(letter.body).message == submitted(13)


async def test_undecodable_body_is_dead_lettered_with_reason(harness):
    bus = await harness.connect()
    handled = Collector()
    await bus.subscribe("mechanism", ["job.submitted"], handled)
    await bus.publish_raw("job.submitted", b"\x92\x01\x02")  # msgpack [1, 2], not an envelope
    await bus.publish_raw("job.submitted", b"\xc1")  # never valid msgpack
    await bus.publish(submitted(1))
    await handled.wait_for_count(1)
    letters = await _take_dead_letters(bus, 2)
    assert [letter.body for letter in letters] == [b"\x92\x01\x02", b"\xc1"]
    assert all(letter.reason.startswith("undecodable: ") for letter in letters)
    assert "envelope: expected map" in letters[0].reason
    assert "not valid msgpack" in letters[1].reason
    assert job_ids(handled) == ["1"]


async def test_unroutable_publish_raises_unless_not_mandatory(harness):
    bus = await harness.connect()
    with pytest.raises(UnroutableError) as info:
        await bus.publish(JobRejected("7", "unknown job type"))
    assert info.value.routing_key == "job.rejected"
    # Not mandatory: accepted and dropped, as an AMQP broker does.
    await bus.publish(JobRejected("7", "unknown job type"), mandatory=False)


async def test_messages_that_cannot_cross_a_wire_are_refused_at_publish(harness):
    bus = await harness.connect()
    await bus.subscribe("policy-results", ["allocation.#"], Collector())
    bad = AllocationComputed("r1", "max_min_fairness", SolveStatus.OPTIMAL, math.nan, 0.1, ())
    with pytest.raises(EncodeError, match="objective: not a finite number"):
        await bus.publish(bad)


async def test_order_is_kept_per_queue(harness):
    bus = await harness.connect()
    c = Collector()
    await bus.subscribe("ordered", ["job.submitted"], c, prefetch=50)
    for i in range(300):
        await bus.publish(submitted(i))
    await c.wait_for_count(300)
    assert job_ids(c) == [str(i) for i in range(300)]


async def test_cancel_finishes_running_handler_and_returns_unstarted_messages(harness):
    bus = await harness.connect()
    started, release = asyncio.Event(), asyncio.Event()
    finished: list[str] = []

    async def slow(d: Delivery) -> None:
        started.set()
        await release.wait()
        finished.append(d.message.spec.job_id)  # type: ignore[attr-defined]

    sub = await bus.subscribe("work", ["job.submitted"], slow, prefetch=5)
    for i in range(5):
        await bus.publish(submitted(i))
    await asyncio.wait_for(started.wait(), 10)
    cancelling = asyncio.create_task(sub.cancel(timeout_s=10))
    await asyncio.sleep(0)  # let cancel stop new deliveries before the handler is released
    assert not sub.active
    release.set()
    await asyncio.wait_for(cancelling, 15)
    assert finished == ["0"]  # the running handler finished (and was acknowledged)

    rest = Collector()
    await bus.subscribe("work", ["job.submitted"], rest)
    await rest.wait_for_count(4)
    assert job_ids(rest) == ["1", "2", "3", "4"]
    assert all(d.redelivered for d in rest.deliveries)


async def test_publish_on_a_closed_bus_raises(harness):
    bus = await harness.connect()
    await bus.close()
    with pytest.raises(BusClosedError):
        await bus.publish(submitted(1))


async def test_a_delivery_names_the_broker_user_that_published_it(harness):
    """Who sent a message (a job's owner, issue 23) is the broker's word, not the message's."""
    publisher = await harness.connect("publisher")
    got = Collector()
    await publisher.subscribe("owners", ["job.submitted"], got)
    await publisher.publish(submitted(1))
    (delivery,) = await got.wait_for_count(1)
    assert delivery.user_id == publisher.user == "guest"


@pytest.mark.broker
async def test_rabbit_refuses_a_user_id_that_is_not_the_publishers(rabbit):
    """RabbitMQ validates the user-id property: a publisher cannot say it is someone else."""
    import aiormq

    bus = await rabbit.connect("forger")
    await bus.subscribe("owners", ["job.submitted"], Collector())
    connection = await aiormq.connect(rabbit.settings().amqp_url)
    try:
        channel = await connection.channel()  # with publisher confirms: the refusal closes it at once
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed, match="user_id property set to 'mallory'"):
            await channel.basic_publish(
                wire(submitted(2)), exchange=rabbit.exchange, routing_key="job.submitted",
                properties=aiormq.spec.Basic.Properties(user_id="mallory"),
            )
    finally:
        await connection.close()


@pytest.mark.broker
async def test_rabbit_redelivers_after_consumer_process_dies_without_ack(rabbit):
    """A consumer killed with SIGKILL never acknowledged its delivery: the broker redelivers it."""
    bus = await rabbit.connect("survivor")
    sub = await bus.subscribe("work", ["job.submitted"], Collector())  # declare the queue...
    await sub.cancel()  # ...then leave it to the doomed process
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.hold_one",
        rabbit.settings().amqp_url,
        rabbit.exchange,
        "work",
        "job.submitted",
        stdout=asyncio.subprocess.PIPE,
        cwd=os.getcwd(),
    )
    try:
        assert child.stdout is not None
        assert (await asyncio.wait_for(child.stdout.readline(), 30)).strip() == b"ready"
        await bus.publish(submitted(42))
        assert (await asyncio.wait_for(child.stdout.readline(), 30)).strip() == b"holding 42"
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()
    survivor = Collector()
    await bus.subscribe("work", ["job.submitted"], survivor)
    (delivery,) = await survivor.wait_for_count(1, timeout_s=30)
    assert delivery.message == submitted(42)
    assert delivery.redelivered


async def test_memory_drain_waits_for_cascades():
    bus = InMemoryBus()
    await bus.start()
    seen: list[str] = []

    async def first(d: Delivery) -> None:
        seen.append("submitted")
        await bus.publish(JobRejected(d.message.spec.job_id, "no"))  # type: ignore[attr-defined]

    async def second(d: Delivery) -> None:
        await asyncio.sleep(0)
        seen.append("rejected")

    await bus.subscribe("a", ["job.submitted"], first)
    await bus.subscribe("b", ["job.rejected"], second)
    for i in range(50):
        await bus.publish(submitted(i))
    assert not bus.idle
    await bus.drain(timeout_s=10)
    assert bus.idle
    assert seen.count("submitted") == 50 and seen.count("rejected") == 50
    await bus.close()


async def _take_dead_letters(bus, n: int):
    letters: list = []

    async def enough() -> bool:
        letters.extend(await bus.take_dead_letters(n - len(letters)))
        return len(letters) >= n

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while not await enough():
        assert loop.time() < deadline, f"only {len(letters)} of {n} dead letters arrived"
        await asyncio.sleep(0.02)
    return letters


@pytest.mark.parametrize(("queue", "bindings"), [("", ["job.#"]), ("q", ["job..x"]), ("q", ["job.su*"]), ("q", [""])])
async def test_bad_subscriptions_are_refused_with_a_reason(harness, queue, bindings):
    bus = await harness.connect()
    with pytest.raises(SubscriptionError):
        await bus.subscribe(queue, bindings, Collector())


async def test_a_declared_queue_keeps_messages_until_its_consumer_comes(harness):
    producer = await harness.connect("producer")
    await producer.declare("mechanism.submissions", ["job.submitted"])
    for i in range(3):
        await producer.publish(submitted(i))  # nobody consumes yet: not unroutable, not lost
    consumer = await harness.connect("mechanism")
    got = Collector()
    await consumer.subscribe("mechanism.submissions", ["job.submitted"], got)
    await got.wait_for_count(3)
    assert job_ids(got) == ["0", "1", "2"]


async def test_publish_many_keeps_order_and_reports_confirms(harness):
    bus = await harness.connect()
    got = Collector()
    await bus.subscribe("many", ["job.submitted"], got, prefetch=100)
    confirmed: list[int] = []
    ids = await bus.publish_many([submitted(i) for i in range(700)], on_confirmed=confirmed.append)
    assert len(set(ids)) == 700
    assert confirmed == list(range(1, 701))  # every confirm counted once, the last one is all of them
    await got.wait_for_count(700)
    assert job_ids(got) == [str(i) for i in range(700)]
    assert [d.envelope.message_id for d in got.deliveries] == ids


async def test_handlers_finishing_out_of_order_all_get_acknowledged(harness):
    """Many handlers at once finish in another order than they started (RabbitMQ acknowledges
    runs of them with one frame): after a cancel, nothing handled comes back."""
    bus = await harness.connect()
    handled: list[str] = []

    async def uneven(d: Delivery) -> None:
        for _ in range(int(d.message.spec.job_id) % 7):  # type: ignore[attr-defined]
            await asyncio.sleep(0)
        handled.append(d.message.spec.job_id)  # type: ignore[attr-defined]

    sub = await bus.subscribe("uneven", ["job.submitted"], uneven, prefetch=64, concurrency=16)
    await bus.publish_many([submitted(i) for i in range(400)])
    await eventually(lambda: len(handled) == 400)
    assert handled != sorted(handled, key=int)  # they really finished out of order
    await sub.cancel(timeout_s=10)
    after = Collector()
    await bus.subscribe("uneven", ["job.submitted"], after)
    await bus.publish(submitted(1000))
    await after.wait_for_count(1)
    assert job_ids(after) == ["1000"]  # no redelivery of anything already handled


async def test_consumer_count_tells_a_missing_queue_an_idle_one_and_a_consumed_one(harness):
    """A publish to a queue nobody consumes waits there silently: the count lets a caller that
    expects an answer (the mechanism asking the policy) say so at once (issue 9)."""
    bus = await harness.connect()
    assert await bus.consumer_count("nobody.here") is None
    await bus.declare("idle.queue", ["idle.key"])
    assert await bus.consumer_count("idle.queue") == 0
    consumer = await harness.connect("consumer")
    first = await consumer.subscribe("idle.queue", ["idle.key"], Collector())
    second = await consumer.subscribe("idle.queue", ["idle.key"], Collector())
    assert await bus.consumer_count("idle.queue") == 2
    await first.cancel()
    await second.cancel()
    assert await bus.consumer_count("idle.queue") == 0


async def test_queue_depth_counts_what_waits_and_dead_letters_are_counted_per_queue(harness):
    """What metrics read (gavel_queue_messages, gavel_dead_letter_messages,
    gavel_messages_dead_lettered_total): the messages ready in a queue, None for one that does
    not exist; the dead-letter queue's depth; what this connection dead-lettered, per queue."""
    bus = await harness.connect()
    assert await bus.queue_depth("nobody.here") is None
    await bus.declare("waiting.queue", ["waiting.key"])
    assert await bus.queue_depth("waiting.queue") == 0
    for _ in range(3):
        await bus.publish_raw("waiting.key", b"\xc1")
    assert await bus.queue_depth("waiting.queue") == 3
    before = await bus.dead_letter_depth()
    handled = Collector()
    await bus.subscribe("waiting.queue", ["waiting.key"], handled)  # all three undecodable: dead-lettered

    async def dead_lettered() -> bool:
        return await bus.dead_letter_depth() == (before or 0) + 3 and await bus.queue_depth("waiting.queue") == 0

    await until(dead_lettered, timeout_s=20)
    assert bus.dead_lettered["waiting.queue"] == 3 and handled.deliveries == []
    await _take_dead_letters(bus, 3)
    assert await bus.dead_letter_depth() == (before or 0)


async def test_a_claim_is_held_by_one_connection_until_it_closes(harness):
    """Two processes must not both run as one worker id (issue 23): the broker holds the claim,
    refuses it to every other connection, and frees it when its holder's connection closes (as a
    process that dies closes it)."""
    first = await harness.connect("first")
    second = await harness.connect("second")
    await first.claim("worker.k80-0")
    await first.claim("worker.k80-0")  # the holder may claim again (a re-announcement)
    with pytest.raises(NameClaimedError, match="worker.k80-0"):
        await second.claim("worker.k80-0")
    await second.claim("worker.k80-1")  # other names are free
    await first.close()
    await second.claim("worker.k80-0")  # the broker deleted the claim with the connection


# -- bounded queues: backpressure on submissions (issue 13) ------------------------------------------


async def bounded(harness, bound: int, source: str = "test"):  # noqa: ANN201
    """A connection whose bounded queues of common/topology.py (the mechanism's submissions) hold
    at most ``bound`` messages waiting: RabbitMQ's from the settings, as every gavel declares them;
    the in-memory bus's from its broker's, as the embedded default makes it (common.transport.make_bus)."""
    return await harness.connect(source, submissions_max_length=bound)


async def test_a_full_bounded_queue_refuses_a_publish_that_other_queues_still_take(harness):
    """x-max-length with reject-publish: past the bound the publisher is told (QueueFullError),
    nothing is dropped without a word; a queue with room keeps its copy, as RabbitMQ does; once
    the consumer has taken some, there is room again."""
    from common.errors import QueueFullError
    from common.topology import MECHANISM_SUBMISSIONS as SUBMISSIONS

    bus = await bounded(harness, 3)
    await bus.declare(SUBMISSIONS.name, SUBMISSIONS.bindings)
    audit = Collector()
    await bus.subscribe("audit", ["job.submitted"], audit)  # unbounded
    outcomes = []
    for i in range(5):
        try:
            await bus.publish(submitted(i))
            outcomes.append("accepted")
        except QueueFullError as e:
            outcomes.append("refused")
            assert "full" in str(e)
    assert outcomes == ["accepted"] * 3 + ["refused"] * 2
    await audit.wait_for_count(5)
    assert job_ids(audit) == [str(i) for i in range(5)]
    mechanism = Collector()
    await bus.subscribe(SUBMISSIONS.name, SUBMISSIONS.bindings, mechanism)
    await mechanism.wait_for_count(3)
    await bus.publish(submitted(5))  # room again
    await mechanism.wait_for_count(4)
    assert job_ids(mechanism) == ["0", "1", "2", "5"]


async def test_publish_many_publishes_the_rest_and_then_names_the_refused(harness):
    from common.errors import QueueFullError
    from common.topology import MECHANISM_SUBMISSIONS as SUBMISSIONS

    bus = await bounded(harness, 3)
    await bus.declare(SUBMISSIONS.name, SUBMISSIONS.bindings)
    settled: list[int] = []
    with pytest.raises(QueueFullError) as refused:
        await bus.publish_many([submitted(i) for i in range(6)], on_confirmed=settled.append)
    assert refused.value.refused == (3, 4, 5)
    assert len(set(refused.value.message_ids)) == 6 and settled[-1] == 6
    mechanism = Collector()
    await bus.subscribe(SUBMISSIONS.name, SUBMISSIONS.bindings, mechanism)
    await mechanism.wait_for_count(3)
    assert [d.envelope.message_id for d in mechanism.deliveries] == list(refused.value.message_ids[:3])


async def test_the_bound_counts_messages_waiting_not_those_a_consumer_holds(harness):
    """As RabbitMQ counts x-max-length (ready messages only): a consumer's prefetch is on top."""
    from common.errors import QueueFullError
    from common.topology import MECHANISM_SUBMISSIONS as SUBMISSIONS

    bus = await bounded(harness, 2)
    release = asyncio.Event()
    held = Collector()

    async def hold(d: Delivery) -> None:
        await held(d)
        await release.wait()

    await bus.subscribe(SUBMISSIONS.name, SUBMISSIONS.bindings, hold, prefetch=1)
    await bus.publish(submitted(0))
    await held.wait_for_count(1)  # delivered, unacknowledged: not counted
    await bus.publish(submitted(1))
    await bus.publish(submitted(2))
    with pytest.raises(QueueFullError):
        await bus.publish(submitted(3))
    release.set()
    await held.wait_for_count(3)
    assert job_ids(held) == ["0", "1", "2"]


async def test_an_unbounded_setting_declares_no_bound(harness):
    from common.topology import MECHANISM_SUBMISSIONS as SUBMISSIONS

    bus = await harness.connect(submissions_max_length=None) if harness.is_rabbit else await harness.connect()
    await bus.declare(SUBMISSIONS.name, SUBMISSIONS.bindings)
    await bus.publish_many([submitted(i) for i in range(50)])  # nothing refused
    mechanism = Collector()
    await bus.subscribe(SUBMISSIONS.name, SUBMISSIONS.bindings, mechanism)
    await mechanism.wait_for_count(50)
