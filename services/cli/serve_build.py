"""What ``gavel serve`` and ``gavel up`` build from their flags: each service (policy, mechanism,
estimator, fleet, a real worker) and the values the flags stand for (the clock, the worker grace,
the retention rule, the round timeout). The parsers are services/cli/serve_cmd.py's.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from common.clock import Clock, WallClock
from common.config import Settings
from common.host import Service
from mechanism_service.clocks import ScaledClock, describe_clock
from mechanism_service.core.ownership import Ownership
from mechanism_service.core.retention import LIVE, Retention
from services.cli.common import PRESET_VALUE, CommandFailed, load_table
from services.cli.plugin_flags import checked_policy, served_plugins
from services.cli.serve_state import open_estimator_state, open_journal
from services.cli.worker_options import log_limits, worker_config

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

SERVICES = ("policy", "mechanism", "estimator", "fleet")


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
    if list(names) == ["simulator"]:
        from services.cli.serve_simulator import build_simulator  # noqa: PLC0415

        return [build_simulator(args)]
    journal = open_journal(args, settings, bus_kind) if "mechanism" in names else None  # a bad one fails at once
    # Imported here, not above: `gavel health` (a container healthcheck, run every few seconds),
    # refused flags and journals need none of the solver and simulation stacks (1.5 s).
    from mechanism_service.core.rounds import type_shuffler
    from mechanism_service.core.settings import preset
    from services.cli.module_flags import module_settings
    from mechanism_service.config import MechanismConfig
    from mechanism_service.service import MechanismService
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
            # serve policy: its --policy plug-ins; up: the mechanism's policy
            specs = args.policy if isinstance(args.policy, list) else [args.policy]
            served = dataclasses.replace(context, plugins=served_plugins("--policy", specs))
            services.append(PolicyService(clock=clock, context=served, solving=args.solving, name=replica, registry=registry))
        elif name == "mechanism":
            checked_policy("--policy", args.policy)
            mechanism_settings = dataclasses.replace(
                preset(args.preset, args.policy, round_s=args.round_s, gpus_per_server=args.gpus_per_server),
                worker_grace_s=worker_grace_s(args),
                max_failed_attempts=args.max_failed_attempts,
                **({} if args.catch_up_ratio is PRESET_VALUE else {"catch_up_ratio": args.catch_up_ratio}),
                **dict(module_settings(args)),  # the seams' choices (docs/mechanism.md, "Seams")
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
