"""Answers the mechanism sends one command-line invocation: on ``status.reply.<key>``, into a
private queue that goes away with the command, in parts (StatusReported) that are joined here.

    async with Replies(bus) as replies:
        await bus.publish(StatusRequested(request_id, "jobs", replies.key))
        answer = await replies.wait(request_id, timeout_s=5.0)   # TimeoutError if none came

Subscribe before asking: a reply published before the queue exists is lost (not mandatory: an
asker that gave up has no queue any more).
"""

from __future__ import annotations

import asyncio
import json
import uuid

from common.bus import Bus, Delivery, Subscription
from common.messages import StatusReported


class Replies:
    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self.key = uuid.uuid4().hex[:12]
        self._parts: dict[str, dict[int, str]] = {}
        self._answers: dict[str, asyncio.Future[object]] = {}
        self._subscription: Subscription | None = None

    async def __aenter__(self) -> Replies:
        self._subscription = await self._bus.subscribe(
            f"cli.{self.key}", [f"status.reply.{self.key}"], self._on_reply, durable=False
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._subscription is not None:
            await self._subscription.cancel()

    def _answer(self, request_id: str) -> asyncio.Future[object]:
        if request_id not in self._answers:
            self._answers[request_id] = asyncio.get_running_loop().create_future()
        return self._answers[request_id]

    async def _on_reply(self, d: Delivery) -> None:
        reply = d.message
        if not isinstance(reply, StatusReported):
            return
        answer = self._answer(reply.request_id)
        if answer.done():
            return
        parts = self._parts.setdefault(reply.request_id, {})
        parts[reply.part] = reply.body
        if len(parts) >= reply.parts:
            answer.set_result(json.loads("".join(parts[k] for k in range(reply.parts))))

    def parts_received(self, request_id: str) -> int:
        return len(self._parts.get(request_id, {}))

    async def wait(self, request_id: str, timeout_s: float) -> object:
        """The whole answer to ``request_id`` (JSON-decoded); TimeoutError after ``timeout_s``."""
        return await asyncio.wait_for(asyncio.shield(self._answer(request_id)), timeout_s)
