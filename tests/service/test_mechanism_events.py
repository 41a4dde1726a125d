"""The cluster's events (`gavel events`) as a live mechanism says them, on the in-memory bus (every
message through the codec) with the real policy service and scripted workers on the test's clock:
a start, joins, a round's placements, a completion, a loss and the move it causes, in the order
they happened, on `event.<kind>` and in the answer to the status query `events`."""

from __future__ import annotations

import dataclasses
import pathlib

from common.messages import CancelJob, ClusterEvent, ExtendLease, JobSpec, RunJobs, WorkerRegistered
from common.transport.memory import InMemoryBroker, InMemoryBus
from mechanism_service.service import MechanismService
from services.cli.status_cmd import ask_on
from tests.support.clock import SteppedClock
from tests.support.waiting import Collector, eventually, until
from tests.support.world import GRACE_S, RESNET, kill, live_mechanism, world


async def test_a_rounds_events_come_out_in_the_order_they_happened_and_the_status_query_keeps_them() -> None:
    heard = Collector()

    async def listen(bus) -> None:  # noqa: ANN001 - before the mechanism starts: its start is heard too
        await bus.subscribe("test.cluster-events", [ClusterEvent.ROUTING_KEY.replace("{kind}", "*")], heard, durable=False)

    w = await world(before=listen)
    a, b = await w.worker("a", "v100"), await w.worker("b", "k80")
    await w.submit(JobSpec("long", RESNET, 10**6), JobSpec("short", RESNET, 100))
    # round 0: the short job on the V100, the long one on the K80 (the policy's answer, seeded)
    first = {x.worker_id: await x.next(RunJobs) for x in (a, b)}
    assert [first[x].job_ids for x in "ab"] == [("short",), ("long",)]  # type: ignore[attr-defined]
    for x in (a, b):
        await x.report(first[x.worker_id], steps=100)  # type: ignore[arg-type]
    # round 1: the short job completed; the long one moves to the V100
    await a.next(RunJobs)
    # a falls silent: lost, and the long job moves back to b
    await w.beat(a, b)
    w.clock.advance(GRACE_S * 2 / 3)
    await w.beat(b)
    w.clock.advance(GRACE_S * 2 / 3)
    await heard.wait_until(lambda: any(e.kind == "placed" and e.round_id == 2 for e in heard.messages))  # type: ignore[attr-defined]

    said: list[ClusterEvent] = heard.messages  # type: ignore[assignment]
    assert [(e.kind, e.round_id, e.job_id or e.worker_id, e.detail) for e in said] == [
        ("mechanism_started", 0, "", "epoch 1, started afresh"),
        ("worker_joined", 0, "a", "1 GPU"),
        ("worker_joined", 0, "b", "1 GPU"),
        ("round_started", 0, "", "2 leases, 2 jobs running"),
        ("placed", 0, "short", "started on v100 on a (1 GPU)"),
        ("placed", 0, "long", "started on k80 on b (1 GPU)"),
        ("completed", 0, "short", ""),
        ("round_ended", 0, "", "1 job ended"),
        ("round_started", 1, "", "1 lease, 1 job running"),
        ("placed", 1, "long", "moved to v100 on a (1 GPU), from k80"),
        ("worker_lost", 1, "a", "1 GPU: no heartbeat for 40.0 s (grace 30 s)"),
        ("round_ended", 1, "", ""),
        ("round_started", 2, "", "1 lease, 1 job running"),
        ("placed", 2, "long", "moved to k80 on b (1 GPU), from v100"),
    ]
    assert said[6].accelerator_type == "v100" and said[10].accelerator_type == "v100"
    assert all(d.envelope.message_id == e.event_id for d, e in zip(heard.deliveries, said, strict=True))
    assert [e.time_s for e in said] == sorted(e.time_s for e in said)
    assert said[10].time_s == said[-1].time_s == w.clock.t

    recent = await ask_on(w.bus, "events", timeout_s=10)
    assert isinstance(recent, dict) and recent["now_s"] == w.clock.t and recent["round_id"] == 2
    assert [e["id"] for e in recent["events"]] == [e.event_id for e in said]
    one_job = await ask_on(w.bus, "events", job_id="long", timeout_s=10)
    assert [(e["kind"], e["round_id"]) for e in one_job["events"]] == [("placed", 0), ("placed", 1), ("placed", 2)]  # type: ignore[index]
    shares = await ask_on(w.bus, "shares", timeout_s=10)
    assert set(shares) == {"long"} and sum(shares["long"].values()) > 0  # type: ignore[index, union-attr]
    await w.mechanism.stop()


async def test_a_cancel_before_admission_is_an_event_said_once() -> None:
    heard = Collector()

    async def listen(bus) -> None:  # noqa: ANN001
        await bus.subscribe("test.cluster-events", ["event.cancelled"], heard, durable=False)

    w = await world(before=listen)
    await w.submit(JobSpec("waiting", RESNET, 1000))  # no worker: it is never admitted
    for _ in range(2):  # the second cancel is a repeat: nothing new to say
        await w.bus.publish(CancelJob("waiting", "not needed"))
    recent: dict = {}

    async def kept() -> bool:
        recent.update(await ask_on(w.bus, "events", job_id="waiting", timeout_s=10))  # type: ignore[arg-type]
        return bool(recent["events"])

    await until(kept, timeout_s=10)
    await heard.wait_for_count(1)
    assert [(e["kind"], e["detail"]) for e in recent["events"]] == [("cancelled", "not needed")]
    assert [m.kind for m in heard.messages] == ["cancelled"]  # type: ignore[attr-defined]
    await w.mechanism.stop()


async def test_a_mechanism_without_events_says_none() -> None:
    """The simulator's (MechanismConfig.events=False): nobody watches, nothing is said or kept."""
    clock = SteppedClock()
    bus = InMemoryBus(InMemoryBroker(serialize=True), source="test")
    await bus.start()
    heard = Collector()
    await bus.subscribe("test.cluster-events", ["event.*"], heard, durable=False)
    config = dataclasses.replace(live_mechanism(None, clock).config, events=False)
    mechanism = MechanismService(config, clock=clock)
    await mechanism.start(bus)
    await bus.publish(WorkerRegistered("a", "v100", 1, "a"))
    await eventually(lambda: mechanism.workers.held("a") is not None)
    recent = await ask_on(bus, "events", timeout_s=10)
    assert recent["events"] == [] and heard.messages == []  # type: ignore[index]
    await mechanism.stop()


async def test_a_restart_on_the_journal_says_so_with_its_epoch_and_starts_its_events_afresh(tmp_path: pathlib.Path) -> None:
    """A fail-over or a restart: the new incarnation's first event names its epoch and where it
    took up the journal; the old incarnation's events are not kept (the ring is not snapshotted)."""
    path = tmp_path / "mechanism.sqlite"
    first = await world(path)
    a = await first.worker("a", "v100")
    await first.submit(JobSpec("j", RESNET, 10**6))
    await a.report(await a.next(RunJobs), steps=100)  # type: ignore[arg-type]
    await a.next(ExtendLease)  # round 1 runs
    before = await ask_on(first.bus, "events", timeout_s=10)
    assert [e["kind"] for e in before["events"]][:3] == ["mechanism_started", "worker_joined", "round_started"]  # type: ignore[index]
    await kill(first)

    again = await world(path)
    recent = await ask_on(again.bus, "events", timeout_s=10)
    assert [(e["kind"], e["detail"]) for e in recent["events"]] == [  # type: ignore[index]
        ("mechanism_started", "epoch 2, started from its journal at round 1"),
    ]
    await kill(again)
