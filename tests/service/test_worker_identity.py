"""One process per worker id (issue 23): a second process started with a live worker's id is
refused at the worker (the broker holds the claim) and recorded by the mechanism; a restarted
worker takes its place, its old leases ending at once; a registration that cannot show it holds
the id never adds a phantom server, and only the held process's heartbeats keep it alive."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from common.errors import ConfigError
from common.messages import JobSpec, RunJobs, WorkerFenced, WorkerHeartbeat, WorkerIdInUse, WorkerRefused, WorkerRegistered
from common.transport.memory import InMemoryBroker, InMemoryBus
from services.cli.status_cmd import ask_on
from tests.support.waiting import Collector
from tests.support.world import RESNET, World, world
from worker_service.core import WorkerConfig
from worker_service.service import WorkerService


def config(tmp_path: Path, worker_id: str, accelerator_type: str, name: str) -> WorkerConfig:
    return WorkerConfig(
        worker_id=worker_id, accelerator_type=accelerator_type, gpus=1, device="cpu",
        checkpoint_dir=str(tmp_path / "ckpt"), work_dir=str(tmp_path), run_dir=str(tmp_path / name), python=sys.executable,
    )


async def test_a_second_worker_process_with_a_live_id_is_refused_before_it_takes_a_command(tmp_path: Path) -> None:
    broker = InMemoryBroker(serialize=True)
    observer = InMemoryBus(broker, source="observer")
    await observer.start()
    attempts = Collector()
    await observer.subscribe("observer", [WorkerIdInUse.ROUTING_KEY, WorkerRegistered.ROUTING_KEY], attempts)
    first_bus, second_bus = InMemoryBus(broker, source="first"), InMemoryBus(broker, source="second")
    await first_bus.start()
    await second_bus.start()
    first = WorkerService(config=config(tmp_path, "k80-0", "k80", "first"), heartbeat_s=60.0)
    second = WorkerService(config=config(tmp_path, "k80-0", "v100", "second"), heartbeat_s=60.0)
    await first.start(first_bus)

    with pytest.raises(ConfigError, match="worker id 'k80-0' is in use by another live worker process"):
        await second.start(second_bus)

    await attempts.wait_for_count(2)  # the first's registration, then the second's attempt
    registration, attempt = attempts.messages
    assert isinstance(registration, WorkerRegistered) and registration.instance == first.instance
    assert isinstance(attempt, WorkerIdInUse)
    assert (attempt.worker_id, attempt.accelerator_type, attempt.gpu_count) == ("k80-0", "v100", 1)
    assert await observer.consumer_count("worker.k80-0") == 1  # the second never consumed its commands
    # once the first has gone (a process that dies closes its connection), the id is free
    await first.stop()
    await first_bus.close()
    await second.start(second_bus)
    await second.stop()
    await second_bus.close()
    await observer.close()


async def register(w: World, worker_id: str, accelerator_type: str, instance: str, gpus: int = 1) -> None:
    await w.bus.publish(WorkerRegistered(worker_id, accelerator_type, gpus, worker_id, instance=instance))
    await w.bus.drain()


async def test_a_restarted_worker_takes_its_place_and_its_old_leases_end_at_once() -> None:
    w = await world()
    a = await w.worker("a", "v100", register=False)
    await register(w, "a", "v100", "first")
    await w.submit(JobSpec("j", RESNET, 10**6))
    run = await a.next(RunJobs)
    await a.report(run, steps=100)  # type: ignore[arg-type]
    extend = await a.lease_of_round(1)

    with capture_logs() as logs:
        await register(w, "a", "v100", "second")  # the process died and was started again
        fence = await a.next(WorkerFenced)
    assert isinstance(fence, WorkerFenced)
    assert (fence.instance, fence.replaced_by) == ("first", "second")  # the new one ignores it
    restarted = next(e for e in logs if e["event"] == "worker_restarted")
    assert restarted["leases_ended"] == [extend.lease_id]
    assert restarted["reason"] == "a new process of this worker (instance second) took its place"
    assert w.memory.instances == {"a": "second"} and w.memory.state.gpus["v100"] == 1  # type: ignore[union-attr]
    # its job runs again on the new process, from the steps credited before
    await a.report(extend, steps=5000)  # type: ignore[arg-type]  # the old process's late report: refused
    await w.bus.drain()
    assert w.job("j").steps_done == 100
    w.clock.advance(360.0)
    again = await a.next(RunJobs)
    assert isinstance(again, RunJobs) and again.resume_steps == (100,)
    await w.mechanism.stop()


async def test_a_registration_that_cannot_show_it_holds_the_id_adds_no_phantom_server() -> None:
    """The issue's scenario at the mechanism, for a process that skipped the claim (a worker from
    before instances): a v100 under a live k80's id."""
    w = await world()
    k80 = await w.worker("k80-0", "k80")  # a worker from before instances
    with capture_logs() as logs:
        await register(w, "k80-0", "v100", "")
    refused = next(e for e in logs if e["event"] == "worker_refused")
    assert "is held by a k80 worker with 1 GPU(s)" in refused["reason"]
    assert dict(w.memory.servers) == {"k80": [("k80-0", 1)]}
    cluster = await ask_on(w.bus, "cluster", timeout_s=10)
    assert cluster["capacity_gpus"] == {"k80": 1} and "k80-0" in cluster["workers_refused"]  # type: ignore[index, operator]
    await w.beat(k80)
    await w.mechanism.stop()


async def test_only_the_held_process_heartbeats_keep_a_worker_alive() -> None:
    w = await world()
    await w.worker("a", "v100", register=False)
    await register(w, "a", "v100", "mine")
    await w.bus.publish(WorkerHeartbeat("a", instance="mine"))
    await w.bus.drain()
    heard_s = w.memory.last_heard_s["a"]
    w.clock.advance(10.0)
    await w.bus.publish(WorkerHeartbeat("a", instance="someone-else"))
    await w.bus.drain()
    assert w.memory.last_heard_s["a"] == heard_s
    await w.mechanism.stop()


async def test_a_second_process_refused_at_the_broker_is_recorded_by_the_mechanism() -> None:
    w = await world()
    await w.worker("k80-0", "k80", register=False)
    await register(w, "k80-0", "k80", "mine")
    with capture_logs() as logs:
        await w.bus.publish(WorkerIdInUse("k80-0", "v100", 1, "host-b", "worker id 'k80-0' is in use"))
        await w.bus.drain()
    assert [e["host"] for e in logs if e["event"] == "worker_refused"] == ["host-b"]
    cluster = await ask_on(w.bus, "cluster", timeout_s=10)
    assert cluster["workers_refused"] == {  # type: ignore[index]
        "k80-0 (another process, on host-b)": "v100 with 1 GPU(s): worker id 'k80-0' is in use"
    }
    assert cluster["capacity_gpus"] == {"k80": 1}  # type: ignore[index]
    # the id's holder restarts: the attempt on it is moot, and gavel workers stops listing it
    await register(w, "k80-0", "k80", "mine-again")
    assert w.memory.refused_workers == {}
    await w.mechanism.stop()


async def test_a_worker_ignores_a_fence_for_another_process_and_stops_when_it_was_replaced(tmp_path: Path) -> None:
    broker = InMemoryBroker(serialize=True)
    mechanism, worker_bus = InMemoryBus(broker, source="mechanism"), InMemoryBus(broker, source="worker")
    await mechanism.start()
    await worker_bus.start()
    registrations = Collector()
    await mechanism.subscribe("members", [WorkerRegistered.ROUTING_KEY], registrations)
    worker = WorkerService(config=config(tmp_path, "a", "v100", "a"), heartbeat_s=60.0, instance="new")
    await worker.start(worker_bus)
    await registrations.wait_for_count(1)

    # the fence of the process this one replaced: not ours (no re-registration, no stop)
    await mechanism.publish(WorkerFenced("a", 1, "a new process of this worker took its place", instance="old", replaced_by="new"))
    await broker.drain()
    assert not worker.crashed.is_set() and len(registrations.messages) == 1
    # a fence for this process, without a replacement: stop the jobs, register again
    await mechanism.publish(WorkerFenced("a", 1, "no heartbeat for 40 s", instance="new"))
    await registrations.wait_for_count(2)
    assert not worker.crashed.is_set()
    # refused by the mechanism (another clock, say): its own log says why, and it carries on
    with capture_logs() as logs:
        await mechanism.publish(WorkerRefused("a", 1, "worker 'a' runs on the wall clock and this mechanism on ..."))
        await broker.drain()
    assert [e["reason"] for e in logs if e["event"] == "worker_refused_by_mechanism"] == [
        "worker 'a' runs on the wall clock and this mechanism on ..."
    ]
    assert not worker.crashed.is_set()
    # replaced by another process (this one was cut off while it started): stop for good
    await mechanism.publish(WorkerFenced("a", 1, "a new process took its place", instance="new", replaced_by="newer"))
    await broker.drain()
    assert worker.crashed.is_set() and "another process (newer) took worker id 'a'" in worker.stop_reason
    assert len(registrations.messages) == 2
    await worker.stop()
    await worker_bus.close()
    await mechanism.close()
