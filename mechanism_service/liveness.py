"""The liveness watch: workers that fall silent are declared lost (docs/mechanism.md, "Workers
that fail, jobs that crash"). A registered worker is watched from its first heartbeat on; one
silent for longer than the grace (``settings.worker_grace_s``, on the mechanism's clock) is lost:
the decision is journaled (it depends on time: a replay applies it, never decides again), its
GPUs leave, its leases end at once, it is fenced (WorkerFenced), and the allocation is solved
again. A lost worker that still beats is told again, at most once a grace."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import structlog

from common.clock import Clock
from common.messages import WorkerFenced, WorkerHeartbeat
from mechanism_service.core import events as events_core
from mechanism_service.core import membership
from mechanism_service.core.liveness import next_check_s, silence_reason, silent_workers
from mechanism_service.core.memory import MemoryCell
from mechanism_service.journaling import MechanismJournal
from mechanism_service.metrics import MechanismMetrics
from mechanism_service.outbox import Outbox
from mechanism_service.workers import WorkerPool

NEVER_S = -1e18  # a worker never told again


class LivenessWatch:
    def __init__(
        self, cell: MemoryCell, pool: WorkerPool, clock: Clock, grace_s: float | None, *, journal: MechanismJournal,
        outbox: Outbox, crashed: asyncio.Event, log: structlog.stdlib.BoundLogger, metrics: MechanismMetrics,
    ) -> None:
        self._cell = cell
        self._pool = pool
        self._clock = clock
        self.grace_s = grace_s  # None: workers are never declared lost
        self._journal = journal
        self._outbox = outbox
        self._crashed = crashed
        self.log = log
        self._metrics = metrics
        self._refenced_at_s: dict[str, float] = {}  # lost worker -> when it was last told again
        self.task: asyncio.Task[None] | None = None

    def fresh_grace(self, now_s: float) -> None:
        """A fresh grace for every watched worker, at a start (nothing could be heard while the
        mechanism was down)."""
        memory = self._cell.memory
        memory.last_heard_s = dict.fromkeys(memory.last_heard_s, now_s)

    def run(self) -> None:
        """The watch, when there is a grace."""
        if self.grace_s is not None:
            self.task = asyncio.get_running_loop().create_task(self._watch(self.grace_s), name="mechanism-workers")

    async def on_heartbeat(self, beat: WorkerHeartbeat) -> None:
        """Heartbeats are not journaled: liveness is observed, and a restart gives every watched
        worker a fresh grace. A lost worker that still beats missed its fence, or was cut off and
        is back: it is told again, since it must stop its jobs and register anew."""
        memory = self._cell.memory
        now_s = self._clock.now_s()
        lost = memory.lost_workers.get(beat.worker_id)
        if lost is not None:
            grace_s = self.grace_s or 0.0
            if now_s - self._refenced_at_s.get(beat.worker_id, NEVER_S) >= grace_s:
                self._refenced_at_s[beat.worker_id] = now_s
                await self._outbox.publish(WorkerFenced(beat.worker_id, memory.epoch, str(lost["reason"]), instance=beat.instance))
            return
        if membership.beats_for(self._pool.held(beat.worker_id), beat.instance):
            memory.last_heard_s[beat.worker_id] = now_s

    async def _watch(self, grace_s: float) -> None:
        """Declare lost the watched workers silent for longer than the grace, each at most a
        margin after its deadline."""
        try:
            while True:
                memory = self._cell.memory
                for worker_id in silent_workers(memory.last_heard_s, grace_s, self._clock.now_s()):
                    now_s = self._clock.now_s()
                    heard_s = memory.last_heard_s.get(worker_id)
                    if heard_s is not None and now_s - heard_s > grace_s:  # not heard meanwhile
                        await self.declare_lost(worker_id, silence_reason(heard_s, grace_s, now_s), now_s)
                await self._clock.sleep(next_check_s(memory.last_heard_s, grace_s, self._clock.now_s()))
        except asyncio.CancelledError:
            raise
        except Exception:
            self.log.exception("worker_watch_crashed")
            self._crashed.set()
            raise

    async def declare_lost(self, worker_id: str, reason: str, now_s: float, replaced_by: str = "") -> None:
        """Journal the decision, apply it, then tell the worker and the rest of its gangs."""
        memory = self._cell.memory
        instance = memory.instances.get(worker_id, "")
        fence = WorkerFenced(worker_id, memory.epoch, reason, instance=instance, replaced_by=replaced_by)
        self._journal.record_decision("lost", fence, now_s)
        loss = self._pool.lose(worker_id, reason, now_s)
        self._metrics.worker_lost()
        await self._journal.durable()
        self.log.warning(
            "worker_restarted" if replaced_by else "worker_lost", worker_id=worker_id, reason=reason,
            gpus=loss.gpus if loss else 0, leases_ended=list(loss.ended) if loss else [],
            action="its jobs run again from their last credited steps" + ("" if replaced_by else "; its GPUs leave the cluster"),
        )
        self._refenced_at_s[worker_id] = now_s
        if loss is not None:
            lost = memory.lost_workers.get(worker_id, {})
            await self._outbox.publish_events([events_core.worker_lost(
                worker_id, str(lost.get("accelerator_type", "")), loss.gpus, reason, now_s,
                events_core.current_round(memory.round_id),
            )])
        await self._outbox.publish(fence)  # not mandatory: a dead worker's queue may be gone
        for kill in loss.kills if loss else ():
            await self._outbox.publish(kill)

    def forget(self, worker_ids: Iterable[str]) -> None:
        """Workers the retention rule forgot: nothing is kept of them here either."""
        for worker_id in worker_ids:
            self._refenced_at_s.pop(worker_id, None)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
