"""The workers in the cluster: registrations (a join, a repeat, a restart that replaces a worker,
a refusal said to the worker) and what changed since the last boundary (the pool, for the audit
record; new workers, for the held jobs; the types a job may run on). The decisions are
core/pool.py's and core/membership.py's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from common.bus import Delivery
from common.clock import Clock
from common.messages import WorkerIdInUse, WorkerRefused, WorkerRegistered
from mechanism_service.core import events as events_core
from mechanism_service.core import membership
from mechanism_service.core import pool as pool_core
from mechanism_service.core.memory import MemoryCell
from mechanism_service.core.model import MechanismState
from mechanism_service.core.settings import MechanismSettings
from mechanism_service.journaling import MechanismJournal
from mechanism_service.outbox import Outbox

DeclareLost = Callable[..., Awaitable[None]]  # (worker_id, reason, now_s, replaced_by=...) -> None


class WorkerPool:
    def __init__(
        self, cell: MemoryCell, settings: MechanismSettings, clock: Clock, *, clock_name: str, elastic_types: tuple[str, ...],
        journal: MechanismJournal, outbox: Outbox, wake: asyncio.Event, log: structlog.stdlib.BoundLogger,
    ) -> None:
        self._cell = cell
        self._settings = settings
        self._clock = clock
        # Workers must time their leases as we time rounds (issue 9: a scaled mechanism and a
        # wall-clock fleet stalled without a word); "" (virtual time in one process): not checked.
        self._clock_name = clock_name
        self.elastic_types = elastic_types
        self._journal = journal
        self._outbox = outbox
        self._wake = wake
        self.log = log
        self.cluster_grew = False  # a worker joined since the last boundary (held jobs may fit)
        self._pool_changed = True  # workers joined or left since the last audit record (and at a start)
        self._types_here: tuple[str, ...] | None = None

    async def on_registered(self, d: Delivery, w: WorkerRegistered, declare_lost: DeclareLost) -> None:
        memory = self._cell.memory
        held = self.held(w.worker_id)
        verdict = membership.verdict(held, w.accelerator_type, w.gpu_count, w.instance)
        if verdict is membership.Verdict.REPEAT:
            return  # registered already (a periodic re-announcement, or a redelivery)
        problem = self.problem(w)
        if verdict is membership.Verdict.REFUSE and held is not None:
            problem = membership.refusal(w.worker_id, held, w.accelerator_type, w.gpu_count)
        if problem:
            # One worker must not stop the cluster: it stays out, and says why once (it keeps
            # re-announcing itself; `gavel cluster` lists it under workers_refused).
            if memory.refused_workers.get(w.worker_id) != problem:
                memory.refused_workers[w.worker_id] = problem
                self.log.error("worker_refused", worker_id=w.worker_id, reason=problem)
                # and to the worker, whose own log would otherwise say nothing (not mandatory:
                # a worker from before this message has no queue for it, and needs none)
                await self._outbox.publish(WorkerRefused(w.worker_id, memory.epoch, problem))
            return
        memory.refused_workers.pop(w.worker_id, None)
        if verdict is membership.Verdict.REPLACE and held is not None:
            # the old process's leases end now, as a lost worker's do; its fence names the process
            # that replaced it, so that it stops for good if it is somehow still there
            reason = membership.replacement(held, w.accelerator_type, w.gpu_count, w.instance)
            await declare_lost(w.worker_id, reason, self._clock.now_s(), replaced_by=w.instance)
        self._journal.record("worker", d)
        self.join(w)
        self._wake.set()
        await self._journal.durable()
        now_s, round_id = self._clock.now_s(), events_core.current_round(memory.round_id)
        await self._outbox.publish_events(
            [events_core.worker_joined(w.worker_id, w.accelerator_type, w.gpu_count, w.instance, now_s, round_id)]
        )

    def held(self, worker_id: str) -> membership.Held | None:
        """The worker joined under this id (None: none, or it was declared lost)."""
        return pool_core.held(self._cell.memory, worker_id)

    def problem(self, w: WorkerRegistered) -> str:
        """Why this worker cannot join ("" when it can)."""
        return pool_core.worker_problem(w, self._settings.gpus_per_server, self._clock_name)

    def note_id_in_use(self, w: WorkerIdInUse) -> None:
        """A second process refused its worker id at the broker: said where an operator looks
        (`gavel cluster`, workers_refused), once per host and shape."""
        if pool_core.note_id_in_use(self._cell.memory, w):
            self.log.error("worker_refused", worker_id=w.worker_id, host=w.host, reason=w.reason)

    def join(self, w: WorkerRegistered) -> None:
        """A registration accepted (or replayed)."""
        self.cluster_grew = self._pool_changed = True
        self._types_here = None
        joined = pool_core.join(self._cell.memory, w, self._settings, self._cell.rates)
        if joined:
            self.log.info(joined, worker_id=w.worker_id, accelerator_type=w.accelerator_type, gpus=w.gpu_count)

    def lose(self, worker_id: str, reason: str, now_s: float) -> pool_core.Loss | None:
        """A worker's loss applied (or replayed): core/pool.lose; the round ends now if it waited
        only for this worker."""
        loss = pool_core.lose(self._cell.memory, worker_id, reason, now_s)
        if loss is None:
            return None
        self._pool_changed = True
        self._types_here = None
        if loss.round_complete:
            self._wake.set()  # the round waited only for this worker: it ends now, not at its timeout
        return loss

    def types_here(self) -> tuple[str, ...]:
        """The types a job may run on: those here, and any that may join (kept until workers change)."""
        if self._types_here is None:
            self._types_here = pool_core.types_here(self._cell.memory, self.elastic_types)
        return self._types_here

    def take_grown(self) -> bool:
        """Whether workers joined since the last call (a boundary looks at its held jobs again)."""
        grown, self.cluster_grew = self.cluster_grew, False
        return grown

    def take_pool_changed(self) -> bool:
        """Whether workers joined or left since the last audit record."""
        changed, self._pool_changed = self._pool_changed, False
        return changed

    def state(self) -> MechanismState:
        """The state, made at the first boundary from the workers registered."""
        state, made = pool_core.ensure_state(self._cell.memory, self._settings.gpus_per_server)
        if made:
            self._pool_changed = True
        return state
