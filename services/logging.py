"""structlog set up once per process: console lines on a TTY, JSON lines otherwise, on stderr.

Services bind their context (``log.bind(service="policy", round_id=...)``) and emit events with
fields; nothing in a service prints. Standard-library logging (aio-pika, asyncio) goes through
the same renderer so a deployment's logs are one JSON stream.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

from common.config import LogSettings

_configured = False


def configure_logging(settings: LogSettings = LogSettings(), *, stream: TextIO | None = None, force: bool = False) -> None:
    """Configure structlog and stdlib logging. Later calls are ignored unless ``force``."""
    global _configured
    if _configured and not force:
        return
    stream = stream or sys.stderr
    as_json = settings.format == "json" or (settings.format == "auto" and not stream.isatty())
    level = logging.getLevelNamesMapping()[settings.level.upper()]
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.typing.Processor
    if as_json:
        renderer = structlog.processors.JSONRenderer()
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=stream.isatty())
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.WriteLoggerFactory(stream),
        # Not cached: tests swap processors (structlog.testing.capture_logs) after import.
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[*shared[1:], structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[structlog.stdlib.add_logger_name],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(level, logging.WARNING))  # libraries: warnings and up
    _configured = True


def bind_service(name: str, **context: object) -> None:
    """Bind the service name (and ids) to every event of this process or task context."""
    structlog.contextvars.bind_contextvars(service=name, **context)
