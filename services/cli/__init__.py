"""The ``gavel`` command. One module per command group; each registers its subcommands.

This package is a composition root (like ``sim``): it may import the service packages to wire
them together, which nothing else in ``services`` may do (tests/arch enforces both).

Exit codes: 0 success; 1 a runtime failure (broker unreachable, ...); 2 bad input or settings,
reported as one line naming the offending field or variable, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys
from collections.abc import Sequence

from common.config import Settings
from common.errors import BusError, ConfigError, GavelError
from services.cli import (
    bus_cmd,
    config_cmd,
    demo_cmd,
    policy_cmd,
    serve_cmd,
    simulate_cmd,
    status_cmd,
    submit_cmd,
    sweep_cmd,
    trace_cmd,
)
from services.cli.common import CommandFailed
from services.logging import configure_logging

GROUPS = (
    config_cmd,
    bus_cmd,
    serve_cmd,
    submit_cmd,
    status_cmd,
    policy_cmd,
    trace_cmd,
    simulate_cmd,
    sweep_cmd,
    demo_cmd,
)


def build_parser() -> argparse.ArgumentParser:
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("gavel-scheduler")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        v = "unknown"
    parser = argparse.ArgumentParser(
        prog="gavel",
        description="Heterogeneity-aware scheduling of deep-learning training jobs (Gavel, as services).",
    )
    parser.add_argument("--version", action="version", version=f"gavel {v}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in GROUPS:
        group.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env(os.environ)
        # Commands talk to people on stdout; events go to stderr, and only warnings unless the
        # user asks for more (services started by `gavel serve` log at GAVEL_LOG_LEVEL).
        level = settings.log.level if "GAVEL_LOG_LEVEL" in os.environ else "warning"
        configure_logging(dataclasses.replace(settings.log, level=level))
        if level == "warning":
            # The CLI turns a lost broker into one line of its own; the client library's
            # error event would say the same thing twice.
            for name in ("aiormq", "aio_pika"):
                logging.getLogger(name).setLevel(logging.CRITICAL)
        result = args.run(args, settings)
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
        return int(result or 0)
    except ConfigError as e:
        print(f"gavel: {e}", file=sys.stderr)
        return 2
    except CommandFailed as e:
        print(f"gavel: {e}", file=sys.stderr)
        return e.exit_code
    except BusError as e:
        print(f"gavel: {e}", file=sys.stderr)
        return 1
    except GavelError as e:
        print(f"gavel: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`gavel ... | head`): not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141

