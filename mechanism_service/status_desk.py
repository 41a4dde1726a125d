"""The status desk: answers to `gavel jobs|job|workers|cluster` (core/queries.py), the recent
events and the allocation's shares (`gavel events`, `gavel top`), and every other
answer a command-line asker waits for (a sealed batch, a cancel), on its private reply queue."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from common.bus import Delivery
from common.clock import Clock
from common.messages import StatusReported, StatusRequested
from mechanism_service.clocks import clock_basis
from mechanism_service.config import MechanismConfig
from mechanism_service.core import events as events_core
from mechanism_service.core import queries
from mechanism_service.core.shares import shares_report
from mechanism_service.core.memory import MemoryCell
from mechanism_service.outbox import Outbox

STATUS_PART_CHARS = 60_000  # under the codec's 64 KiB limit on one string


class StatusDesk:
    def __init__(
        self, cell: MemoryCell, config: MechanismConfig, clock: Clock, outbox: Outbox, *, wall: Callable[[], float] = time.time,
    ) -> None:
        self._cell = cell
        self._config = config
        self._clock = clock
        self._outbox = outbox
        self._wall = wall  # the wall's now beside the mechanism's in every answer (its clock may be scaled)

    async def on_status(self, d: Delivery) -> None:
        request = d.message
        assert isinstance(request, StatusRequested)
        memory = self._cell.memory
        if request.query == "events":  # the recent events (core/events.py), kept by the outbox
            body: object = events_core.events_report(
                self._outbox.recent, self._clock.now_s(), events_core.current_round(memory.round_id), job_id=request.job_id,
                limit=request.limit,
            )
        elif request.query == "shares":
            body = shares_report(memory.state)
        else:
            now_s = self._clock.now_s()
            body = queries.answer(
                memory, request, now_s, policy=self._config.policy, estimates=self._config.estimates,
                rates=self._cell.rates, seed_s=self._config.settings.seed_s,
                clock=clock_basis(self._clock, lockstep=self._config.lockstep, now_s=now_s, wall_s=self._wall()),
            )
        await self.reply(request.request_id, request.reply_to, body, d)

    async def reply(self, request_id: str, reply_to: str, body: object, d: Delivery) -> None:
        """An answer to a command-line asker, on its own key, in parts of at most
        STATUS_PART_CHARS characters (the codec's limit on one string)."""
        text = json.dumps(body)  # ASCII: characters are bytes
        parts = [text[i : i + STATUS_PART_CHARS] for i in range(0, len(text), STATUS_PART_CHARS)] or [""]
        for k, part in enumerate(parts):  # not mandatory: an asker that gave up has no queue any more
            reply = StatusReported(request_id, reply_to, part, k, len(parts))
            await self._outbox.bus.publish(reply, correlation_id=d.envelope.message_id, mandatory=False)
