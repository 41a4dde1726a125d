"""Running what ``gavel serve`` and ``gavel up`` built: the bus, the service host and the metrics
endpoint, until a signal or a crash; the health file; and ``gavel health``, which reads it.

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

import structlog

from common.config import BusSettings, Settings
from common.host import ServiceHost
from common.log import bind_service
from common.transport import make_bus
from services.cli.common import CommandFailed
from services.cli.serve_build import build_services

log = structlog.get_logger("gavel.serve")
HEALTH_EVERY_S = 2.0


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
