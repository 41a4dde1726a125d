"""Bus implementations: ``InMemoryBus`` (embedded default) and ``RabbitBus`` (aio-pika)."""

from __future__ import annotations

from common.bus import Bus
from common.clock import Clock
from common.codec import Codec, CodecLimits
from common.config import BusSettings
from common.errors import ConfigError
from common.transport.memory import InMemoryBus


def make_bus(settings: BusSettings, *, source: str, clock: Clock | None = None) -> Bus:
    """The bus the settings ask for. RabbitMQ support needs the ``amqp`` extra (aio-pika)."""
    codec = Codec(limits=CodecLimits(max_body_bytes=settings.max_message_bytes))
    if settings.kind == "memory":
        from common.topology import queue_bounds

        return InMemoryBus(
            codec=codec, clock=clock, source=source, prefetch=settings.prefetch,
            max_lengths=queue_bounds(settings.submissions_max_length),
        )
    try:
        from common.transport.rabbit import RabbitBus
    except ImportError as e:  # pragma: no cover - depends on the installed extras
        raise ConfigError(f"GAVEL_BUS=amqp needs aio-pika: pip install 'gavel-scheduler[amqp]' ({e})") from None
    return RabbitBus(settings, codec=codec, clock=clock, source=source)


__all__ = ["InMemoryBus", "make_bus"]
