"""``gavel events [--follow] [--job ID] [--json] [--since DURATION]``: what happened in the cluster.

Rounds that start and end, jobs placed (started or moved), preempted, completed, failed or
cancelled, workers that join or are lost, the mechanism's starts (a restart or a fail-over: a new
epoch). First the recent ones the mechanism keeps (its last 1,000), then, with ``--follow``, each
new one as it is published, until Ctrl-C (exit 0). One line each, times as local wall time;
``--json``: one JSON object per line, times in the mechanism's seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from services.cli.common import CommandFailed, positive_number, print_lines
from services.cli.watching import since_seconds

if TYPE_CHECKING:
    from common.config import Settings
    from common.messages import ClusterEvent
    from services.cli.times import ClockView


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "events",
        help="show what happens in the cluster: rounds, placements, preemptions, job ends, workers joining and lost, restarts",
    )
    p.add_argument("--follow", "-f", action="store_true", help="after the recent events, print each new one as it happens (Ctrl-C stops)")
    p.add_argument("--job", metavar="ID", default="", help="only this job's events")
    p.add_argument("--since", metavar="DURATION", type=since_seconds, help="only the events of the last DURATION (90s, 10m, 2h, 1d)")
    p.add_argument("--json", action="store_true", help="one JSON object per line (times in the mechanism's seconds)")
    p.add_argument("--amqp", metavar="URL", help="broker URL (default: GAVEL_AMQP_URL)")
    p.add_argument("--timeout-s", type=positive_number, default=5.0, help="wait this long for the mechanism (default 5)")
    p.set_defaults(run=run_events)


async def run_events(args: argparse.Namespace, settings: Settings) -> int:
    from services.cli.times import ClockView
    from services.cli.watching import Asker, Seen, event_dict, event_line, follow, open_bus, until_interrupted

    bus = await open_bus(settings, args.amqp)
    seen = Seen()
    clock: ClockView | None = None
    live: list[ClusterEvent] = []  # heard while the recent ones were asked for: said after them
    recent_said = False

    def say(event: Mapping[str, object]) -> None:
        if not seen.first_time(str(event["id"])):
            return
        line = json.dumps(event) if args.json else event_line(event, clock)
        sys.stdout.write(line + "\n")
        sys.stdout.flush()  # a pipe (`| grep`) sees each event as it comes

    async def on_event(event: ClusterEvent) -> None:
        if args.job and event.job_id != args.job:
            return
        if recent_said:
            if event.kind == "mechanism_started":
                seen.forget()
            say(event_dict(event))
        else:
            live.append(event)

    try:
        # subscribed before asking, so nothing published between the answer and the stream is missed
        subscription = await follow(bus, on_event) if args.follow else None
        try:
            async with Asker(bus) as asker:
                answers = await asker.ask({"clock": ("clock", "", 0), "events": ("events", args.job, 0)}, args.timeout_s)
        except CommandFailed as e:
            if not args.follow:
                raise
            print_lines([f"gavel: {e}; following the events from now on"], sys.stderr)
            answers = {}
        clock = ClockView.of(answers.get("clock"))
        report = answers.get("events")
        if isinstance(report, dict) and "error" in report:
            raise CommandFailed(str(report["error"]))
        recent = _recent(report, args.since, clock)
        for event in recent:
            say(event)
        if not recent and not args.follow:  # say so, rather than print nothing at all
            which = f" of job {args.job!r}" if args.job else ""
            print_lines([f"gavel: no events{which} among the mechanism's recent ones (it keeps the last 1,000)"], sys.stderr)
        recent_said = True
        for event in live:
            say(event_dict(event))
        live.clear()
        if subscription is not None:
            await until_interrupted()
            await subscription.cancel()
    finally:
        await bus.close()
    return 0


def _recent(report: object, since_s: float | None, clock: ClockView | None) -> list[Mapping[str, object]]:
    """The answer's events, those of the last ``since_s`` wall seconds (mechanism seconds on a
    clock tied to no wall) when asked."""
    if not isinstance(report, dict):
        return []
    events = [e for e in report.get("events", []) if isinstance(e, dict)]
    if since_s is None:
        return events
    scale = clock.scale if clock is not None and clock.tied_to_wall and clock.scale else 1.0
    oldest_s = float(report["now_s"]) - since_s * scale
    return [e for e in events if float(e["time_s"]) >= oldest_s]
