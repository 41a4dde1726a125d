"""``gavel serve simulator``: its flags and the service they build (sim/sweep_service.py). The
parser is registered by services/cli/serve_cmd.py, the process run by services/cli/serve_host.py.
"""

from __future__ import annotations

import argparse
import dataclasses

from common.host import Service
from services.cli.common import positive_number
from services.cli.plugin_flags import served_plugins

DESCRIPTION = (
    "Take cells of distributed sweeps (`gavel sweep --bus amqp`) from RabbitMQ, one at a time, run each on the "
    "simulator and publish its result. Start any number, on any machines, against the sweep's broker "
    "(GAVEL_AMQP_URL) and exchange (GAVEL_EXCHANGE). A cell of a sweep run with --throughputs needs that table "
    "here too (--throughputs, or --table, repeatable); the shipped table is always held."
)


def add_simulator_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", dest="simulator_name", metavar="NAME", help="this simulator's name in results and logs (default simulator-<host>-<pid>)")
    p.add_argument(
        "--table", dest="tables", action="append", default=[], metavar="TABLE.json",
        help="another throughput table a sweep may name (repeat for several; --throughputs is one too)",
    )
    p.add_argument(
        "--cell-timeout-s", type=positive_number, metavar="S",
        help="stop a cell still running after S seconds and answer it as failed (default: 25 minutes, under RabbitMQ's "
        "default consumer_timeout of 30, past which the broker would hand the running cell to another simulator)",
    )
    p.add_argument(
        "--policy", dest="plugin_policies", action="append", default=[], metavar="MODULE:NAME",
        help="a policy plug-in this simulator runs when a cell names it, besides the built-ins and the installed ones "
        "(repeatable); it never imports a module a cell names (docs/extending.md)",
    )


def build_simulator(args: argparse.Namespace) -> Service:
    from sim.scenario import load_context
    from sim.sweep_cells import table_digest
    from sim.sweep_service import SimulatorService

    served = served_plugins("--policy", args.plugin_policies)  # a broken one: one line naming it, exit 2
    contexts = {table_digest(None): dataclasses.replace(load_context(None), plugins=served)}
    for path in [args.throughputs, *args.tables]:
        if path is not None:
            context = load_context(path)  # a bad file: one line naming it, exit 2
            contexts[table_digest(_read(path))] = dataclasses.replace(context, plugins=served)
    bound = {} if args.cell_timeout_s is None else {"cell_timeout_s": args.cell_timeout_s}
    return SimulatorService(contexts, name=args.simulator_name, **bound)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:  # load_context read it already: it exists and is a table
        return f.read()
