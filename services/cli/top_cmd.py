"""``gavel top [--once] [--interval-s S]``: the cluster live in a terminal.

The GPUs per type (busy, idle, lost), the jobs running and waiting (where, their share of the
allocation, how far along, their ETA, why they wait) and the last events, redrawn every
``--interval-s`` wall seconds (1 by default: every round of a live cluster is seen). The frame is
laid out for the terminal's size at each redraw (services/cli/top_layout.py). Drawn with rich,
which writes plain ANSI: it works in any terminal, over SSH and in tmux. ``--once`` prints one
frame and exits; so does any `gavel top` whose stdout is not a terminal (a pipe, a file), without
escape codes.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from services.cli.common import positive_number

if TYPE_CHECKING:
    from common.config import Settings
    from services.cli.top_layout import Line, Snapshot
    from services.cli.watching import Asker

EVENTS_SHOWN = 200  # the newest events asked for: more than a screen's worth, not the 1,000 kept
QUERIES = {
    "cluster": ("cluster", "", 0), "jobs": ("jobs", "", 0), "workers": ("workers", "", 0), "shares": ("shares", "", 0),
    "events": ("events", "", EVENTS_SHOWN), "clock": ("clock", "", 0),
}
STYLES = {"title": "bold", "section": "bold underline", "heading": "bold", "dim": "dim"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("top", help="show the cluster live: GPUs busy and idle per type, jobs running and waiting, the last events")
    p.add_argument("--once", action="store_true", help="print one frame and exit (no escape codes when not on a terminal)")
    p.add_argument("--interval-s", type=positive_number, default=1.0, help="redraw every S wall seconds (default 1)")
    p.add_argument("--amqp", metavar="URL", help="broker URL (default: GAVEL_AMQP_URL)")
    p.add_argument("--timeout-s", type=positive_number, default=5.0, help="wait this long for the mechanism (default 5)")
    p.set_defaults(run=run_top)


async def snapshot(asker: Asker, timeout_s: float) -> Snapshot:
    """One round of questions: every answer a frame needs."""
    from services.cli.times import ClockView
    from services.cli.top_layout import Snapshot

    answers = await asker.ask(QUERIES, timeout_s)
    events = answers["events"]
    return Snapshot(
        cluster=_mapping(answers["cluster"]), jobs=_records(answers["jobs"]), workers=_records(answers["workers"]),
        shares=_mapping(answers["shares"]),  # type: ignore[arg-type]
        events=_records(events.get("events") if isinstance(events, dict) else None), clock=ClockView.of(answers["clock"]),
    )


async def run_top(args: argparse.Namespace, settings: Settings) -> int:
    import shutil
    import sys

    from services.cli.common import print_lines
    from services.cli.top_layout import frame
    from services.cli.watching import Asker, open_bus

    tty = sys.stdout.isatty()
    mark = "…" if (sys.stdout.encoding or "").lower().replace("-", "") == "utf8" else "~"
    bus = await open_bus(settings, args.amqp)
    try:
        async with Asker(bus) as asker:
            if args.once or not tty:  # a pipe or a file takes one frame: a live view is for a terminal
                s = await snapshot(asker, args.timeout_s)
                size = shutil.get_terminal_size((100, 40))
                lines = frame(s, size.columns, size.lines if tty else None, mark)
                if tty:
                    _console().print(_text(lines), soft_wrap=True)
                else:
                    print_lines(line.text for line in lines)
                return 0
            await _live(asker, args, mark)
    finally:
        await bus.close()
    return 0


async def _live(asker: Asker, args: argparse.Namespace, mark: str) -> None:
    """Redraw every interval until Ctrl-C; a refresh that fails keeps the last frame and says
    why (a mechanism restarting, a broker reconnecting), and the next one tries again."""
    import asyncio
    import dataclasses

    from rich.live import Live

    from services.cli.common import CommandFailed
    from services.cli.top_layout import frame
    from services.cli.watching import until_interrupted

    console = _console()
    last: Snapshot = await snapshot(asker, args.timeout_s)  # a mechanism that is not there: one line, exit 1

    def draw(live: Live) -> None:
        width, height = console.size  # at every frame: the terminal may have been resized
        live.update(_text(frame(last, width, height - 1, mark)), refresh=True)

    async def refresh(live: Live) -> None:
        nonlocal last
        while True:
            await asyncio.sleep(args.interval_s)
            try:
                last = await snapshot(asker, args.timeout_s)
            except CommandFailed as e:
                last = dataclasses.replace(last, error=str(e))
            draw(live)

    # the terminal's alternate screen (as top and less use it): the shell's screen comes back after
    with Live(console=console, screen=True, auto_refresh=False, redirect_stdout=False, redirect_stderr=False) as live:
        draw(live)
        await until_interrupted(refresh(live))


def _console():  # noqa: ANN202 - rich is imported only to draw
    from rich.console import Console

    return Console(highlight=False, emoji=False)


def _text(lines: list[Line]):  # noqa: ANN202
    from rich.text import Text

    text = Text(no_wrap=True, overflow="crop")
    for k, line in enumerate(lines):
        if k:
            text.append("\n")
        text.append(line.text, style=STYLES.get(line.style, ""))
    return text


def _mapping(value: object) -> dict[str, object]:
    return value if isinstance(value, dict) and "error" not in value else {}


def _records(value: object) -> list[dict[str, object]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
