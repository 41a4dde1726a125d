"""structlog set up once per process: console lines on a TTY, JSON lines otherwise, on stderr.

Services bind their context (``log.bind(service="policy", round_id=...)``) and emit events with
fields; nothing in a service prints. Standard-library logging (aio-pika, asyncio) goes through
the same renderer so a deployment's logs are one JSON stream.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import pathlib
import sys
from collections.abc import Iterator
from typing import TextIO

import structlog

from common.config import LogSettings

_configured = False
_current: tuple[LogSettings, TextIO | None] = (LogSettings(), None)  # what configure_logging last set up


def configure_logging(settings: LogSettings = LogSettings(), *, stream: TextIO | None = None, force: bool = False) -> None:
    """Configure structlog and stdlib logging. Later calls are ignored unless ``force``."""
    global _configured, _current
    if _configured and not force:
        return
    _current = (settings, stream)
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


@dataclasses.dataclass(frozen=True)
class LogFile:
    """What :func:`logging_into` wrote: the file, and its events counted by level (filled in
    when the block ends)."""

    path: pathlib.Path
    by_level: dict[str, int] = dataclasses.field(default_factory=dict)

    def summary(self) -> str:
        """``2 errors, 9 warnings``: the levels from the most severe down."""
        order = ("critical", "error", "warning", "info", "debug")
        ranked = sorted(self.by_level.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))
        return ", ".join(f"{n} {level}{'s' if n != 1 else ''}" for level, n in ranked)


@contextlib.contextmanager
def logging_into(path: pathlib.Path) -> Iterator[LogFile]:
    """Every event of this process (structlog's and the standard library's) as JSON lines into
    ``path`` while the block runs, at the level configured; then back to where it went before.

    For a command that draws on the terminal while services run in its process (`gavel simulate`'s
    progress bar, with faults injected on purpose): their events would otherwise be written over
    the bar. A file with no event in the end is removed."""
    settings, stream = _current
    log_file = LogFile(path)
    try:
        with open(path, "w", encoding="utf-8") as f:
            configure_logging(dataclasses.replace(settings, format="json"), stream=f, force=True)
            yield log_file
    finally:
        configure_logging(settings, stream=stream, force=True)
        levels: collections.Counter[str] = collections.Counter()
        with contextlib.suppress(OSError), open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    levels[str(json.loads(line).get("level", "?"))] += 1
                except (ValueError, AttributeError):  # a line some library wrote by itself
                    levels["?"] += 1
        log_file.by_level.update(levels)
        if not levels:
            path.unlink(missing_ok=True)
