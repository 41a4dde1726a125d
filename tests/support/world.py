"""The world a live mechanism runs in, in one process (tests/service): the mechanism and the real
policy service on one in-memory bus (every message through the codec), and what the test listens
to (job ends, allocation requests). Two clocks, one world:

- ``world(...)``: the test's SteppedClock and scripted workers it drives itself (registrations,
  heartbeats, reports), so that a test says exactly what each worker does and when;
- ``simulated_world(policy, ...)``: virtual time and the simulated fleet, so that a test runs a
  few jobs to their end (``run_until``).

``live_mechanism`` is a bare mechanism for a test that wires its own bus.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable

from common.journal import Journal
from common.messages import (
    AllocationRequested,
    ExtendLease,
    JobProgress,
    JobSpec,
    JobSubmitted,
    RunJobs,
    WorkerHeartbeat,
    WorkerRegistered,
)
from common.messages.base import Message
from common.transport.memory import InMemoryBroker, InMemoryBus
from mechanism_service.config import MechanismConfig
from mechanism_service.core.ownership import Ownership
from mechanism_service.core.retention import KEEP_ALL, Retention
from mechanism_service.core.rounds import type_shuffler
from mechanism_service.core.settings import preset
from mechanism_service.service import MechanismService
from policy_service.service import PolicyService, shipped_context
from sim.clock import VirtualClock
from sim.fleet import SimulatedFleet
from tests.support.clock import SteppedClock
from tests.support.waiting import Collector, eventually

CONTEXT = shipped_context()
TABLE = CONTEXT.table
assert TABLE is not None
RESNET = "ResNet-50 (batch size 64)"
GRACE_S = 30.0  # world()'s worker grace
POLICY = "max_min_fairness_perf"  # world()'s policy: fastest type first, a lone job starts on the V100
Lease = RunJobs | ExtendLease


class ScriptedWorker:
    """A worker that speaks the protocol as the test says: it registers, beats when told, records
    every command, and answers a lease with the reports ``answer`` chooses (None: the test
    reports itself, with ``report``)."""

    def __init__(self, bus: InMemoryBus, worker_id: str, accelerator_type: str) -> None:
        self.bus, self.worker_id, self.accelerator_type = bus, worker_id, accelerator_type
        self.received = Collector()
        self.answer: Callable[[Lease], dict[str, object]] | None = None
        self._taken: dict[type, int] = {}

    async def start(self, *, register: bool = True) -> ScriptedWorker:
        await self.bus.subscribe(f"test.{self.worker_id}", [f"worker.cmd.{self.worker_id}.*"], self._on_command, durable=False)
        if register:
            await self.register()
        return self

    async def register(self) -> None:
        await self.bus.publish(WorkerRegistered(self.worker_id, self.accelerator_type, 1, self.worker_id))

    async def heartbeat(self) -> None:
        await self.bus.publish(WorkerHeartbeat(self.worker_id))

    async def _on_command(self, d: object) -> None:
        await self.received(d)  # type: ignore[arg-type]
        command = self.received.messages[-1]
        if self.answer is not None and isinstance(command, (RunJobs, ExtendLease)):
            await self.report(command, **self.answer(command))  # type: ignore[arg-type]

    async def report(
        self, command: Lease, *, steps: int = 100, outcome: str = "lease_end", exit_code: int | None = None, error: str = "",
    ) -> None:
        for job_id, left in zip(command.job_ids, command.max_steps, strict=True):
            done = min(steps, left)
            finished = outcome != "crashed" and done >= left
            await self.bus.publish(JobProgress(
                job_id, self.worker_id, command.lease_id, command.round_id, done, 360.0, 0.5 if done else 0.0,
                finished=finished, outcome="finished" if finished else outcome, exit_code=exit_code, error=error,
                startup_s=4.0, restore_s=1.0, stepping_s=200.0, checkpoint_s=2.0,
            ))

    def of(self, cls: type) -> list[Message]:
        return [m for m in self.received.messages if isinstance(m, cls)]  # type: ignore[misc]

    async def lease_of_round(self, round_id: int) -> Lease:
        """The run or extend command of ``round_id`` (waiting for it)."""

        def found() -> list[Lease]:
            return [m for m in self.of(RunJobs) + self.of(ExtendLease) if m.round_id == round_id]  # type: ignore[attr-defined, misc]

        await self.received.wait_until(lambda: bool(found()))
        return found()[0]

    async def next(self, cls: type) -> Message:
        """The next command of ``cls`` not taken yet (waiting for it)."""
        taken = self._taken.get(cls, 0)
        await self.received.wait_until(lambda: len(self.of(cls)) > taken)
        self._taken[cls] = taken + 1
        return self.of(cls)[taken]


@dataclasses.dataclass
class World:
    clock: SteppedClock | VirtualClock
    bus: InMemoryBus
    mechanism: MechanismService
    events: Collector  # job ends (world: completed, failed, cancelled; simulated_world: every job.* and round.ended)
    requests: Collector  # AllocationRequested

    @property
    def memory(self):  # noqa: ANN201
        return self.mechanism.memory

    async def submit(self, *specs: JobSpec) -> None:
        for spec in specs:
            await self.bus.publish(JobSubmitted(spec))

    def job(self, job_id: str):  # noqa: ANN201
        state = self.mechanism.state
        assert state is not None
        return next(j for j in [*state.jobs.values(), *state.completed] if j.job_id == job_id)

    def job_ids(self, cls: type) -> list[str]:
        """The jobs of the events of ``cls`` heard, in order."""
        return [m.job_id for m in self.events.messages if isinstance(m, cls)]  # type: ignore[attr-defined]

    def completed(self) -> set[str]:
        state = self.mechanism.state
        return set() if state is None else {j.job_id for j in state.completed if j.steps_remaining <= 0}

    # -- world(): the test's clock and scripted workers ----------------------------------------

    async def worker(self, worker_id: str, accelerator_type: str, *, register: bool = True) -> ScriptedWorker:
        worker = await ScriptedWorker(self.bus, worker_id, accelerator_type).start(register=register)
        if register:
            await eventually(lambda: self.mechanism.workers.held(worker_id) is not None)
        return worker

    async def beat(self, *workers: ScriptedWorker) -> None:
        """Heartbeats, heard before this returns."""
        assert isinstance(self.clock, SteppedClock), "heartbeats are for world()'s scripted workers"
        clock = self.clock
        for worker in workers:
            await worker.heartbeat()
        await eventually(lambda: all(self.memory.last_heard_s.get(w.worker_id) == clock.t for w in workers))

    # -- simulated_world(): virtual time and the simulated fleet -------------------------------

    async def run_until(self, done: Callable[[], bool], max_time_s: float = 10_000_000.0) -> None:
        assert isinstance(self.clock, VirtualClock), "run_until is simulated_world()'s"
        await self.clock.run_until(done, max_time_s=max_time_s)


def mechanism(
    clock: SteppedClock, journal: pathlib.Path | None = None, round_timeout_s: float = 600.0, retention: Retention = KEEP_ALL,
    owners: Ownership = Ownership(), **settings: object,
) -> MechanismService:
    """world()'s mechanism: POLICY on the default preset with a GRACE_S worker grace, elastic."""
    config = MechanismConfig(
        settings=dataclasses.replace(preset("default", POLICY), worker_grace_s=GRACE_S, **settings),  # type: ignore[arg-type]
        policy=POLICY,
        table=TABLE,
        shuffle=type_shuffler("default", 0),
        round_timeout_s=round_timeout_s,
        deadlines=False,
        elastic_types=TABLE.accelerator_types,
        retention=retention,
        owners=owners,
    )
    return MechanismService(
        config, clock=clock, journal=Journal(journal) if journal is not None else None  # type: ignore[arg-type]
    )


def live_mechanism(journal: pathlib.Path | None, clock: object) -> MechanismService:
    """A bare mechanism, not started: fifo on the default preset, no worker grace, elastic (no
    worker yet: jobs wait rather than being refused); a test starts it on a bus of its own."""
    config = MechanismConfig(
        settings=preset("default", "fifo"),
        policy="fifo",
        table=TABLE,
        shuffle=type_shuffler("default", 0),
        round_timeout_s=600.0,
        deadlines=False,
        elastic_types=TABLE.accelerator_types,
    )
    return MechanismService(
        config, clock=clock, journal=Journal(journal) if journal is not None else None  # type: ignore[arg-type]
    )


def spec(i: int) -> JobSpec:
    """The ``i``-th of a run of like jobs, told apart by their steps."""
    return JobSpec(f"job-{i:03d}", RESNET, total_steps=1000 + i)


async def world(
    journal: pathlib.Path | None = None, clock: SteppedClock | None = None, before: Callable[[InMemoryBus], object] | None = None,
    round_timeout_s: float = 600.0, retention: Retention = KEEP_ALL, owners: Ownership = Ownership(), **settings: object,
) -> World:
    """The mechanism (``mechanism(...)``) on the test's clock, with no worker yet (``World.worker``
    adds scripted ones); ``before`` runs on the bus before the mechanism starts."""
    clock = clock or SteppedClock()
    bus = InMemoryBus(InMemoryBroker(serialize=True), source="test")
    await bus.start()
    events, requests = Collector(), Collector()
    await bus.subscribe("test.events", ["job.completed", "job.failed", "job.cancelled"], events, durable=False)
    await bus.subscribe("test.requests", [AllocationRequested.ROUTING_KEY], requests, durable=False)
    await PolicyService(clock=clock, context=CONTEXT, solving="inline").start(bus)  # type: ignore[arg-type]
    if before is not None:
        await before(bus)  # type: ignore[misc]
    m = mechanism(clock, journal, round_timeout_s, retention, owners, **settings)
    await m.start(bus)
    return World(clock, bus, m, events, requests)


async def simulated_world(
    policy: str, *, elastic: bool = False, fleet: dict[str, int] | None = None, estimates: bool = False
) -> World:
    """A live mechanism (elastic: it may grow; estimates: it schedules on estimates, as `gavel serve
    mechanism` does, here with no estimator, so on its priors) with the policy service and, unless
    ``fleet`` is empty, a simulated fleet, all on one in-memory bus in virtual time."""
    broker = InMemoryBroker(serialize=True)
    clock = VirtualClock(broker)
    bus = InMemoryBus(broker, clock=clock, source="test")
    await bus.start()
    mechanism = MechanismService(
        MechanismConfig(
            settings=preset("default", policy), policy=policy, table=TABLE, shuffle=type_shuffler("default", 0),
            round_timeout_s=None, deadlines=False, elastic_types=TABLE.accelerator_types if elastic else (),
            estimates=estimates,
        ),
        clock=clock,
    )
    events, requests = Collector(), Collector()
    await bus.subscribe("test.events", ["job.*", "round.ended"], events, durable=False)
    await bus.subscribe("test.requests", [AllocationRequested.ROUTING_KEY], requests, durable=False)
    await PolicyService(clock=clock, context=CONTEXT, solving="inline").start(bus)
    await mechanism.start(bus)
    if fleet:
        await SimulatedFleet(clock=clock, table=TABLE, cluster=fleet).start(bus)
    await clock.settle()  # the workers are registered before any job arrives
    return World(clock, bus, mechanism, events, requests)


async def kill(w: World) -> None:
    """As a SIGKILL would: nothing flushed beyond what handlers committed before acknowledging."""
    assert w.mechanism.round_task is not None and w.mechanism.liveness.task is not None
    await w.mechanism.kill()
    await w.bus.close()
