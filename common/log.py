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
        # Plain tracebacks: with rich installed (`gavel top` draws with it) structlog would draw
        # each one with rich, local variables and all: seconds per exception, and a secret held
        # in a local (a broker URL with its password) printed to the log.
        renderer = structlog.dev.ConsoleRenderer(colors=stream.isatty(), exception_formatter=structlog.dev.plain_traceback)
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.WriteLoggerFactory(stream),
        # Not cached: tests swap processors (structlog.testing.capture_logs) after import.
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(stream)
    handler.addFilter(OrdinaryReconnect(show=level <= logging.DEBUG))
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


# What aio-pika and aiormq log when the broker drops a connection that the robust connection then
# restores (rabbitmqctl close_connection, a broker restart, a network blip): an error naming the
# close, a warning with the reader's traceback, an error per channel whose close callback finds no
# transport, and a warning per failed attempt while the broker is away. The bus says it once each
# way instead (bus_connection_lost, bus_reconnected: common/transport/rabbit.py). (logger, message
# start): the records that are this noise whatever they carry.
RECONNECT_NOISE = (
    ("aiormq.connection", "Unexpected connection close from remote"),
    ("aio_pika.robust_connection", "Connection attempt to "),
)
# Records that are the same noise only when their exception is a lost connection: the reader's
# traceback may also be a malformed frame, a callback's error our own bug.
RECONNECT_NOISE_IF_CONNECTION_LOST = (
    ("aiormq.connection", "Cancelling cause reader exited abnormally"),
    ("aio_pika.tools", "Callback "),
)
CONNECTION_LOST = frozenset({"AMQPConnectionError", "ConnectionError", "IncompleteReadError", "ChannelInvalidStateError"})


class OrdinaryReconnect(logging.Filter):
    """Turns the client library's account of an ordinary reconnect (RECONNECT_NOISE) into debug
    records: shown, at debug, only when ``show`` (GAVEL_LOG_LEVEL=debug), else dropped."""

    def __init__(self, *, show: bool) -> None:
        super().__init__()
        self._show = show

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG or not self._is_noise(record):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return self._show

    @staticmethod
    def _is_noise(record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if any(record.name == name and message.startswith(start) for name, start in RECONNECT_NOISE):
            return True
        if not any(record.name == name and message.startswith(start) for name, start in RECONNECT_NOISE_IF_CONNECTION_LOST):
            return False
        error: object = record.exc_info[1] if record.exc_info else None
        if error is None and isinstance(record.args, tuple):  # aio_pika.tools: "Callback %r error: %s: %s"
            error = next((a for a in record.args if isinstance(a, BaseException)), None)
        return error is not None and any(c.__name__ in CONNECTION_LOST for c in type(error).__mro__)


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
