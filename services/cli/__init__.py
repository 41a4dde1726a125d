"""The ``gavel`` command. One module per command group; each registers its subcommands.

This package is a composition root (like ``sim``): it may import the service packages to wire
them together, which nothing else in ``services`` may do (tests/arch enforces both).

Exit codes: 0 success; 1 a runtime failure (broker unreachable, ...); 2 bad input or settings,
reported as one line naming the offending field or variable, never a traceback.

What a command imports: a group module imports at its top only what its parser needs (argparse,
the flag types of services/cli/common.py, light constants); what running a command needs is
imported in the function that runs it. So ``gavel --version``, every ``--help`` and the status and
submit commands never load the solver (cvxpy, scipy), plotting (matplotlib) or torch stacks, and
start in about a tenth of a second (bench/cli_start.py; tests/cli/test_cli_imports.py holds
the rule).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

# Command groups, by the module that defines them, in help order. A command imports only its
# own group's module: `gavel submit` or `gavel jobs` start in a fraction of a second, without
# the solver and plotting stacks that `gavel simulate` needs.
GROUP_MODULES = (
    "config_cmd",
    "bus_cmd",
    "serve_cmd",
    "submit_cmd",
    "jobtypes_cmd",
    "status_cmd",
    "logs_cmd",
    "events_cmd",
    "top_cmd",
    "check_cmd",
    "policy_cmd",
    "trace_cmd",
    "simulate_cmd",
    "sweep_cmd",
    "whatif_cmd",
    "demo_cmd",
)
COMMAND_MODULE = {
    "config": "config_cmd",
    "bus": "bus_cmd",
    "serve": "serve_cmd",
    "up": "serve_cmd",
    "health": "serve_cmd",
    "submit": "submit_cmd",
    "cancel": "submit_cmd",
    "job-types": "jobtypes_cmd",
    "jobs": "status_cmd",
    "job": "status_cmd",
    "workers": "status_cmd",
    "cluster": "status_cmd",
    "logs": "logs_cmd",
    "events": "events_cmd",
    "top": "top_cmd",
    "check-journal": "check_cmd",
    "policy": "policy_cmd",
    "trace": "trace_cmd",
    "simulate": "simulate_cmd",
    "sweep": "sweep_cmd",
    "whatif": "whatif_cmd",
    "demo": "demo_cmd",
}


def _groups(argv: Sequence[str] | None) -> list[ModuleType]:
    command = next((a for a in (argv or []) if not a.startswith("-")), None)
    if command is None and argv is not None and "--version" in argv:
        return []  # answered by the top-level parser: loading every group took 1.4 s
    names = [COMMAND_MODULE[command]] if command in COMMAND_MODULE else list(GROUP_MODULES)
    return [importlib.import_module(f"services.cli.{name}") for name in names]


class Parser(argparse.ArgumentParser):
    """Every error is one line, like the command's own (argparse's default prints the usage
    first): ``gavel up: argument --round-s: must be a finite number > 0, got '-1' (see gavel up
    --help)``. Sub-commands' parsers are made of the same class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


class VersionAction(argparse.Action):
    """``--version``, looked up only when asked: reading the installed package's metadata costs
    more than the rest of a status command's start."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("gavel-scheduler")
        except PackageNotFoundError:  # pragma: no cover - running from a source tree
            v = "unknown"
        sys.stdout.write(f"gavel {v}\n")  # on stdout, as argparse's own version action
        parser.exit(0)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with ``argv``, only the named command's group is loaded (all for help)."""
    parser = Parser(
        prog="gavel",
        description="Heterogeneity-aware scheduling of deep-learning training jobs (Gavel, as services).",
    )
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in _groups(argv):
        group.register(sub)
    _name_the_commands(parser)
    return parser


def _name_the_commands(parser: argparse.ArgumentParser) -> None:
    """Every (sub-)command's parser records its own name in what it parses: an argument no parser
    took is then said with the help of the command that was meant (`gavel jobs --state x`: see
    `gavel jobs --help`, not `gavel --help`)."""
    for action in parser._actions:  # noqa: SLF001 - argparse keeps sub-parsers only here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for child in action.choices.values():
                child.set_defaults(command_prog=child.prog)
                _name_the_commands(child)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(arguments)
    args, extras = parser.parse_known_args(arguments)
    if extras:  # as parse_args would, but naming the command's own help
        prog = getattr(args, "command_prog", parser.prog)
        parser.exit(2, f"{prog}: unrecognized arguments: {' '.join(extras)} (see {prog} --help)\n")
    # What running needs (settings, logging, asyncio, the error tree), after the parse: a
    # command's --help and --version never pay for it.
    import asyncio
    import dataclasses
    import logging

    from common.config import Settings
    from common.errors import BusError, ConfigError, GavelError
    from common.log import configure_logging
    from services.cli.common import CommandFailed

    try:
        settings = Settings.from_env(os.environ)
        # Commands talk to people on stdout; events go to stderr, and only warnings unless the
        # user asks for more (services started by `gavel serve` log at GAVEL_LOG_LEVEL).
        serving = hasattr(args, "services")  # `gavel serve` / `gavel up`: a service's log is its record
        level = settings.log.level if serving or "GAVEL_LOG_LEVEL" in os.environ else "warning"
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

