"""What the mechanism publishes: events with ids derived from what they say (a restarted mechanism
publishing the same event again is recognisably the same: consumers dedupe by message id), and
commands to workers, mandatory: one nobody can receive is said loudly."""

from __future__ import annotations

import dataclasses

import structlog

from common.bus import Bus
from common.codec import DEFAULT_CODEC
from common.errors import UnroutableError
from common.messages import ClusterEvent, ExtendLease, JobRejected, RunJobs
from common.messages.base import Message
from mechanism_service.core import events as events_core
from mechanism_service.core.endings import Ending, rejection_id
from mechanism_service.core.events import EventRing
from mechanism_service.core.memory import Memory


class Outbox:
    def __init__(self, log: structlog.stdlib.BoundLogger, *, events: bool = True) -> None:
        self.log = log  # rebound by the service (its epoch)
        self._bus: Bus | None = None
        self.events_on = events  # the cluster's events are said (MechanismConfig.events)
        self.recent = EventRing()  # the cluster's recent events (core/events.py), for `gavel events`

    def attach(self, bus: Bus) -> None:
        self._bus = bus

    @property
    def bus(self) -> Bus:
        assert self._bus is not None, "the mechanism publishes once started"
        return self._bus

    async def publish(self, message: Message, message_id: str | None = None) -> None:
        """An event, or a command that may find no one (a fence, a kill: a worker that is gone
        runs nothing); not mandatory."""
        await self.bus.publish(message, mandatory=False, message_id=message_id)

    async def publish_events(self, events: list[ClusterEvent]) -> None:
        """The cluster's events (core/events.py): kept in the ring, and published for whoever
        watches (not mandatory: nobody may be); an event said already is not said again."""
        if not self.events_on:
            return
        for event in events:
            if self.recent.add(event):
                await self.bus.publish(event, mandatory=False, message_id=event.event_id)

    async def publish_job_ended(self, memory: Memory, job_id: str, outcome: str, reason: str, now_s: float) -> None:
        """A job's end as one of the cluster's events (none for a refusal or a rejection)."""
        if not self.events_on:
            return
        event = events_core.job_ended(
            outcome, job_id, reason, now_s, events_core.current_round(memory.round_id),
            events_core.last_type(memory.observations.history, job_id),
        )
        if event is not None:
            await self.publish_events([event])

    async def publish_end(self, ending: Ending) -> None:
        """A job's terminal event (JobRejected for a refusal, said in the log too)."""
        if ending.outcome in ("refused", "rejected"):
            await self.publish_rejection(ending.job_id, ending.reason)
        else:
            await self.publish(ending.event, ending.message_id)

    async def publish_rejection(self, job_id: str, reason: str) -> None:
        """JobRejected, with an id derived from what it says (endings.rejection_id)."""
        self.log.info("job_rejected", job_id=job_id, reason=reason)
        await self.publish(JobRejected(job_id, reason), rejection_id(job_id, reason))

    async def publish_command(self, command: Message) -> None:
        """Mandatory: a command nobody can receive (its worker's queue is gone) is said loudly,
        but it must not stop the cluster (a crash would repeat at every restart, since the
        journal republishes the same commands): its lease reports nothing, and a live round
        ends at its timeout without it."""
        try:
            await self.bus.publish(command)
        except UnroutableError as e:
            self.log.error(
                "worker_unreachable", worker_id=getattr(command, "worker_id", ""), lease_id=getattr(command, "lease_id", ""),
                error=str(e), action="its lease counts as no progress",
            )

    async def republish(self, memory: Memory) -> None:
        """The last boundary's commands again, same lease ids, under this incarnation's epoch: a
        worker that already has them repeats its report, and duplicate reports are absorbed. Not
        to a worker lost since, nor for a lease that ended with it."""
        count = 0
        for body in memory.commands:
            command = DEFAULT_CODEC.decode(body).message
            if getattr(command, "worker_id", "") in memory.lost_workers or getattr(command, "lease_id", "") in memory.ended_leases:
                continue
            if isinstance(command, (RunJobs, ExtendLease)):
                command = dataclasses.replace(command, epoch=memory.epoch)
            await self.bus.publish(command, mandatory=False)
            count += 1
        self.log.info("commands_republished", count=count)
