"""Helpers every command shares: JSON output, tables, typed failures."""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
from collections.abc import Callable, Iterable, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any, TextIO

from common.errors import CommandFailed, ProblemError
from common.throughputs import ThroughputTable, throughput_table_from_json

if TYPE_CHECKING:
    from common.bus import Bus
    from common.config import Settings

# -- flag types: refused at parse time, naming the flag (argparse puts the flag before the message)


def _number_type(kind: type, minimum: float, inclusive: bool, wording: str) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = kind(raw)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
            raise argparse.ArgumentTypeError(f"must be {wording}, got {raw!r}")
        return value

    return parse


positive_number = _number_type(float, 0.0, False, "a finite number > 0")
non_negative_number = _number_type(float, 0.0, True, "a finite number >= 0")
positive_int = _number_type(int, 1, True, "a whole number >= 1")
non_negative_int = _number_type(int, 0, True, "a whole number >= 0")
above_one_number = _number_type(float, 1.0, False, "a finite number > 1")
# A mechanism flag left out keeps its preset's value (an object, never a parsed value).
PRESET_VALUE: Any = object()
CATCH_UP_HELP = (
    "a job on course for a finish-time-fairness ratio above R if it waits a round is charged nothing for its moves "
    "and no hold keeps it waiting; none: never (docs/mechanism.md, 'What a move costs'; default: the preset's, "
    "1.3 for default, none for gavel)"
)


def or_none(parse: Callable[[str], float]) -> Callable[[str], float | None]:
    """A flag type that also takes ``none`` (no limit) and gives None for it."""

    def parse_or_none(raw: str) -> float | None:
        if raw.strip().lower() == "none":
            return None
        try:
            return parse(raw)
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(str(e).replace(", got", " (or none), got", 1)) from None

    return parse_or_none


def per_hour(rate: float) -> str:
    """``1 job/hour``, ``1.5 jobs/hour``."""
    return f"{rate:g} job/hour" if rate == 1 else f"{rate:g} jobs/hour"


def print_lines(lines: Iterable[str], stream: TextIO | None = None) -> None:
    """A command's lines for people: on stdout, or on ``stream`` (stderr for notes beside the
    answer). Commands write through here, print_json and print_table, never ``print``."""
    out = stream or sys.stdout
    for line in lines:
        out.write(f"{line}\n")


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A plain aligned table on stdout (no colour: it is read by people and by grep)."""
    cells = [[str(h) for h in headers], *[[_fmt(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    # the last column (a reason, say) is as long as it is: its rule only as long as its header,
    # so that one long cell does not make every line as wide
    rules = [*("-" * w for w in widths[:-1]), "-" * len(cells[0][-1])] if widths else []
    print_lines([lines[0], "  ".join(rules), *lines[1:]])


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def load_table(path: str | None, flag: str = "--throughputs") -> ThroughputTable:
    """The throughput table at ``path``, or the shipped one (without the solver stack: commands
    that only need the table start at once). A file that cannot be read or parsed is one line
    naming the flag that gave it (exit 2)."""
    try:
        if path is None:
            text = (resources.files("common") / "data" / "simulation_throughputs.json").read_text()
        else:
            text = pathlib.Path(path).read_text()
        return throughput_table_from_json(json.loads(text))
    except OSError as e:
        raise CommandFailed(f"{flag}: cannot read {path}: {e.strerror or e}", exit_code=2) from None
    except json.JSONDecodeError as e:
        raise CommandFailed(f"{flag}: {path} is not JSON (line {e.lineno}, column {e.colno}: {e.msg})", exit_code=2) from None
    except ProblemError as e:
        raise CommandFailed(f"{flag}: {path}: {e}", exit_code=2) from None


async def open_bus(settings: Settings, amqp: str | None) -> Bus:
    """The broker the cluster runs on (GAVEL_AMQP_URL, or ``--amqp``), connected: what every
    command that talks to a running cluster asks it over."""
    import dataclasses  # noqa: PLC0415

    from common.config import BusSettings  # noqa: PLC0415 - the bus stack only when asking (see services/cli/__init__.py)
    from common.transport import make_bus  # noqa: PLC0415

    bus_settings = dataclasses.replace(settings.bus, kind="amqp")
    if amqp:
        bus_settings = dataclasses.replace(bus_settings, amqp_url=BusSettings.from_env({"GAVEL_AMQP_URL": amqp}).amqp_url)
    bus = make_bus(bus_settings, source="gavel-cli")
    await bus.start()
    return bus
