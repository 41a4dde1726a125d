"""``gavel config``: the effective settings, from the environment."""

from __future__ import annotations

import argparse

from common.config import Settings
from services.cli.common import print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "config", help="show the settings in effect, as read from the GAVEL_* environment variables",
        description="The settings every command reads, as JSON (the password redacted). bus.kind is what `gavel up` "
        "runs on without --bus; `gavel serve`, `gavel submit` and the status commands always use RabbitMQ.",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    print_json(settings.as_dict())
    return 0
