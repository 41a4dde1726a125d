"""``gavel serve policy|mechanism|estimator|fleet|worker`` (one service per process), ``gavel up`` (a
chosen set in one process, on either bus) and ``gavel health`` (for container healthchecks).

Services find each other only through the exchange, so they start in any order: a mechanism
without a policy service waits for it and says so; a policy replica started later takes its
share of the requests; a fleet re-announces its workers until a mechanism has heard them. A
broker that does not answer yet is tried again for ``--broker-wait-s`` (common/host.py).

The mechanism keeps a journal unless told not to (``--no-journal``): ``--journal``, else
GAVEL_JOURNAL_PATH, else ``$XDG_STATE_HOME/gavel/mechanism-<exchange>.sqlite`` (one per exchange,
so two deployments on one broker do not share it). ``gavel up`` on the in-memory bus keeps none
by default: nothing outside the process survives it anyway.

The health file is rewritten every 2 s while the service runs and once more when it stops
(``"stopped": true``), so ``gavel health`` tells a stopped service from a running one at once.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import pathlib
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

import structlog

from common.clock import Clock, WallClock
from common.config import BusSettings, Settings
from common.errors import JournalError
from common.host import Service, ServiceHost
from common.journal import Journal, recorded_cluster
from common.log import bind_service
from common.transport import make_bus
from mechanism_service.clocks import ScaledClock, describe_clock
from mechanism_service.core.ownership import SHARED_BROKER_USERS, Ownership
from mechanism_service.core.retention import LIVE, Retention
from mechanism_service.core.settings import PRESETS
from services.cli.common import (
    CATCH_UP_HELP,
    PRESET_VALUE,
    CommandFailed,
    above_one_number,
    load_table,
    non_negative_int,
    non_negative_number,
    or_none,
    positive_int,
    positive_number,
)
from services.cli.state_paths import cluster_identity, default_state_path, legacy_state_path
from services.cli.worker_options import add_worker_options, log_limits, worker_config

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = structlog.get_logger("gavel.serve")
SERVICES = ("policy", "mechanism", "estimator", "fleet")
HEALTH_EVERY_S = 2.0

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
    if only in (None, "mechanism"):
        p.add_argument("--policy", default="max_min_fairness_perf", help="the policy to run (default max_min_fairness_perf)")
        p.add_argument("--preset", choices=sorted(PRESETS), default="default")
        p.add_argument("--catch-up-ratio", type=or_none(above_one_number), default=PRESET_VALUE, metavar="R|none", help=CATCH_UP_HELP)
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


def _clock(args: argparse.Namespace) -> Clock:
    scale = getattr(args, "time_scale", None)
    # x1 is the wall clock (so a mechanism started with --time-scale 1 accepts real workers, which
    # announce "wall")
    return ScaledClock(scale) if scale and scale != 1 else WallClock()


def worker_grace_s(args: argparse.Namespace) -> float | None:
    """--worker-grace-s in the mechanism's own seconds: silence is measured in wall time (a worker
    beats every few wall seconds whatever the scale), the mechanism's clock runs N times faster
    with --time-scale N. None: never declare a worker lost (0, or lockstep time, which does not
    pass while a worker is silent)."""
    if args.lockstep or not args.worker_grace_s:
        return None
    return float(args.worker_grace_s * (args.time_scale or 1.0))


def retention(args: argparse.Namespace) -> Retention:
    """The retention flags as the mechanism's rule. --keep-finished-s is wall seconds, as
    --worker-grace-s (a person reads `gavel jobs` on the wall clock; at --time-scale 1000 an hour
    of the mechanism's time is 3.6 s): the mechanism keeps S x N of its own seconds. Lockstep time
    (a replayed trace's) has no wall length: there only the count limits."""
    finished_s = args.keep_finished_s
    if finished_s is not None:
        finished_s = None if args.lockstep else float(finished_s * (args.time_scale or 1.0))
    return dataclasses.replace(LIVE, finished_s=finished_s, finished_jobs=args.keep_finished_jobs, rounds=args.keep_rounds)


def round_timeout_s(args: argparse.Namespace) -> float | None:
    """How long a live round waits for its leases' reports, in wall seconds (the mechanism waits
    on the wall clock): a round and a half plus a minute of the mechanism's time, and at least a
    wall second for the reports to come (messages take wall time, whatever the scale). None in
    lockstep, which waits for every report. With --time-scale 1000 a lease that never reports (its
    worker killed) held the round 600 wall seconds, 1,667 rounds of the scaled clock."""
    if args.lockstep:
        return None
    scale = args.time_scale or 1.0
    return args.round_s * 1.5 / scale + max(60.0 / scale, 1.0)


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


def default_journal_path(settings: Settings, service: str = "mechanism") -> pathlib.Path:
    """The default file of a service's state, named for its cluster (services/cli/state_paths.py);
    a file kept under the name from before the cluster was in it is still used (an upgrade loses
    nothing), unless it belongs to another cluster."""
    path, legacy = default_state_path(settings, service), legacy_state_path(settings, service)
    if path.exists() or not legacy.exists():
        return path
    recorded = recorded_cluster(legacy)
    if recorded is not None and recorded != cluster_identity(settings.bus):
        return path  # the other cluster's
    log.warning(
        "state_file_old_name", service=service, path=str(legacy),
        hint=f"it is still used; to give it its cluster's name, move it (and its -wal and -shm files) to {path} "
        "while the service is stopped",
    )
    return legacy


def open_estimator_state(args: argparse.Namespace, settings: Settings, bus_kind: str) -> Journal | None:
    """The estimator's state file, kept by default like the mechanism's journal (a restarted
    estimator must not forget what it learned); --no-state keeps none, loudly."""
    if args.no_state:
        log.warning("estimator_state_disabled", reason="--no-state: what the estimator learns will not survive a restart")
        return None
    if args.state:
        path, source = args.state, "--state"
    elif bus_kind == "memory":
        return None
    else:
        path, source = str(default_journal_path(settings, "estimator")), "default"
    from estimator_service.service import JOURNAL_LABEL  # noqa: PLC0415 - only when an estimator runs

    return _open_kept(
        path, source, JOURNAL_LABEL, "the default estimator state (choose another with --state, or --no-state)",
        "estimator_state_opened", cluster_identity(settings.bus),
    )


def _open_kept(path: str, source: str, label: str, default_says: str, event: str, cluster: str) -> Journal:
    """A service's journal, or one line naming the flag (or default) that chose a bad file."""
    try:
        journal = Journal(path, label=label, cluster=cluster)
    except JournalError as e:
        raise CommandFailed(f"{default_says if source == 'default' else source}: {e}", exit_code=2) from None
    log.info(event, path=str(journal.path), source=source)
    return journal


def build_estimator(
    args: argparse.Namespace, settings: Settings, bus_kind: str, table, registry: CollectorRegistry | None = None,  # noqa: ANN001
) -> Service:
    from estimator_service.core.estimator import Estimator  # noqa: PLC0415
    from estimator_service.core.oracle import OracleEstimator  # noqa: PLC0415
    from estimator_service.core.reference import reference_set  # noqa: PLC0415
    from estimator_service.core.settings import EstimatorSettings  # noqa: PLC0415
    from estimator_service.service import EstimatorService  # noqa: PLC0415
    reference = load_table(args.reference, "--reference") if args.reference else table
    state = open_estimator_state(args, settings, bus_kind)
    if args.mode == "oracle":
        core = OracleEstimator(reference)
    else:
        import numpy as np  # noqa: PLC0415

        estimator_settings = EstimatorSettings(
            profiling_share=args.profiling_share, profiling_percentage=args.profiling_percentage
        )
        references = reference_set(reference, keep=args.reference_models, rng=np.random.default_rng([args.seed, 11]))
        core = Estimator(references, estimator_settings)
    return EstimatorService(core=core, journal=state, mode=args.mode, registry=registry)


def open_journal(args: argparse.Namespace, settings: Settings, bus_kind: str) -> Journal | None:
    """The mechanism's journal as the flags, the settings and the bus say (module docstring)."""
    if args.no_journal:
        log.warning("journal_disabled", reason="--no-journal: the mechanism's state will not survive a restart")
        return None
    if args.journal:
        path, source = args.journal, "--journal"
    elif settings.journal_path:
        path, source = settings.journal_path, "GAVEL_JOURNAL_PATH"
    elif bus_kind == "memory":
        return None  # nothing outside this process survives it anyway
    else:
        path, source = str(default_journal_path(settings)), "default"
    return _open_kept(
        path, source, "mechanism journal",
        "the default journal (choose another with --journal or GAVEL_JOURNAL_PATH, or --no-journal)", "journal_opened",
        cluster_identity(settings.bus),
    )


def build_worker(args: argparse.Namespace, settings: Settings, registry: CollectorRegistry | None = None) -> Service:
    """A real worker needs none of the solver stack: only the table (for --type and speeds)."""
    from worker_service.service import WorkerService  # noqa: PLC0415

    config = worker_config(args, settings, load_table(args.throughputs))
    return WorkerService(
        config=config, heartbeat_s=args.heartbeat_s, kill_grace_s=args.kill_grace_s, server_id=args.server_id or "",
        log_limits=log_limits(args),
        registry=registry,
    )


def build_services(
    names: Sequence[str], args: argparse.Namespace, settings: Settings, bus_kind: str, registry: CollectorRegistry | None = None,
) -> list[Service]:
    """``registry``: where the services count their metrics (one, served, for all of them), or
    None: each counts in a private one nobody serves."""
    if list(names) == ["worker"]:
        return [build_worker(args, settings, registry)]
    journal = open_journal(args, settings, bus_kind) if "mechanism" in names else None  # a bad one fails at once
    # Imported here, not above: `gavel health` (a container healthcheck, run every few seconds),
    # refused flags and journals need none of the solver and simulation stacks (1.5 s).
    from mechanism_service.core.rounds import type_shuffler
    from mechanism_service.core.settings import preset
    from mechanism_service.config import MechanismConfig
    from mechanism_service.service import MechanismService
    from policy_service.core.catalog import policy_names
    from policy_service.service import PolicyService
    from sim.fleet import SimulatedFleet
    from sim.scenario import load_context, parse_cluster

    context = load_context(args.throughputs)
    table = context.table
    assert table is not None
    clock = _clock(args)
    services: list[Service] = []
    for name in names:
        if name == "policy":
            replica = args.replica or ("policy" if len(names) > 1 else f"policy-{os.getpid()}")
            services.append(PolicyService(clock=clock, context=context, solving=args.solving, name=replica, registry=registry))
        elif name == "mechanism":
            if args.policy not in policy_names():
                raise CommandFailed(f"--policy: unknown policy {args.policy!r}; known: {', '.join(policy_names())}", exit_code=2)
            mechanism_settings = dataclasses.replace(
                preset(args.preset, args.policy, round_s=args.round_s, gpus_per_server=args.gpus_per_server),
                worker_grace_s=worker_grace_s(args),
                max_failed_attempts=args.max_failed_attempts,
                **({} if args.catch_up_ratio is PRESET_VALUE else {"catch_up_ratio": args.catch_up_ratio}),
            )
            services.append(
                MechanismService(
                    MechanismConfig(
                        settings=mechanism_settings,
                        policy=args.policy,
                        table=table,
                        estimates=True,
                        shuffle=type_shuffler(args.preset, args.seed),
                        seed=args.seed,
                        lockstep=args.lockstep,
                        expected_gpus=args.expect_gpus,
                        round_timeout_s=round_timeout_s(args),
                        deadlines=not args.lockstep and not args.time_scale,
                        elastic_types=() if args.lockstep else table.accelerator_types,
                        admission_batch_s=0.0 if args.lockstep else 0.05,
                        retention=retention(args),
                        owners=Ownership(operators=args.operators, shared_broker_users=args.shared_broker_users),
                    ),
                    clock=clock,
                    journal=journal,
                    registry=registry,
                )
            )
        elif name == "estimator":
            services.append(build_estimator(args, settings, bus_kind, table, registry))
        elif name == "fleet":
            if not args.cluster:
                raise CommandFailed("--cluster is required for the fleet, e.g. v100=4,p100=4,k80=4", exit_code=2)
            services.append(
                SimulatedFleet(
                    clock=clock,
                    table=table,
                    cluster=parse_cluster(args.cluster, table, args.gpus_per_server),
                    gpus_per_server=args.gpus_per_server,
                    lockstep=args.lockstep,
                    heartbeat_s=5.0 * (args.time_scale or 1.0),
                    clock_name=describe_clock(clock, lockstep=args.lockstep),
                    answers_logs=True,
                    name=getattr(args, "fleet_name", "fleet"),
                    instance=uuid.uuid4().hex[:12],  # this start of the fleet (a restart replaces it)
                    claim_ids=True,
                    registry=registry,
                )
            )
        else:
            raise CommandFailed(f"--services: unknown service {name!r} (known: {', '.join(SERVICES)})", exit_code=2)
    return services


async def run_serve(args: argparse.Namespace, settings: Settings) -> int:
    names = list(args.services) if isinstance(args.services, tuple) else [s.strip() for s in args.services.split(",") if s.strip()]
    if not names:
        raise CommandFailed("--services: name at least one service", exit_code=2)
    bind_service("+".join(names))
    health_file = args.health_file or settings.health_file
    outcome = "stopped"
    try:
        crashed = await _serve(names, args, settings, health_file)
    except Exception as e:
        outcome = f"failed: {e}"
        raise
    else:
        if crashed:
            outcome = "a service crashed"
    finally:
        if health_file:
            _write_stopped(health_file, outcome)
    if crashed:
        raise CommandFailed(crashed)
    return 0


async def _serve(names: list[str], args: argparse.Namespace, settings: Settings, health_file: str | None) -> str:
    """Run the services until a signal or a crash; what to say of a crash ("": none)."""
    bus_settings = dataclasses.replace(settings.bus, kind=args.bus_kind or settings.bus.kind)  # up: GAVEL_BUS
    if args.amqp:
        bus_settings = dataclasses.replace(
            bus_settings, amqp_url=BusSettings.from_env({"GAVEL_AMQP_URL": args.amqp}).amqp_url
        )
    if bus_settings.kind == "memory":
        log.warning(
            "memory_bus_only",
            reason="the services talk over an in-memory bus inside this process: `gavel submit`, `gavel jobs` "
            "and services in other processes cannot reach them",
            fix="use --bus amqp to run them on RabbitMQ (GAVEL_AMQP_URL)",
        )
    registry = None
    if args.metrics_port is not None:
        from common.metrics import CollectorRegistry  # noqa: PLC0415 - prometheus_client only when metrics are on

        registry = CollectorRegistry(auto_describe=False)
    services = build_services(names, args, settings, bus_settings.kind, registry)
    broker_wait_s = settings.broker_wait_s if args.broker_wait_s is None else args.broker_wait_s
    host = ServiceHost(
        make_bus(bus_settings, source="+".join(names)),
        services,
        shutdown_timeout_s=settings.shutdown_timeout_s,
        broker_wait_s=broker_wait_s,
        registry=registry,
    )
    endpoint = None
    if registry is not None:
        from common.metrics import MetricsEndpoint  # noqa: PLC0415

        endpoint = MetricsEndpoint(registry, host=args.metrics_host, port=args.metrics_port)
    if endpoint is not None:
        await endpoint.start()  # a port in use is one line (ConfigError: exit 2) before anything starts
    writer = asyncio.get_running_loop().create_task(_write_health(host, health_file)) if health_file else None
    try:
        if not await host.run_until_stopped():
            return ""
        # a service that stopped on purpose says why (a worker whose id another process took)
        reasons = [str(getattr(s, "stop_reason", "")) for s in services if getattr(s, "stop_reason", "")]
        return "; ".join(reasons) or "a service crashed (see its round_loop_crashed event); a supervisor should restart it"
    finally:
        if writer is not None:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
        if endpoint is not None:
            await endpoint.close()


async def _write_health(host: ServiceHost, path: str) -> None:
    while True:
        body = {**host.health().as_dict(), "written_at": time.time(), "pid": os.getpid()}
        if not _write_health_file(path, body):
            return
        await asyncio.sleep(HEALTH_EVERY_S)


def _write_stopped(path: str, outcome: str) -> None:
    """The last word: a healthcheck must not read "ready" from a service that is gone."""
    now = time.time()
    _write_health_file(path, {"ready": False, "stopped": True, "stopped_at": now, "outcome": outcome, "written_at": now, "pid": os.getpid()})


def _write_health_file(path: str, body: dict[str, object]) -> bool:
    target = pathlib.Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_suffix(".tmp")
        temporary.write_text(json.dumps(body))
        temporary.replace(target)  # atomic: a reader never sees half a file
    except OSError as e:
        log.error("health_write_failed", path=path, error=str(e))
        return False
    return True


def run_health(args: argparse.Namespace, settings: Settings) -> int:
    try:
        body = json.loads(pathlib.Path(args.file).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CommandFailed(f"no health at {args.file}: {e}") from None
    if body.get("stopped"):
        stopped_at = float(body.get("stopped_at", 0))
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stopped_at))
        outcome = body.get("outcome")
        raise CommandFailed(
            f"the service stopped at {when} ({time.time() - stopped_at:.0f} s ago)" + (f": {outcome}" if outcome else "")
        )
    age_s = time.time() - float(body.get("written_at", 0))
    if age_s > args.max_age_s:
        raise CommandFailed(f"health is {age_s:.0f} s old (limit {args.max_age_s:.0f} s): the service is not running")
    if not body.get("ready"):
        raise CommandFailed(f"not ready: {json.dumps(body.get('services'))}")
    print("ready")
    return 0
