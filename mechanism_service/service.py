"""The mechanism service: realises the policy's allocation in rounds over the bus.

A shell of collaborators, each owning one piece of what the mechanism does (docs/ARCHITECTURE.md
draws them), over one memory (core/memory.py) whose every change is a core function's:

- ``journal`` (journaling.py): inputs appended before their ack, group commit, each start's
  epoch, a snapshot at the boundaries that need one, the replay after a restart;
- ``workers`` (workers.py): registrations, refusals, what changed since the last boundary;
- ``liveness`` (liveness.py): heartbeats, workers declared lost, fences;
- ``submissions`` (submissions.py): jobs, seals, cancels;
- ``policy`` (policy_client.py): the allocation request in flight, answers, degraded mode;
- ``waits`` and ``rounds`` (waits.py, round_loop.py): the round loop, as numbered steps;
- ``status`` (status_desk.py): answers to the command line; ``outbox`` (outbox.py): publishing.

This class starts and stops them and routes each message to its handler.

Time: the injected Clock (the simulator's virtual clock, or the wall clock for a live cluster),
or ``config.lockstep``: the mechanism moves time itself, to a round's end when every lease has
reported and to the next submitted job's arrival when idle, so that separate processes make the
same schedule as the in-process simulator.

Durability: with a journal, every accepted input is written before it is acknowledged, and the
whole memory at each boundary before its commands go out (common/journal.py); a restarted
mechanism resumes from it. The journal is also the audit trail (core/audit.py): what each
boundary leased, settled and charged, and every job's end, for the invariant checker. Each start
is a new incarnation (``memory.epoch``), which every command carries.
"""

from __future__ import annotations

import asyncio
import copy
import time

import structlog

from common.bus import Bus, Delivery
from common.clock import Clock
from common.errors import ServiceError
from common.journal import Journal
from common.metrics import CollectorRegistry
from common.messages import (
    AllocationComputed,
    AllocationFailed,
    CancelJob,
    JobProgress,
    JobSubmitted,
    StatusRequested,
    SubmissionsSealed,
    ThroughputEstimated,
    WorkerFenced,
    WorkerHeartbeat,
    WorkerIdInUse,
    WorkerRegistered,
)
from common.messages.base import Message
from common.topology import MECHANISM_SUBMISSIONS
from mechanism_service.clocks import LockstepClock, ScaledClock, describe_clock
from mechanism_service.config import MechanismConfig
from mechanism_service.core import events as events_core
from mechanism_service.core import leases

# Memory and Lease were defined in this module until issue 24: snapshots written then pickle them
# under this module's path, so they are imported here by name, on purpose (removing them breaks
# loading those snapshots; tests/service/test_mechanism_old_snapshot.py loads one).
from mechanism_service.core.memory import Lease, Memory, MemoryCell, resume_under, upgraded  # noqa: F401
from mechanism_service.core.model import MechanismState
from mechanism_service.core.rounds import RoundReport
from mechanism_service.journaling import MechanismJournal
from mechanism_service.liveness import LivenessWatch
from mechanism_service.metrics import MechanismMetrics
from mechanism_service.outbox import Outbox
from mechanism_service.policy_client import PolicyClient
from mechanism_service.round_loop import RoundLoop
from mechanism_service.status_desk import StatusDesk
from mechanism_service.submissions import SubmissionDesk
from mechanism_service.waits import RoundWaits
from mechanism_service.workers import WorkerPool

log = structlog.get_logger("gavel.mechanism")


class MechanismService:
    name = "mechanism"

    def __init__(
        self, config: MechanismConfig, *, clock: Clock, journal: Journal | None = None, registry: CollectorRegistry | None = None,
    ) -> None:
        self.config = config
        settings = config.settings
        self.crash_reason = ""  # why the round loop stopped, when it did (ServiceError: on purpose)
        self.stopped = asyncio.Event()
        self.crashed = asyncio.Event()  # the round loop died: the host stops (a supervisor restarts us)
        self._clock: Clock = LockstepClock() if config.lockstep else clock
        clock = self._clock
        # a copy of the shuffle: the memory advances it, and a config may start several incarnations
        memory = Memory(shuffle=copy.deepcopy(config.shuffle), policy=config.policy, preset=settings.preset)
        self.cell = MemoryCell(memory, config.table, estimates=config.estimates)
        self.log = log.bind(policy=config.policy, preset=settings.preset)
        # docs/metrics.md; a registry nobody serves when none is given
        self.metrics = metrics = MechanismMetrics(registry, wall_per_mechanism_s=1.0 / getattr(clock, "scale", 1.0))
        metrics.watch(self.cell, clock.now_s)
        self._wake = asyncio.Event()  # something arrived: a submission, a report, a seal
        self.journal = MechanismJournal(journal, source=self.name)
        self.outbox = Outbox(self.log, events=config.events)
        self.status = StatusDesk(self.cell, config, clock, self.outbox)
        self.workers = WorkerPool(
            self.cell, settings, clock, clock_name=describe_clock(clock, lockstep=config.lockstep),
            elastic_types=config.elastic_types, journal=self.journal, outbox=self.outbox, wake=self._wake, log=self.log,
        )
        self.liveness = LivenessWatch(
            self.cell, self.workers, clock, settings.worker_grace_s, journal=self.journal, outbox=self.outbox,
            crashed=self.crashed, log=self.log, metrics=metrics,
        )
        self.submissions = SubmissionDesk(
            self.cell, config, clock, pool=self.workers, journal=self.journal, outbox=self.outbox, status=self.status,
            wake=self._wake, log=self.log, metrics=metrics,
        )
        self.policy = PolicyClient(self.cell, config, journal=self.journal, outbox=self.outbox, log=self.log)
        self.waits = RoundWaits(self.cell, config, clock, self.workers, self._wake, self.log)
        self.rounds = RoundLoop(
            self.cell, config, clock, waits=self.waits, pool=self.workers, liveness=self.liveness, policy=self.policy,
            journal=self.journal, outbox=self.outbox, log=self.log, metrics=metrics,
        )
        self.round_task: asyncio.Task[None] | None = None

    # -- views for drivers and tests --------------------------------------------------------------

    @property
    def memory(self) -> Memory:
        return self.cell.memory

    @property
    def state(self) -> MechanismState | None:
        return self.cell.memory.state

    @property
    def reports(self) -> list[RoundReport]:
        return self.cell.memory.round_reports

    @property
    def solve_times_s(self) -> list[float]:
        return self.cell.memory.solve_times_s

    @property
    def last_boundary_s(self) -> float:
        return self.cell.memory.last_boundary_s

    @property
    def rejected(self) -> list[str]:
        return list(self.cell.memory.observations.rejected)

    @property
    def has_submissions(self) -> bool:
        """Jobs accepted and not admitted: their arrival ahead, or in the admission queue."""
        return bool(self.cell.memory.submitted or self.cell.memory.queued)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, bus: Bus) -> None:
        self.outbox.attach(bus)
        if self.journal.kept:
            began = time.perf_counter()
            self._recover()
            self.metrics.journal_replay_s = time.perf_counter() - began
        self._begin_epoch()
        memory = self.cell.memory  # a start, restart or fail-over, for people watching (core/events.py)
        await self.outbox.publish_events([events_core.mechanism_started(
            memory.epoch, self._clock.now_s(), events_core.current_round(memory.round_id), recovered=memory.epoch > 1,
        )])
        # Registrations and heartbeats on one queue: a worker's heartbeat follows its registration.
        await bus.subscribe(
            "mechanism.workers", [WorkerRegistered.ROUTING_KEY, WorkerHeartbeat.ROUTING_KEY, WorkerIdInUse.ROUTING_KEY],
            self.on_worker,
        )
        # Several handlers at a time so that their journal writes share a commit; each records
        # and applies its message before its first await, so arrival order is kept.
        await bus.subscribe(
            MECHANISM_SUBMISSIONS.name, list(MECHANISM_SUBMISSIONS.bindings), self.submissions.on_submitted,
            prefetch=512, concurrency=128,
        )
        await bus.subscribe("mechanism.progress", [JobProgress.ROUTING_KEY], self.on_progress, prefetch=512, concurrency=128)
        await bus.subscribe(
            "mechanism.allocations", [AllocationComputed.ROUTING_KEY, AllocationFailed.ROUTING_KEY], self.policy.on_allocation
        )
        await bus.subscribe("mechanism.throughputs", [ThroughputEstimated.ROUTING_KEY], self.on_estimate)
        await bus.subscribe("mechanism.status", [StatusRequested.ROUTING_KEY], self.status.on_status)
        if self.cell.memory.commands:
            await self.outbox.republish(self.cell.memory)
        self.round_task = asyncio.get_running_loop().create_task(self._run_rounds(), name="mechanism-rounds")
        self.liveness.run()

    async def stop(self) -> None:
        for task in (self.round_task, self.liveness.task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self.journal.close(crashed=self.crashed.is_set())

    async def kill(self) -> None:
        """Stop the round loop and the watch as a SIGKILL would: the journal is left as it is,
        nothing flushed beyond what the handlers committed before acknowledging (tests of
        recovery)."""
        for task in (self.round_task, self.liveness.task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def _begin_epoch(self) -> None:
        """A new incarnation: its epoch is journaled at once (a second restart before the next
        snapshot must not reuse it), and every watched worker gets a fresh grace."""
        memory = self.cell.memory
        memory.epoch += 1
        now_s = self._clock.now_s()
        self.liveness.fresh_grace(now_s)
        self.journal.begin_epoch(memory.epoch, now_s)
        self._bind_log(self.log.bind(epoch=memory.epoch))

    def _bind_log(self, bound: structlog.stdlib.BoundLogger) -> None:
        self.log = bound
        for part in (self.outbox, self.workers, self.liveness, self.submissions, self.policy, self.waits, self.rounds):
            part.log = bound

    async def _run_rounds(self) -> None:
        try:
            await self.rounds.run()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.log.exception("round_loop_crashed")
            # a stop on purpose says why in its words (a simulation's jobs that can never run)
            self.crash_reason = str(e) if isinstance(e, ServiceError) else ""
            self.crashed.set()
            raise
        finally:
            self.stopped.set()

    # -- handlers: journal what arrived, wake the loop --------------------------------------------

    async def on_worker(self, d: Delivery) -> None:
        w = d.message
        if isinstance(w, WorkerHeartbeat):
            await self.liveness.on_heartbeat(w)
        elif isinstance(w, WorkerIdInUse):
            self.workers.note_id_in_use(w)
        else:
            assert isinstance(w, WorkerRegistered)
            await self.workers.on_registered(d, w, self.liveness.declare_lost)

    async def on_progress(self, d: Delivery) -> None:
        report = d.message
        assert isinstance(report, JobProgress)
        memory = self.cell.memory
        if not leases.accepts(memory, report):
            if leases.fenced(memory, report):
                self.log.info(
                    "report_refused", job_id=report.job_id, worker_id=report.worker_id, lease_id=report.lease_id,
                    reason="fenced: its worker was declared lost and its lease ended",
                )
            return  # a stale or duplicate report (at-least-once delivery): already counted
        self.journal.record("progress", d)
        self.metrics.restored(report.restore_s)
        if leases.apply_progress(memory, report):
            self._wake.set()
        await self.journal.durable()

    async def on_estimate(self, d: Delivery) -> None:
        """Kept (journaled) and applied at the next boundary (round_loop.py, step 3), so when a
        message lands within a round never changes the schedule. A mechanism on a table's rates
        has no use for them."""
        estimate = d.message
        assert isinstance(estimate, ThroughputEstimated)
        if not self.config.estimates:
            return
        self.journal.record("estimate", d)
        self.cell.memory.pending_estimates.append(estimate)
        await self.journal.durable()

    # -- recovery ---------------------------------------------------------------------------------

    def _recover(self) -> None:
        """Rebuild the memory from the last snapshot and the inputs accepted after it."""
        loaded = self.journal.load()
        if loaded is not None:
            self.cell.adopt(upgraded(loaded))
            before = resume_under(self.cell.memory, self.config.policy, self.config.settings.preset)
            if before is not None:
                self.log.warning(
                    "policy_changed", journal_policy=before[0], journal_preset=before[1], policy=self.config.policy,
                    preset=self.config.settings.preset, action="solving afresh under the new policy",
                )
        memory = self.cell.memory
        replayed, latest_s = self.journal.replay(memory, self._appliers())
        if isinstance(self._clock, (LockstepClock, ScaledClock)):
            # these clocks start at 0 in every process: carry on from the journal's time (a
            # scaled cluster loses the time it was down; the wall clock needs nothing)
            self._clock.advance_to(latest_s)
        if loaded is not None or replayed:
            self.log.info(
                "mechanism_recovered", journal=str(self.journal.file.path), snapshot=loaded is not None,  # type: ignore[union-attr]
                events_replayed=replayed, round_id=memory.round_id, jobs_active=len(memory.state.jobs) if memory.state else 0,
            )

    def _appliers(self) -> dict[str, object]:
        """Each journaled input applied as its handler applied it (the decisions it made then,
        like a worker declared lost, applied as they were, never made again)."""
        memory = self.cell.memory

        def worker(m: Message, at_s: float | None, body: bytes) -> None:
            if isinstance(m, WorkerRegistered):
                self.workers.join(m)

        def lost(m: Message, at_s: float | None, body: bytes) -> float | None:
            if isinstance(m, WorkerFenced) and at_s is not None:
                self.workers.lose(m.worker_id, m.reason, at_s)
                return at_s
            return None

        def submitted(m: Message, at_s: float | None, body: bytes) -> float | None:
            return self.submissions.replay_submitted(m, at_s) if isinstance(m, JobSubmitted) else None

        def sealed(m: Message, at_s: float | None, body: bytes) -> None:
            if isinstance(m, SubmissionsSealed):
                memory.intake.seal(m.batch_id, m.count)

        def cancel(m: Message, at_s: float | None, body: bytes) -> float | None:
            if isinstance(m, CancelJob) and at_s is not None:
                self.submissions.cancel(m.job_id, m.reason, at_s)
                return at_s
            return None

        def progress(m: Message, at_s: float | None, body: bytes) -> None:
            if isinstance(m, JobProgress) and leases.accepts(memory, m):
                leases.apply_progress(memory, m)

        def estimate(m: Message, at_s: float | None, body: bytes) -> None:
            if isinstance(m, ThroughputEstimated):
                memory.pending_estimates.append(m)

        return {
            "worker": worker, "lost": lost, "submitted": submitted, "sealed": sealed, "cancel": cancel,
            "progress": progress, "estimate": estimate, "allocation": lambda m, at_s, body: self.policy.replayed(m, body),
        }
