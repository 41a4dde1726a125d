"""``gavel serve policy|mechanism|estimator|fleet|worker|simulator`` (one service per process), ``gavel up`` (a
chosen set in one process, on either bus) and ``gavel health`` (for container healthchecks): their
parsers and flags. What the flags build is services/cli/serve_build.py's, the state files the
services keep services/cli/serve_state.py's, running them and their health files
services/cli/serve_host.py's.

Services find each other only through the exchange, so they start in any order: a mechanism
without a policy service waits for it and says so; a policy replica started later takes its
share of the requests; a fleet re-announces its workers until a mechanism has heard them. A
broker that does not answer yet is tried again for ``--broker-wait-s`` (common/host.py).
"""

from __future__ import annotations

import argparse

from mechanism_service.core.ownership import SHARED_BROKER_USERS
from mechanism_service.core.retention import LIVE
from mechanism_service.core.settings import PRESETS
from services.cli.common import (
    CATCH_UP_HELP,
    PRESET_VALUE,
    above_one_number,
    non_negative_int,
    non_negative_number,
    or_none,
    positive_int,
    positive_number,
)

# Imported from here by check_cmd and tests (they were defined here before the split); run_serve
# and run_health are what the parsers run.
from services.cli.module_flags import add_module_flags
from services.cli.serve_build import SERVICES, _clock, build_services, round_timeout_s, worker_grace_s  # noqa: F401
from services.cli.serve_host import run_health, run_serve
from services.cli.serve_state import default_journal_path, open_estimator_state  # noqa: F401
from services.cli.serve_simulator import DESCRIPTION as SIMULATOR_DESCRIPTION
from services.cli.serve_simulator import add_simulator_options
from services.cli.worker_options import add_worker_options

UP_DESCRIPTION = (
    "Run several services in one process. On the in-memory bus (the default) they talk only to each other: "
    "nothing outside this process can reach them, so `gavel submit`, `gavel jobs` and services started "
    "elsewhere cannot reach them either; use --bus amqp to run them on RabbitMQ (GAVEL_AMQP_URL)."
)
BUS_HELP = (
    "memory (the default, unless GAVEL_BUS says amqp): a bus inside this process, which `gavel submit`, "
    "`gavel jobs` and other processes cannot reach; --bus amqp: RabbitMQ at GAVEL_AMQP_URL"
)


DESCRIPTIONS = {
    "fleet": "Fake workers, one per server of --cluster, that run each lease at the throughput table's steps/s. A job "
    "the table lacks (your own type, or a size it lacks) runs at the steps/s its `gavel submit --throughput` gave for "
    "the type, else at a figure derived from the table: its typical job (a type it has: that type's figure at the "
    "nearest size, times (n/s)^0.75), scaled by the figures given; packed, each at the fraction the table's pairs "
    "typically keep. docs/deploy.md, 'What the simulated fleet runs', states the rule.",
}


def register(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="run one service in this process, on RabbitMQ")
    serve_sub = serve.add_subparsers(dest="service", metavar="SERVICE", required=True)
    for name, help_text in (
        ("policy", "run the policy service: it computes each job's share of time on each accelerator type (start several to share the load)"),
        ("mechanism", "run the mechanism: it decides who runs where each round, leases GPUs to jobs and keeps the journal"),
        ("estimator", "run the throughput estimator: it learns how fast each job runs on each type, alone and sharing a GPU (or reads a table)"),
        ("fleet", "run simulated workers that make progress at the throughput table's speeds (no GPUs needed)"),
    ):
        p = serve_sub.add_parser(name, help=help_text, description=DESCRIPTIONS.get(name))
        _common_options(p)
        _service_options(p, only=name)
        p.set_defaults(run=run_serve, services=(name,), bus_kind="amqp")
    worker = serve_sub.add_parser(
        "worker",
        help="run a real worker on this server: it runs the training jobs the mechanism leases to its GPUs",
        description="One process per server, owning its accelerators of one type (docs/worker.md). Jobs run as "
        "child processes; their checkpoints go to --checkpoint-dir, which every worker must share.",
    )
    _common_options(worker)
    add_worker_options(worker)
    worker.set_defaults(run=run_serve, services=("worker",), bus_kind="amqp")
    simulator = serve_sub.add_parser(
        "simulator", help="run the cells of distributed sweeps (gavel sweep --bus amqp), one at a time", description=SIMULATOR_DESCRIPTION
    )
    _common_options(simulator)
    add_simulator_options(simulator)
    simulator.set_defaults(run=run_serve, services=("simulator",), bus_kind="amqp")

    up = sub.add_parser(
        "up",
        help="run several services in one process, on the in-memory bus (private to the process) or RabbitMQ",
        description=UP_DESCRIPTION,
    )
    up.add_argument("--services", default=",".join(SERVICES), help=f"comma-separated, of {', '.join(SERVICES)}")
    up.add_argument("--bus", dest="bus_kind", choices=("memory", "amqp"), help=BUS_HELP)
    _common_options(up)
    _service_options(up, only=None)
    up.set_defaults(run=run_serve)

    health = sub.add_parser("health", help="exit 0 if the service writing this health file is up and ready, 1 if not (for container health checks)")
    health.add_argument("file", help="the health file (GAVEL_HEALTH_FILE of the service)")
    health.add_argument(
        "--max-age-s", type=positive_number, default=30.0, help="older than this counts as dead (default 30)"
    )
    health.set_defaults(run=run_health)


def _common_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--amqp", metavar="URL", help="broker URL (default: GAVEL_AMQP_URL)")
    p.add_argument("--throughputs", metavar="TABLE.json", help="throughput table (default: the shipped Gavel table)")
    p.add_argument("--health-file", help="write health here every few seconds (default: GAVEL_HEALTH_FILE)")
    p.add_argument(
        "--broker-wait-s",
        type=non_negative_number,
        metavar="S",
        help="keep trying to reach a broker that does not answer for this long; 0: not at all "
        "(default: GAVEL_BROKER_WAIT_S, 60). Wrong credentials or vhost fail at once",
    )
    p.add_argument(
        "--metrics-port", type=_port, metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (docs/metrics.md; default: off). "
        "`gavel up`: one endpoint for all its services",
    )
    p.add_argument(
        "--metrics-host", default="127.0.0.1", metavar="HOST",
        help="the address the metrics endpoint binds (default 127.0.0.1; 0.0.0.0: every interface, as in a container)",
    )


def _service_options(p: argparse.ArgumentParser, only: str | None) -> None:
    if only in (None, "policy"):
        p.add_argument("--replica", help="this policy replica's name (default: policy-<pid>)")
        p.add_argument("--solving", choices=("process", "inline"), default="process", help="where solves run (default: a worker process)")
    if only == "policy":  # (gavel up: the mechanism's --policy is the one its replica serves)
        p.add_argument(
            "--policy", action="append", default=[], metavar="NAME|MODULE:NAME",
            help="a policy plug-in this replica serves besides the built-ins and the installed ones (package.module:Name; "
            "repeat for several); it never imports a module a request names (docs/extending.md)",
        )
    if only in (None, "mechanism"):
        p.add_argument(
            "--policy", default="max_min_fairness_perf", metavar="NAME|MODULE:NAME",
            help="the policy to run: a built-in (gavel policy list), an installed plug-in or package.module:Name "
            "(default max_min_fairness_perf)",
        )
        p.add_argument("--preset", choices=sorted(PRESETS), default="default")
        p.add_argument("--catch-up-ratio", type=or_none(above_one_number), default=PRESET_VALUE, metavar="R|none", help=CATCH_UP_HELP)
        add_module_flags(p)
        journal = p.add_mutually_exclusive_group()
        journal.add_argument(
            "--journal",
            help="the mechanism's SQLite journal (default: GAVEL_JOURNAL_PATH, else "
            "$XDG_STATE_HOME/gavel/mechanism-<exchange>@<host>_<port>[_<vhost>].sqlite, named for the cluster; "
            "`gavel up` on the in-memory bus: none)",
        )
        journal.add_argument(
            "--no-journal", action="store_true", help="keep no journal: the mechanism's state will not survive a restart"
        )
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--expect-gpus", type=positive_int, help="lockstep: start when this many GPUs registered")
        p.add_argument(
            "--worker-grace-s", type=non_negative_number, default=30.0, metavar="S",
            help="declare lost a worker that sent heartbeats and then none for S wall-clock seconds: its GPUs "
            "leave, its jobs run elsewhere from their last credited steps (default 30; 0: never; off with "
            "--lockstep). With --time-scale N the mechanism waits S x N of its own, scaled, seconds",
        )
        p.add_argument(
            "--max-failed-attempts", type=positive_int, default=5, metavar="N",
            help="a job whose process crashes in N leases in a row fails (default 5, as Gavel)",
        )
        owners = p.add_argument_group(
            "who owns a job (docs/deploy.md, \"Who owns a job\"): the broker user that submitted it, or the OS "
            "user its client runs as where people share a broker user; only its owner and the operators may cancel it"
        )
        owners.add_argument(
            "--operators", type=_names, default=frozenset(), metavar="NAMES",
            help="owners' names (comma-separated) who may cancel anyone's job (default: none)",
        )
        owners.add_argument(
            "--shared-broker-users", type=_names, default=SHARED_BROKER_USERS, metavar="NAMES",
            help="broker users that several people share, so a job's owner is the OS user its client names "
            f"(default: {','.join(sorted(SHARED_BROKER_USERS))})",
        )
        keep = p.add_argument_group(
            "retention (docs/reliability.md): what is over is forgotten, so that memory and the journal's "
            "snapshot stay bounded however long the mechanism runs"
        )
        keep.add_argument(
            "--keep-finished-s", type=or_none(non_negative_number), default=LIVE.finished_s, metavar="S",
            help="a finished job (completed, failed, cancelled or refused) is remembered S wall-clock seconds after it "
            "ended (S x N of the mechanism's with --time-scale N; lockstep: the count alone): `gavel job` answers for "
            "it, and its id is not taken again; forgotten at the next round boundary after that, and the id is free "
            f"(default {LIVE.finished_s:g}; none: no age limit)",
        )
        keep.add_argument(
            "--keep-finished-jobs", type=or_none(non_negative_int), default=LIVE.finished_jobs, metavar="N",
            help=f"and at most N finished jobs, the oldest forgotten first (default {LIVE.finished_jobs}; none: no limit)",
        )
        keep.add_argument(
            "--keep-rounds", type=or_none(non_negative_int), default=LIVE.rounds, metavar="N",
            help=f"the newest N round reports and solve times (default {LIVE.rounds}; none: all)",
        )
    if only in (None, "estimator"):
        p.add_argument(
            "--mode", choices=("learned", "oracle"), default="learned",
            help="learned (default): estimates from a reference table and what workers measure; oracle: the table "
            "taken as the truth (a job type it lacks gets no estimate)",
        )
        p.add_argument(
            "--reference", metavar="TABLE.json",
            help="the pre-profiled reference jobs, in Gavel's table format (default: --throughputs, else the shipped table)",
        )
        p.add_argument(
            "--profiling-share", type=_share, default=0.1, metavar="F",
            help="at most this share of the cluster's GPU time goes to profiling runs (default 0.1; 0: none)",
        )
        p.add_argument(
            "--profiling-percentage", type=_share, default=0.25, metavar="P",
            help="Gavel's profiling_percentage: the share of a new job type's (accelerator type, reference) cells "
            "measured by packed runs; completion fills the rest (default 0.25)",
        )
        p.add_argument(
            "--reference-models", type=positive_int, metavar="K",
            help="Gavel's num_reference_models: use K reference job types per gang size, drawn with --seed (default: all)",
        )
        state = p.add_mutually_exclusive_group()
        state.add_argument(
            "--state",
            help="the estimator's SQLite state (what it learned from; default: "
            "$XDG_STATE_HOME/gavel/estimator-<exchange>@<host>_<port>[_<vhost>].sqlite; "
            "`gavel up` on the in-memory bus: none)",
        )
        state.add_argument("--no-state", action="store_true", help="keep no state: what it learned will not survive a restart")
        if only == "estimator":
            p.add_argument("--seed", type=int, default=0, help="draws the reference models (default 0)")
    if only in (None, "mechanism", "fleet"):
        p.add_argument("--round-s", type=positive_number, default=360.0, help="round length in seconds (default 360)")
        p.add_argument("--gpus-per-server", type=positive_int, default=1, help="GPUs per server (default 1)")
        timing = p.add_mutually_exclusive_group()
        timing.add_argument("--time-scale", type=positive_number, help="run time this many times faster than the wall clock")
        timing.add_argument("--lockstep", action="store_true", help="virtual time that moves round by round (trace replays)")
    if only in (None, "fleet"):
        p.add_argument("--cluster", help="fleet: GPUs per type, v100=4,p100=4,k80=4 or 4:4:4")
    if only == "fleet":
        # Two fleets on one exchange sharing a name would share its command queue and take each
        # other's commands; their servers are named <type>-<n>, so give them disjoint types too.
        p.add_argument(
            "--name", dest="fleet_name", default="fleet", metavar="NAME",
            help="this fleet's name: its commands queue is <exchange>.NAME.commands (default fleet); two fleets on "
            "one exchange need distinct names and disjoint accelerator types (their servers are named <type>-<n>)",
        )


def _share(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a share between 0 and 1, got {text}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port (0-65535), got {text}")
    return value


def _names(text: str) -> frozenset[str]:
    """A comma-separated list of names (empty items ignored)."""
    return frozenset(name.strip() for name in text.split(",") if name.strip())

