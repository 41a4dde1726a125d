"""``gavel bus check`` and ``gavel bus dead-letters``: operating the message bus."""

from __future__ import annotations

import argparse
import dataclasses

from common.codec import DEFAULT_CODEC
from common.config import Settings, redact_url
from common.errors import DecodeError
from common.transport import make_bus
from services.cli.common import CommandFailed, print_json, print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bus", help="check that the broker answers, or read the messages no service could handle (dead letters)")
    bus_sub = p.add_subparsers(dest="bus_command", metavar="BUS_COMMAND", required=True)

    check = bus_sub.add_parser("check", help="connect to the broker and create the exchange and dead-letter queue the services use")
    check.add_argument("--amqp", metavar="URL", help="broker URL (default: GAVEL_AMQP_URL)")
    check.add_argument("--json", action="store_true", help="print JSON")
    check.set_defaults(run=run_check)

    dead = bus_sub.add_parser("dead-letters", help="take up to --limit messages off the dead-letter queue (removing them) and show why each failed")
    dead.add_argument("--amqp", metavar="URL", help="broker URL (default: GAVEL_AMQP_URL)")
    dead.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    dead.add_argument("--json", action="store_true", help="print JSON")
    dead.set_defaults(run=run_dead_letters)


def _amqp_settings(args: argparse.Namespace, settings: Settings) -> Settings:
    bus = dataclasses.replace(settings.bus, kind="amqp")
    if args.amqp:
        from common.config import BusSettings

        bus = dataclasses.replace(bus, amqp_url=BusSettings.from_env({"GAVEL_AMQP_URL": args.amqp}).amqp_url)
    return dataclasses.replace(settings, bus=bus)


async def run_check(args: argparse.Namespace, settings: Settings) -> int:
    settings = _amqp_settings(args, settings)
    bus = make_bus(settings.bus, source="gavel-cli")
    await bus.start()
    report = {
        "connected": bus.connected,
        "url": redact_url(settings.bus.amqp_url),
        "exchange": settings.bus.exchange,
        "dead_letter_queue": f"{settings.bus.exchange}.dead-letters",
    }
    await bus.close()
    if args.json:
        print_json(report)
    else:
        print(f"connected to {report['url']}; exchange {report['exchange']!r} and its dead-letter queue are declared")
    return 0


async def run_dead_letters(args: argparse.Namespace, settings: Settings) -> int:
    if args.limit <= 0:
        raise CommandFailed("--limit must be a positive integer", exit_code=2)
    settings = _amqp_settings(args, settings)
    bus = make_bus(settings.bus, source="gavel-cli")
    await bus.start()
    try:
        letters = await bus.take_dead_letters(args.limit)
    finally:
        await bus.close()
    rows = []
    for letter in letters:
        try:
            schema = DEFAULT_CODEC.decode(letter.body).envelope.schema
        except DecodeError:
            schema = "(undecodable)"
        rows.append(
            {
                "queue": letter.queue,
                "routing_key": letter.routing_key,
                "schema": schema,
                "bytes": len(letter.body),
                "reason": letter.reason,
            }
        )
    if args.json:
        print_json(rows)
    elif not rows:
        print("no dead letters")
    else:
        print_table(["queue", "routing key", "schema", "bytes", "reason"], [list(r.values()) for r in rows])
    return 0
