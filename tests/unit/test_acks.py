"""AckBatcher: one multiple-ack per run of settled deliveries, never past a running one, never
on a rejected tag, in tag order, and nothing carried over to a reconnected channel."""

from __future__ import annotations

import asyncio

from common.transport.acks import AckBatcher


class Channel:
    def __init__(self) -> None:
        self.is_closed = False
        self.acks: list[int] = []  # tags acknowledged with multiple=True, in the order sent
        self.in_flight = 0
        self.max_in_flight = 0


class ChannelClosed(Exception):
    pass


class Incoming:
    def __init__(self, channel: Channel, tag: int) -> None:
        self._channel = channel
        self.delivery_tag = tag

    @property
    def channel(self) -> Channel:
        if self._channel.is_closed:
            raise ChannelClosed
        return self._channel

    async def ack(self, multiple: bool = False) -> None:
        assert multiple
        channel = self.channel
        channel.in_flight += 1
        channel.max_in_flight = max(channel.max_in_flight, channel.in_flight)
        await asyncio.sleep(0)  # the frame is written
        channel.in_flight -= 1
        channel.acks.append(self.delivery_tag)


def batcher(lost: list[BaseException] | None = None) -> AckBatcher:
    return AckBatcher((lost if lost is not None else []).append, (ChannelClosed,))


async def test_deliveries_finishing_out_of_order_are_acknowledged_once_contiguous() -> None:
    channel = Channel()
    acks = batcher()
    messages = [Incoming(channel, tag) for tag in range(1, 7)]
    for tag in (2, 3, 5):
        acks.ack(messages[tag - 1])  # type: ignore[arg-type]
    await acks.flush()
    assert channel.acks == []  # 1 is still running: nothing may be acknowledged past it
    acks.ack(messages[0])  # type: ignore[arg-type]
    await acks.flush()
    assert channel.acks == [3]  # 1-3 in one frame; 4 still running holds 5 back
    acks.ack(messages[3])  # type: ignore[arg-type]
    acks.ack(messages[5])  # type: ignore[arg-type]
    await acks.flush()
    assert channel.acks == [3, 6]
    assert acks.pending == 0


async def test_a_rejected_delivery_is_never_the_tag_of_a_multiple_ack() -> None:
    channel = Channel()
    acks = batcher()
    one, two, three = (Incoming(channel, tag) for tag in (1, 2, 3))
    acks.ack(one)  # type: ignore[arg-type]
    acks.rejected(two)  # type: ignore[arg-type]
    await acks.flush()
    assert channel.acks == [1]  # not 2: RabbitMQ would close the channel on an unknown tag
    acks.ack(three)  # type: ignore[arg-type]
    await acks.flush()
    assert channel.acks == [1, 3]


async def test_one_ack_in_flight_at_a_time_so_they_arrive_in_tag_order() -> None:
    channel = Channel()
    acks = batcher()
    for tag in range(1, 201):
        acks.ack(Incoming(channel, tag))  # type: ignore[arg-type]
        if tag % 7 == 0:
            await asyncio.sleep(0)  # acks go out while more deliveries settle
    await acks.flush()
    assert channel.max_in_flight == 1
    assert channel.acks == sorted(channel.acks) and channel.acks[-1] == 200
    assert len(channel.acks) < 200 // 7 + 2  # runs, not one frame per delivery


async def test_a_reconnected_channel_starts_again_and_the_old_one_is_not_acknowledged() -> None:
    old, new = Channel(), Channel()
    acks = batcher()
    acks.ack(Incoming(old, 2))  # type: ignore[arg-type]  # 1 was running when the connection dropped
    old.is_closed = True
    acks.ack(Incoming(old, 1))  # type: ignore[arg-type]  # its channel is gone: the broker requeued it
    acks.ack(Incoming(new, 1))  # type: ignore[arg-type]  # redelivered on the restored channel, tag 1
    await acks.flush()
    assert old.acks == [] and new.acks == [1]
