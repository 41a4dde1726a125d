"""The worker's answers to ``gavel logs JOB``: every worker hears ``logs.requested`` on a private
queue of its own (``worker.<id>.logs``, gone with the worker: a request is worth nothing to a worker
that starts later), and one that holds output of the job answers on the asker's key, in parts;
one that holds none stays silent.

Apart from the commands' queue on purpose: a command's handler may wait for a job to checkpoint
(up to the kill grace), and an answer must not wait behind it, nor a command behind a long read.
"""

from __future__ import annotations

import asyncio

import structlog

from common.bus import Bus, Delivery
from common.messages import LogsRequested
from worker_service import logbook
from worker_service.job_logs import LogStore

log = structlog.get_logger("gavel.worker.logs")


class LogDesk:
    def __init__(self, store: LogStore, worker_id: str) -> None:
        self._store = store
        self._worker_id = worker_id
        self._bus: Bus | None = None

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        await bus.subscribe(f"worker.{self._worker_id}.logs", [LogsRequested.ROUTING_KEY], self.on_request, prefetch=4, durable=False)

    async def on_request(self, d: Delivery) -> None:
        request = d.message
        if not isinstance(request, LogsRequested) or self._bus is None:
            return
        # A job's bound of bytes read off the disk: in a thread, so heartbeats and commands go on.
        views = await asyncio.to_thread(self._store.read, request)
        parts = logbook.answer_parts(request, self._worker_id, views)
        for part in parts:  # not mandatory: an asker that gave up has no queue any more
            await self._bus.publish(part, correlation_id=d.envelope.message_id, mandatory=False)
        if parts:
            log.debug("logs_answered", job_id=request.job_id, attempts=len(views), parts=len(parts))
