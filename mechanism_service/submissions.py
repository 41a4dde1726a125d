"""The submissions desk: the mechanism's submissions queue, in the order things were sent (so a
cancel follows the job it names): a job (new, already known, conflicting, refused), the seal that
ends a batch (and what became of it, for the submitter), a cancel (if its sender may). Each is
journaled before it is acknowledged when it changed something; the decisions are
core/receipts.py's and core/cancel.py's."""

from __future__ import annotations

import asyncio
import dataclasses

import structlog

from common.bus import Delivery
from common.clock import Clock
from common.messages import CancelJob, JobSubmitted, SubmissionsSealed
from mechanism_service.config import MechanismConfig
from mechanism_service.core import cancel as cancel_core
from mechanism_service.core import ownership, receipts
from mechanism_service.core.intake import replay_now_s
from mechanism_service.core.memory import MemoryCell
from mechanism_service.journaling import MechanismJournal
from mechanism_service.metrics import MechanismMetrics
from mechanism_service.outbox import Outbox
from mechanism_service.status_desk import StatusDesk
from mechanism_service.workers import WorkerPool


class SubmissionDesk:
    def __init__(
        self, cell: MemoryCell, config: MechanismConfig, clock: Clock, *, pool: WorkerPool, journal: MechanismJournal,
        outbox: Outbox, status: StatusDesk, wake: asyncio.Event, log: structlog.stdlib.BoundLogger,
        metrics: MechanismMetrics,
    ) -> None:
        self._cell = cell
        self._config = config
        self._clock = clock
        self._pool = pool
        self._journal = journal
        self._outbox = outbox
        self._status = status
        self._wake = wake
        self.log = log
        self._metrics = metrics

    async def on_submitted(self, d: Delivery) -> None:
        message = d.message
        if isinstance(message, SubmissionsSealed):
            await self._on_sealed(d, message)
        elif isinstance(message, CancelJob):
            await self._on_cancel(d, message)
        else:
            assert isinstance(message, JobSubmitted)
            await self._on_job(d, message)

    async def _on_job(self, d: Delivery, message: JobSubmitted) -> None:
        forged = ownership.unverified(message.broker_user, d.user_id)
        if forged:  # nothing of it is accepted, so nothing is journaled (a replay could not check it)
            self._cell.memory.observations.rejected.setdefault(message.spec.job_id, f"not accepted: {forged}")
            self._metrics.submitted("forged")
            await self._outbox.publish_rejection(message.spec.job_id, f"not accepted: {forged}")
            return
        completed = None
        if d.user_id and not message.broker_user:  # a client that did not say: the broker's word, kept
            message = completed = dataclasses.replace(message, broker_user=d.user_id)
        received = self.receive(message, self._clock.now_s())
        receipt = received.receipt
        self._metrics.submitted(receipt.outcome)
        if receipt.outcome in ("new", "refused"):
            # journaled with the arrival it was given (a replay's arrivals are in the trace); an
            # absorbed duplicate or a conflict changes nothing worth replaying
            stamp = receipt.job.arrival_s if receipt.job is not None and not self._config.lockstep else None
            self._journal.record("submitted", d, stamp, completed)
        if received.ending is not None:
            self._journal.record_end(received.ending.record(self._cell.memory.epoch))
        if receipt.outcome == "new":
            self._wake.set()
        await self._journal.durable()
        if receipt.outcome in ("refused", "conflict"):
            await self._outbox.publish_rejection(message.spec.job_id, receipt.reason)

    def receive(self, message: JobSubmitted, now_s: float) -> receipts.Received:
        """A submission into the memory (or replayed from the journal)."""
        received = receipts.accept(
            self._cell.memory, message, now_s, lockstep=self._config.lockstep, rates=self._cell.rates,
            types=self._pool.types_here(), rules=self._config.owners,
        )
        if received.receipt.outcome == "conflict":
            self.log.warning("submission_conflict", job_id=message.spec.job_id, reason=received.receipt.reason)
        return received

    def replay_submitted(self, message: JobSubmitted, at_s: float | None) -> float:
        """A journaled submission, received again with the arrival it was given."""
        received_s = self._clock.now_s() if at_s is None else replay_now_s(message, at_s)
        self.receive(message, received_s)
        return received_s

    async def _on_sealed(self, d: Delivery, message: SubmissionsSealed) -> None:
        memory = self._cell.memory
        self._journal.record("sealed", d)
        # every submission of the batch was handled before this (one queue, applied in order)
        batch = memory.intake.batches.get(message.batch_id)
        waits = receipts.waits_for_workers(
            memory, batch.received if batch is not None else set(), self._cell.rates, self._config.elastic_types
        )
        summary = memory.intake.seal(message.batch_id, message.count)
        if waits:
            summary["waits_for_workers"] = waits
        if int(summary["received"]) < message.count:  # type: ignore[call-overload]
            # some of its messages never came (dead-lettered as undecodable): a lockstep replay
            # waits for the whole trace, so this one would wait for ever; say so
            self.log.warning("batch_incomplete", batch_id=message.batch_id, announced=message.count, received=summary["received"])
        self._wake.set()
        await self._journal.durable()
        for job_id in message.not_accepted:
            if job_id not in memory.intake.known:
                # the broker refused it to this queue, not to the estimator's (only ours is
                # bounded): a job is known to all or to none
                await self._outbox.publish_rejection(job_id, "not accepted: the submissions queue was full")
        if message.reply_to:
            await self._status.reply(message.request_id, message.reply_to, summary, d)

    async def _on_cancel(self, d: Delivery, message: CancelJob) -> None:
        memory = self._cell.memory
        refused = cancel_core.refused(memory, message, d.user_id, self._config.owners)
        if refused:  # nothing changes, so nothing is journaled
            self.log.warning("cancel_refused", job_id=message.job_id, reason=refused)
            if message.reply_to:
                await self._status.reply(message.request_id, message.reply_to, {"error": refused}, d)
            return
        now_s = self._clock.now_s()
        done = self.cancel(message.job_id, message.reason, now_s)
        if done.changed:
            self._journal.record("cancel", d, now_s)
        await self._journal.durable()
        if done.changed:
            for kill in cancel_core.kills(memory, message.job_id, message.reason):
                self.log.info("lease_killed", job_id=message.job_id, worker_id=kill.worker_id, lease_id=kill.lease_id)
                await self._outbox.publish(kill)  # not mandatory: a worker that is gone runs nothing
        if done.ending is not None:  # a job not admitted yet: cancelled at once
            self._journal.record_end(done.ending.record(memory.epoch))
            self._metrics.ended(done.ending)
            await self._journal.durable()
        if done.event is not None:
            await self._outbox.publish(done.event, f"job-end:{message.job_id}")  # again if it was before: deduplicated
        if done.ending is not None:
            await self._outbox.publish_job_ended(memory, message.job_id, "cancelled", message.reason, now_s)
        if message.reply_to:
            await self._status.reply(message.request_id, message.reply_to, done.answer, d)

    def cancel(self, job_id: str, reason: str, now_s: float) -> cancel_core.Cancelled:
        """A cancel into the memory (or replayed from the journal)."""
        done = cancel_core.cancel(self._cell.memory, job_id, reason, now_s)
        if done.ending is not None:
            self.log.info("job_cancelled", job_id=job_id, reason=reason, admitted=False)
        if done.cancelling:
            self._wake.set()
        return done
