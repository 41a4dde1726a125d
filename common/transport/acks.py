"""Acknowledgements in runs: one ``basic.ack`` with ``multiple=true`` for each run of consecutive
settled deliveries, instead of a frame (and a socket write, and broker work) per message.

A subscription runs many handlers at once (so that journal writes share a commit) and they finish
out of order. Delivery tags on a channel are consecutive from 1, so "every tag up to N is settled"
is one ack of N with ``multiple``. Two rules keep it correct:
- the floor only passes a tag once that delivery is settled, so a running handler's delivery is
  never acknowledged early (a crash still gets it redelivered);
- a delivery rejected on its own (dead-lettering that fell back to a reject) counts as settled only
  after its reject was sent, and is never the tag of a multiple ack (RabbitMQ closes the channel on
  an unknown tag); one ack is in flight at a time, so acks reach the broker in tag order.

A reconnected channel numbers its deliveries from 1 again: what was pending on the old one is
dropped (the broker has requeued those deliveries).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aio_pika.abc import AbstractIncomingMessage


class AckBatcher:
    def __init__(self, on_lost: Callable[[BaseException], None], lost: tuple[type[BaseException], ...]) -> None:
        self._on_lost = on_lost  # told when an ack could not be sent (the channel died)
        self._lost = lost
        self._channel: Any = None
        self._floor = 0  # every delivery tag <= floor is settled
        self._settled: dict[int, AbstractIncomingMessage | None] = {}  # above the floor; None: rejected
        self._target: AbstractIncomingMessage | None = None  # the highest ack <= floor not yet sent
        self._sender: asyncio.Task[None] | None = None

    def ack(self, incoming: AbstractIncomingMessage) -> None:
        """``incoming`` is handled: acknowledge it, with its neighbours."""
        self._settle(incoming, incoming)

    def rejected(self, incoming: AbstractIncomingMessage) -> None:
        """``incoming`` was rejected on its own (already sent): it no longer holds the floor back."""
        self._settle(incoming, None)

    @property
    def pending(self) -> int:
        return len(self._settled) + (self._target is not None)

    async def flush(self) -> None:
        """Return once every settled delivery's ack has been sent (before closing the channel)."""
        while self._sender is not None:
            await asyncio.shield(self._sender)

    def _settle(self, incoming: AbstractIncomingMessage, ack: AbstractIncomingMessage | None) -> None:
        tag = incoming.delivery_tag
        channel = self._channel_of(incoming)
        if tag is None or channel is None:
            return  # its channel is closed: the broker requeues the delivery
        if channel is not self._channel:  # a new channel (first use, or restored after a drop)
            self._channel, self._floor, self._settled, self._target = channel, 0, {}, None
        self._settled[tag] = ack
        while self._floor + 1 in self._settled:
            self._floor += 1
            message = self._settled.pop(self._floor)
            if message is not None:
                self._target = message
        if self._target is not None and self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(self._send(), name="ack-batcher")

    async def _send(self) -> None:
        try:
            while self._target is not None:
                target, self._target = self._target, None
                if self._channel_of(target) is not self._channel:
                    continue  # its channel closed, or was replaced: nothing to acknowledge there
                try:
                    await target.ack(multiple=True)
                except self._lost as e:
                    self._on_lost(e)
        finally:
            self._sender = None

    def _channel_of(self, incoming: AbstractIncomingMessage) -> Any:
        try:
            return incoming.channel
        except self._lost:
            return None
