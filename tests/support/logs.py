"""structlog as the tests leave it where nothing configures it (the services in one process, the
fault seeds' pool): its default console renderer, with plain tracebacks. With rich installed (a
dependency of `gavel top`) the default draws each traceback with rich and its local variables,
~2.7 s apiece: the fault seeds' injected crashes spent most of their time there."""

from __future__ import annotations

import structlog


def plain_tracebacks() -> None:
    """The default processors, the last (the console renderer) with plain tracebacks."""
    processors = list(structlog.get_config()["processors"])
    if processors and isinstance(processors[-1], structlog.dev.ConsoleRenderer):
        processors[-1] = structlog.dev.ConsoleRenderer(exception_formatter=structlog.dev.plain_traceback)
        structlog.configure(processors=processors)
