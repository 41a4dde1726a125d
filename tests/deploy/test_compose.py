"""deploy/: the compose file, the broker's definitions and configuration, the image, the docs.

Docker does not run on the machine that builds this project, so the deployment is checked by
reading it:
- docker-compose.yml: every service has an image or a build, runs a command the `gavel` parser
  accepts (argparse itself parses each argv, after the ${...} are filled in from .env.example, and
  after a service's entrypoint snippet, run by /bin/sh with a stand-in `gavel`, made it final),
  has a healthcheck (`gavel health`, and `rabbitmq-diagnostics -q check_port_connectivity` for the
  broker), a restart policy, and depends on a healthy broker; the policy and worker services can
  be scaled; the simulated fleet and the real workers are profiles of which .env.example starts
  exactly one, on the clock it needs; the mechanism's journal, the estimator's state and the
  workers' checkpoints are on volumes; each service connects as its own broker user;
- .env.example defines every variable the compose file uses;
- definitions.json: one vhost, no guest, the topology the bus declares (same arguments, so a
  service's declaration is accepted; every queue of common.topology.SUBMISSION_QUEUES with exactly
  its bindings, so a submission reaches each consumer however late it starts), and permissions
  evaluated the way RabbitMQ evaluates them (an unanchored regex search; "" means "^$") against
  what each service does on the broker
  (the operation -> permission table of RabbitMQ's access-control guide): everything it needs is
  granted, other services' queues and routing keys are not;
- the password hashes in definitions.json are those of the passwords in .env.example;
- max_message_size in rabbitmq.conf equals GAVEL_MAX_MESSAGE_BYTES;
- the Dockerfile: python:3.11-slim, dependency layer before the source, non-root, `gavel` entry
  point; .dockerignore keeps secrets out of the build context;
- every `gavel ...` command shown in docs/deploy.md parses.

Where a RabbitMQ broker and `rabbitmqctl` are at hand, the last tests go further: they import the
definitions (under a unique vhost and unique user names, removed afterwards), perform every
service's bus operations as that service's user and expect exactly the refusals the regexes
promise; then they run compose's default services as local processes, each with its compose
entrypoint, command and environment and its own user, and have the CLI user submit a trace that
must complete; and a real worker started as compose starts it, as gavel-worker, becomes healthy
and is refused by that (time-scaled) mechanism, with the reason.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import contextlib
import copy
import dataclasses
import fnmatch
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml  # the dev extra's PyYAML (the Makefile checks it is there): never a skip of this module

from common.messages import (
    EVENT_KINDS,
    ClusterEvent,
    AllocationComputed,
    AllocationFailed,
    AllocationRequested,
    CancelJob,
    ExtendLease,
    GangRendezvous,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobProgress,
    JobRejected,
    JobSubmitted,
    KillJobs,
    LogsReported,
    LogsRequested,
    Message,
    RoundEnded,
    RoundStarted,
    RunJobs,
    StatusReported,
    StatusRequested,
    SubmissionsSealed,
    ThroughputEstimated,
    WorkerHeartbeat,
    WorkerIdInUse,
    WorkerRefused,
    WorkerRegistered,
)
from common.topics import topic_matches
from common.topology import ESTIMATOR_INPUTS
from tests.support.broker import broker_required
from tests.support.waiting import until

# One xdist worker runs the module: its broker tests share the definitions imported once, a vhost
# for each use (imported), and the services started once (services_running); the rest takes ~2 s.
pytestmark = pytest.mark.xdist_group("deploy")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
ENV_EXAMPLE = DEPLOY / ".env.example"
DEFINITIONS = DEPLOY / "rabbitmq" / "definitions.json"
RABBITMQ_CONF = DEPLOY / "rabbitmq" / "rabbitmq.conf"
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"

VHOST = "gavel"
EXCHANGE = "gavel"
DLX = "gavel.dlx"
DEAD_LETTERS = "gavel.dead-letters"
UP_SERVICES = {"rabbitmq", "policy", "mechanism", "estimator"}  # what `docker compose up` always starts
MONITORING = {"prometheus", "grafana"}  # and beside them (tests/deploy/test_monitoring.py checks them)
# Who trains the jobs: a profile each, COMPOSE_PROFILES in .env chooses (never both).
TRAINERS = {"fleet": "simulated", "worker": "workers"}
LONG_RUNNING = ("policy", "mechanism", "estimator", "fleet", "worker")  # the `gavel serve` services
GAVEL_SERVICES = (*LONG_RUNNING, "cli")
WORKER_CHECKPOINTS = "/var/lib/gavel/checkpoints"
ADMIN_USER = "gavel-admin"
ADMIN_PASSWORD_VAR = "RABBITMQ_ADMIN_PASSWORD"

@dataclasses.dataclass(frozen=True)
class ServiceSpec:
    """What one service does on the broker, besides what every service does at start (declare the
    exchanges and the dead-letter queue, bind that queue to the DLX, republish failures to the DLX)."""

    user: str
    password_var: str
    queues: tuple[str, ...]  # declared (with x-dead-letter-exchange), bound to the exchange, consumed
    bindings: tuple[str, ...]  # binding keys on the exchange
    publishes: tuple[str, ...]  # routing keys published to the exchange
    gets: tuple[str, ...] = ()  # queues it only takes messages from (basic.get)
    claims: tuple[str, ...] = ()  # exclusive queues it declares as a claim on a name (Bus.claim), never bound
    exclusive: bool = False  # its queues are private (exclusive, auto-delete)


def key(cls: type[Message], **fields: str) -> str:
    """A concrete routing key of a message class (its placeholders filled in)."""
    return cls.ROUTING_KEY.format(**fields)


REPLY_TO = "3f9a1c2b7d4e"  # one `gavel jobs` invocation: its queue gavel.cli.<id>, its key status.reply.<id>

SERVICES: Mapping[str, ServiceSpec] = {
    "policy": ServiceSpec(
        "gavel-policy",
        "POLICY_AMQP_PASSWORD",
        queues=("gavel.policy.allocation-requests",),
        bindings=(key(AllocationRequested),),
        publishes=(key(AllocationComputed), key(AllocationFailed)),
    ),
    "mechanism": ServiceSpec(
        "gavel-mechanism",
        "MECHANISM_AMQP_PASSWORD",
        queues=(
            "gavel.mechanism.workers",
            "gavel.mechanism.submissions",
            "gavel.mechanism.progress",
            "gavel.mechanism.allocations",
            "gavel.mechanism.status",
            "gavel.mechanism.throughputs",
        ),
        bindings=(
            key(WorkerRegistered),
            key(WorkerHeartbeat),
            key(WorkerIdInUse),
            key(JobSubmitted),
            key(SubmissionsSealed),
            key(CancelJob),
            key(JobProgress),
            key(AllocationComputed),
            key(AllocationFailed),
            key(ThroughputEstimated),
            key(StatusRequested),
        ),
        publishes=(
            key(AllocationRequested),
            key(RunJobs, worker_id="v100-0"),
            key(ExtendLease, worker_id="v100-0"),
            key(KillJobs, worker_id="k80-3"),
            key(WorkerRefused, worker_id="k80-3"),
            key(JobRejected),
            key(JobCompleted),
            key(JobFailed),
            key(JobCancelled),
            key(RoundStarted),
            key(RoundEnded),
            key(StatusReported, reply_to=REPLY_TO),
            *(key(ClusterEvent, kind=kind) for kind in EVENT_KINDS),
        ),
    ),
    # One queue for everything it learns from (common/topology.py): a job's progress follows its submission.
    "estimator": ServiceSpec(
        "gavel-estimator",
        "ESTIMATOR_AMQP_PASSWORD",
        queues=("gavel.estimator.inputs",),
        bindings=(
            key(JobSubmitted), key(JobProgress), key(JobCompleted), key(JobFailed), key(JobCancelled), key(JobRejected),
        ),
        publishes=(key(ThroughputEstimated),),
    ),
    "fleet": ServiceSpec(
        "gavel-fleet",
        "FLEET_AMQP_PASSWORD",
        # its commands, and `gavel logs` (a simulated job has no output: it says so)
        queues=("gavel.fleet.commands", "gavel.fleet.logs"),
        bindings=("worker.cmd.v100-0.*", "worker.cmd.k80-3.*", key(LogsRequested)),  # one per simulated server
        publishes=(
            key(WorkerRegistered), key(WorkerHeartbeat), key(JobProgress), key(WorkerIdInUse),
            key(LogsReported, reply_to=REPLY_TO),
        ),
        claims=("gavel.claim.worker.v100-0", "gavel.claim.worker.k80-3"),  # one per simulated server
    ),
    # A real worker (worker_service/service.py): its own queue for its commands and round starts,
    # one for `gavel logs` (worker_service/log_desk.py), and, as a gang's first worker, the
    # rendezvous to each other worker of the gang.
    "worker": ServiceSpec(
        "gavel-worker",
        "WORKER_AMQP_PASSWORD",
        queues=("gavel.worker.v100-0", "gavel.worker.v100-0.logs"),
        bindings=("worker.cmd.v100-0.*", key(RoundStarted), key(LogsRequested)),
        publishes=(
            key(WorkerRegistered), key(WorkerHeartbeat), key(JobProgress), key(GangRendezvous, worker_id="v100-1"),
            key(WorkerIdInUse), key(LogsReported, reply_to=REPLY_TO),
        ),
        claims=("gavel.claim.worker.v100-0",),  # its worker id: one process per id
    ),
    # The CLI's only queues are private reply queues. It does not declare the queues submissions
    # go to (the mechanism's and the estimator's): definitions.json does (so a submission is kept
    # while they are down), and a passive declaration, which is all the CLI needs, requires no
    # permission.
    "cli": ServiceSpec(
        "gavel-cli",
        "CLI_AMQP_PASSWORD",
        queues=(f"gavel.cli.{REPLY_TO}",),
        # its replies (the mechanism's, and the workers' output for `gavel logs`), and the
        # cluster's events (`gavel events --follow`, `gavel top`)
        bindings=(key(StatusReported, reply_to=REPLY_TO), key(LogsReported, reply_to=REPLY_TO), "event.*"),
        publishes=(key(JobSubmitted), key(SubmissionsSealed), key(CancelJob), key(StatusRequested), key(LogsRequested)),
        gets=(DEAD_LETTERS,),
        exclusive=True,
    ),
}
PASSWORD_VARS = {spec.user: spec.password_var for spec in SERVICES.values()} | {ADMIN_USER: ADMIN_PASSWORD_VAR}


# -- reading the files -----------------------------------------------------------------------------


@cache
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@cache
def env_example() -> dict[str, str]:
    values: dict[str, str] = {}
    for n, raw in enumerate(ENV_EXAMPLE.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", name), f".env.example:{n}: not NAME=value: {raw!r}"
        assert name not in values, f".env.example:{n}: {name} defined twice"
        assert value == value.strip() and not value.startswith(("'", '"')) and " #" not in value, (
            f".env.example:{n}: keep values bare (no quotes, spaces or inline comments): {raw!r}"
        )
        values[name] = value
    return values


@cache
def definitions() -> dict[str, Any]:
    return json.loads(DEFINITIONS.read_text())


@cache
def rabbitmq_conf() -> dict[str, str]:
    settings: dict[str, str] = {}
    for raw in RABBITMQ_CONF.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            name, sep, value = line.partition("=")
            assert sep, f"rabbitmq.conf: not key = value: {raw!r}"
            settings[name.strip()] = value.strip()
    return settings


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def referenced_variables(text: str) -> set[str]:
    return {m.group(1) for m in _VAR.finditer(text.replace("$$", ""))}


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR?error} and $$."""

    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        v = env.get(name)
        if op in (":-", ":?") and v == "":
            v = None
        if v is not None:
            return v
        if op in (":-", "-"):
            return arg
        raise AssertionError(f"${{{name}}} is not set (.env.example) and has no default")

    parts = value.split("$$")
    return "$".join(_VAR.sub(one, part) for part in parts)


def service(name: str) -> dict[str, Any]:
    return compose()["services"][name]


def environment(name: str) -> dict[str, str]:
    env = service(name).get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: interpolate(str(v), env_example()) for k, v in env.items()}


def command(name: str, **env: str) -> list[str]:
    """The service's command, its ${...} filled in from .env.example (and ``env``, as a .env would)."""
    cmd = service(name)["command"]
    argv = shlex.split(cmd) if isinstance(cmd, str) else [str(a) for a in cmd]
    return [interpolate(a, {**env_example(), **env}) for a in argv]


def entrypoint(name: str) -> list[str] | None:
    """Compose's entrypoint of the service (the ${...} filled in), or None: the image's, `gavel`."""
    ep = service(name).get("entrypoint")
    if ep is None:
        return None
    argv = shlex.split(ep) if isinstance(ep, str) else [str(a) for a in ep]
    return [interpolate(a, env_example()) for a in argv]


def container_argv(name: str, gavel: str = "gavel") -> list[str]:
    """What the container runs: compose's entrypoint and command; `gavel` is the image's entrypoint."""
    ep = entrypoint(name)
    return [*ep, *command(name)] if ep else [gavel, *command(name)]


def gavel_argv(name: str, **env: str) -> list[str]:
    """The arguments `gavel` ends up with in the service's container: its entrypoint run by /bin/sh,
    in its compose environment (plus ``env``), with a stand-in `gavel` that prints them."""
    if entrypoint(name) is None:
        return command(name, **env)
    stub_dir = _gavel_stub()
    full_env = {"PATH": f"{stub_dir}{os.pathsep}{os.defpath}", **environment(name), **env}
    out = subprocess.run(container_argv(name), env=full_env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, f"{name}: its entrypoint failed: {out.stderr}"
    return json.loads(out.stdout)


@cache
def _gavel_stub() -> str:
    directory = Path(tempfile.mkdtemp(prefix="gavel-entrypoint-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    stub = directory / "gavel"
    printer = "import json, sys; print(json.dumps(sys.argv[1:]))"
    stub.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -c "{printer}" "$@"\n')
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    return str(directory)


def parse_gavel(argv: list[str]) -> Any:
    """The namespace `gavel argv...` would run with; an AssertionError if argparse refuses it."""
    from services.cli import build_parser

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            return build_parser().parse_args(argv)
        except SystemExit as e:
            refusal = err.getvalue().strip()
            raise AssertionError(f"`gavel {shlex.join(argv)}` is refused by the CLI (exit {e.code}): {refusal}") from None


def seconds(duration: str | int | float) -> float:
    if isinstance(duration, (int, float)):
        return float(duration)
    total, units = 0.0, {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    for amount, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration):
        total += float(amount) * units[unit]
    return total


# -- the compose file ------------------------------------------------------------------------------


def test_up_starts_the_broker_the_scheduler_and_one_kind_of_workers() -> None:
    services = compose()["services"]
    assert {name for name, s in services.items() if not s.get("profiles")} == UP_SERVICES | MONITORING
    assert services["cli"].get("profiles") == ["tools"]
    for name, profile in TRAINERS.items():
        assert services[name].get("profiles") == [profile], name
    # .env.example (COMPOSE_PROFILES, which Compose reads from .env) starts exactly one of them.
    active = set(env_example()["COMPOSE_PROFILES"].split(","))
    assert [name for name, profile in TRAINERS.items() if profile in active] == ["fleet"]


@pytest.mark.parametrize("name", sorted(UP_SERVICES | set(TRAINERS) | {"cli"}))
def test_every_service_has_an_image_or_a_build(name: str) -> None:
    s = service(name)
    assert s.get("image") or s.get("build"), f"{name}: neither image nor build"
    if name == "worker":
        build = s["build"]
        assert {k: build[k] for k in ("context", "dockerfile")} == {"context": "..", "dockerfile": "deploy/Dockerfile"}
        args = {k: interpolate(str(v), env_example()) for k, v in build["args"].items()}
        assert "worker" in args["GAVEL_EXTRAS"].split(","), "a worker runs PyTorch jobs: the worker extra"
        assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu", "CPU torch unless told otherwise"
        assert re.fullmatch(r"torch==[0-9.]+", args["TORCH_REQUIREMENT"]), args["TORCH_REQUIREMENT"]
        # Its own tag: the scheduler's image stays without torch.
        assert interpolate(s["image"], env_example()) != interpolate(service("policy")["image"], env_example())
    elif name != "rabbitmq":
        assert s["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}


@pytest.mark.parametrize("name", LONG_RUNNING)
def test_each_service_runs_its_own_gavel_serve_command(name: str) -> None:
    argv = gavel_argv(name)
    assert argv[:2] == ["serve", name], f"{name}: runs `gavel {shlex.join(argv)}`"
    args = parse_gavel(argv)
    assert args.command == "serve"


def test_the_cli_service_runs_a_gavel_command() -> None:
    parse_gavel(command("cli"))


def test_the_mechanism_and_the_fleet_share_a_clock_and_a_server_size() -> None:
    mechanism, fleet = parse_gavel(gavel_argv("mechanism")), parse_gavel(gavel_argv("fleet"))
    assert mechanism.time_scale == float(env_example()["TIME_SCALE"]) > 1
    assert (mechanism.time_scale, mechanism.lockstep) == (fleet.time_scale, fleet.lockstep)
    assert mechanism.gpus_per_server == fleet.gpus_per_server


@pytest.mark.parametrize("time_scale", ("1", "100"))
def test_time_scale_1_is_the_wall_clock_that_real_workers_announce(time_scale: str) -> None:
    """A real worker announces the clock "wall" (its leases end on the wall clock), and a mechanism
    on any other clock refuses it: TIME_SCALE=1 (`--time-scale 1`) must be the wall clock. The fleet
    follows the same TIME_SCALE, so it never disagrees."""
    from mechanism_service.clocks import describe_clock
    from services.cli.serve_cmd import _clock

    for name in ("mechanism", "fleet"):
        args = parse_gavel(gavel_argv(name, TIME_SCALE=time_scale))
        clock = describe_clock(_clock(args), lockstep=args.lockstep)
        assert clock == ("wall" if time_scale == "1" else f"scaled x{time_scale}"), (name, clock)
    worker_service = (ROOT / "worker_service" / "service.py").read_text()
    assert 'clock="wall"' in worker_service, "the worker's announced clock changed: revisit TIME_SCALE=1"


def test_workers_are_cpu_by_default_share_their_checkpoints_and_scale() -> None:
    worker = service("worker")
    args = parse_gavel(gavel_argv("worker"))
    assert args.device == "cpu"
    assert args.checkpoint_dir == WORKER_CHECKPOINTS
    mounts = {m.split(":")[1]: m.split(":")[0] for m in worker["volumes"]}
    assert mounts.get(WORKER_CHECKPOINTS) in compose()["volumes"], "the checkpoints must be a named volume, shared"
    # Docker gives a new volume the ownership of its mount point in the image: the image's user's.
    assert re.search(rf"install -d -o gavel -g gavel [^\n]*{re.escape(WORKER_CHECKPOINTS)}", dockerfile_text())
    # Every replica a worker of its own: its id and address default to its (unique) hostname.
    for key in ("container_name", "ports", "hostname"):
        assert key not in worker, f"worker: {key} prevents `--scale worker=3`"
    assert args.worker_id is None and args.advertise_host is None and args.server_id is None
    assert not args.run_dir.startswith(WORKER_CHECKPOINTS), "each worker's own files stay its own"
    mechanism = parse_gavel(gavel_argv("mechanism"))
    assert args.gpus % mechanism.gpus_per_server == 0, "the mechanism refuses a worker of a partial server"
    # A type the throughput table knows, and a speed the worker accepts (it refuses others at start).
    from services.cli.common import load_table
    from services.cli.worker_options import parse_speed

    table = load_table(args.throughputs)
    assert args.accelerator_type in table.accelerator_types
    parse_speed(args.emulate_speed, args.accelerator_type, table)


def test_the_broker_healthcheck_checks_port_connectivity() -> None:
    test = service("rabbitmq")["healthcheck"]["test"]
    assert test[0] in ("CMD", "CMD-SHELL")
    argv = shlex.split(test[1]) if test[0] == "CMD-SHELL" else test[1:]
    # `rabbitmq-diagnostics ping` answers while the broker application is down (measured).
    assert argv == ["rabbitmq-diagnostics", "-q", "check_port_connectivity"]


@pytest.mark.parametrize("name", LONG_RUNNING)
def test_every_gavel_service_is_healthy_only_when_gavel_health_says_so(name: str) -> None:
    hc = service(name)["healthcheck"]
    assert not hc.get("disable")
    assert hc["test"][:3] == ["CMD", "gavel", "health"], hc["test"]
    args = parse_gavel(hc["test"][2:])
    assert args.command == "health"
    health_file = hc["test"][3]
    assert environment(name).get("GAVEL_HEALTH_FILE") == health_file
    for key in ("interval", "timeout", "retries", "start_period"):
        assert key in hc, f"{name}: healthcheck without {key}"
    assert seconds(hc["timeout"]) < seconds(hc["interval"])


def test_the_image_writes_health_where_compose_looks_and_may_write_there() -> None:
    env = dockerfile_env()
    health_dir = os.path.dirname(env["GAVEL_HEALTH_FILE"])
    assert all(environment(n)["GAVEL_HEALTH_FILE"] == env["GAVEL_HEALTH_FILE"] for n in GAVEL_SERVICES)
    assert re.search(rf"install -d -o gavel -g gavel [^\n]*{re.escape(health_dir)}", dockerfile_text())


@pytest.mark.parametrize("name", sorted(UP_SERVICES - {"rabbitmq"} | set(TRAINERS) | {"cli"}))
def test_every_gavel_service_waits_for_a_healthy_broker(name: str) -> None:
    depends = service(name)["depends_on"]
    assert isinstance(depends, dict), f"{name}: depends_on without conditions"
    assert depends["rabbitmq"]["condition"] == "service_healthy"
    for other, how in depends.items():
        assert how.get("condition") in ("service_started", "service_healthy", "service_completed_successfully"), other


@pytest.mark.parametrize("name", sorted(UP_SERVICES | set(TRAINERS) | MONITORING))
def test_every_long_running_service_restarts(name: str) -> None:
    assert service(name).get("restart") in ("always", "unless-stopped", "on-failure")
    assert service(name).get("healthcheck", {}).get("test"), f"{name}: no healthcheck"


def test_the_policy_service_can_be_scaled() -> None:
    policy = service("policy")
    # A fixed container name, host port or hostname would make a second replica fail or collide.
    for key in ("container_name", "ports", "hostname"):
        assert key not in policy, f"policy: {key} prevents `--scale policy=3`"
    assert "--replica" not in command("policy"), "one fixed replica name for every replica"


def test_the_mechanism_journal_is_on_a_named_volume() -> None:
    journal = environment("mechanism")["GAVEL_JOURNAL_PATH"]
    mounts = {m.split(":")[1]: m.split(":")[0] for m in service("mechanism")["volumes"]}
    volume = mounts.get(os.path.dirname(journal))
    assert volume, f"no volume at {os.path.dirname(journal)} for the journal {journal}"
    assert volume in compose()["volumes"], f"{volume} is not a named volume"
    assert journal == dockerfile_env()["GAVEL_JOURNAL_PATH"]


def test_the_estimator_state_is_on_a_named_volume_of_its_own() -> None:
    """What the estimator learned survives a re-created container (serve_cmd.open_estimator_state
    would otherwise keep it in the container's own $XDG_STATE_HOME, lost with it)."""
    state = parse_gavel(gavel_argv("estimator")).state
    assert state and os.path.isabs(state), "the estimator's state must be given a path on a volume (--state)"
    mounts = {m.split(":")[1]: m.split(":")[0] for m in service("estimator")["volumes"]}
    volume = mounts.get(os.path.dirname(state))
    assert volume in compose()["volumes"], f"no named volume at {os.path.dirname(state)} for the estimator's state {state}"
    others = {m.split(":")[0] for name in LONG_RUNNING if name != "estimator" for m in service(name).get("volumes", [])}
    assert volume not in others, f"{volume}: the estimator's state is its own"
    # the image's user owns the mount point, so a new volume is writable (Docker copies its ownership)
    assert re.search(rf"install -d -o gavel -g gavel [^\n]*{re.escape(os.path.dirname(state))}( |$)", dockerfile_text(), re.M)


def test_the_broker_loads_its_config_and_definitions_and_keeps_its_data() -> None:
    rabbit = service("rabbitmq")
    assert "management" in interpolate(rabbit["image"], env_example())
    mounts = {}
    for m in rabbit["volumes"]:
        source, target, *_ = interpolate(m, env_example()).split(":")
        mounts[target] = source
    assert mounts["/var/lib/rabbitmq"] in compose()["volumes"]
    assert mounts[rabbitmq_conf()["load_definitions"]] == "./rabbitmq/definitions.json"
    conf_target = next(t for t, s in mounts.items() if s == "./rabbitmq/rabbitmq.conf")
    assert conf_target.startswith("/etc/rabbitmq/")
    assert rabbit.get("hostname"), "the node's data directory is named after its hostname"
    env = rabbit.get("environment") or {}
    assert not any(k.startswith("RABBITMQ_DEFAULT_") for k in env), "no default (guest-like) user"


def test_stop_grace_outlasts_the_graceful_shutdown() -> None:
    shutdown_s = float(env_example()["GAVEL_SHUTDOWN_TIMEOUT_S"])
    for name in LONG_RUNNING:
        grace_s = shutdown_s
        if name == "worker":  # then each job gets --kill-grace-s to checkpoint and exit
            grace_s += parse_gavel(gavel_argv(name)).kill_grace_s
        assert seconds(service(name).get("stop_grace_period", "10s")) > grace_s, name


def test_env_example_defines_every_variable_the_compose_file_uses() -> None:
    missing = referenced_variables(COMPOSE.read_text()) - env_example().keys()
    assert not missing, f"add to deploy/.env.example: {sorted(missing)}"


def test_every_setting_the_services_read_is_wired() -> None:
    """Every GAVEL_* variable the settings know is given to the services by compose or the image."""
    names = set(re.findall(r'"(GAVEL_[A-Z0-9_]+)"', (ROOT / "common" / "config.py").read_text()))
    given = set(dockerfile_env())
    for name in GAVEL_SERVICES:
        given |= set(environment(name))
    assert not names - given, f"wire these into docker-compose.yml (and .env.example): {sorted(names - given)}"


@pytest.mark.parametrize("name", GAVEL_SERVICES)
def test_each_service_connects_as_its_own_user_with_only_its_own_secret(name: str) -> None:
    spec = SERVICES[name]
    raw_env = service(name)["environment"]
    raw_url = raw_env["GAVEL_AMQP_URL"]
    url = urllib.parse.urlparse(environment(name)["GAVEL_AMQP_URL"])
    assert url.scheme in ("amqp", "amqps")
    assert url.hostname == "rabbitmq"
    assert url.path == f"/{VHOST}", "the vhost is the URL's path"
    assert url.username == spec.user
    assert referenced_variables(raw_url) == {spec.password_var}
    others = set(PASSWORD_VARS.values()) - {spec.password_var}
    assert not referenced_variables(json.dumps(service(name))) & others, f"{name} sees another service's password"
    assert environment(name)["GAVEL_BUS"] == "amqp"
    assert environment(name)["GAVEL_EXCHANGE"] == EXCHANGE
    assert environment(name)["GAVEL_LOG_FORMAT"] == "json"


def test_the_broker_and_the_codec_agree_on_the_largest_message() -> None:
    broker = int(rabbitmq_conf()["max_message_size"])
    assert int(env_example()["GAVEL_MAX_MESSAGE_BYTES"]) == broker
    for name in GAVEL_SERVICES:
        assert int(environment(name)["GAVEL_MAX_MESSAGE_BYTES"]) == broker, name


def test_the_broker_loads_the_definitions_at_boot() -> None:
    assert rabbitmq_conf()["load_definitions"] == "/etc/rabbitmq/definitions.json"


# -- definitions.json: users, vhost, topology ------------------------------------------------------


def test_one_vhost_and_no_guest() -> None:
    d = definitions()
    assert [v["name"] for v in d["vhosts"]] == [VHOST]
    users = {u["name"] for u in d["users"]}
    assert "guest" not in users
    assert users == set(PASSWORD_VARS)
    for section in ("permissions", "topic_permissions", "queues", "exchanges", "bindings", "policies"):
        assert all(item["vhost"] == VHOST for item in d.get(section, [])), section
    assert all(p["user"] != "guest" for p in d["permissions"] + d["topic_permissions"])


def test_only_the_admin_is_an_administrator() -> None:
    for user in definitions()["users"]:
        assert ("administrator" in user["tags"]) == (user["name"] == ADMIN_USER), user["name"]


def test_the_topology_is_the_one_the_bus_declares() -> None:
    """Same names and arguments as RabbitBus declares, so a service's declaration is accepted."""
    from common.config import BusSettings
    from common.transport.rabbit import RabbitBus

    bus = RabbitBus(BusSettings(kind="amqp", exchange=EXCHANGE))
    assert (bus.exchange_name, bus.dlx_name, bus.dead_letter_queue) == (EXCHANGE, DLX, DEAD_LETTERS)
    d = definitions()
    exchanges = {e["name"]: e for e in d["exchanges"]}
    for name in (EXCHANGE, DLX):
        e = exchanges[name]
        declared = (e["type"], e["durable"], e["auto_delete"], e["internal"], e["arguments"])
        assert declared == ("topic", True, False, False, {}), name
    queues = {q["name"]: q for q in d["queues"]}
    assert (queues[DEAD_LETTERS]["durable"], queues[DEAD_LETTERS]["arguments"]) == (True, {})
    bindings = {(b["source"], b["destination"], b["routing_key"]) for b in d["bindings"]}
    assert (DLX, DEAD_LETTERS, "#") in bindings
    from common.topology import SUBMISSION_QUEUES

    submission_queues = {bus.queue_name(q.name) for q in SUBMISSION_QUEUES}
    assert "gavel.mechanism.submissions" in submission_queues
    assert set(queues) == {DEAD_LETTERS} | submission_queues, "other queues belong to their services"


def test_the_definitions_declare_every_submission_queue_with_exactly_its_bindings() -> None:
    """Every queue of common.topology.SUBMISSION_QUEUES, as its consumer and `gavel submit` declare
    it (durable, the same dead-letter exchange, the same bindings and no other), so that a
    submission published before that consumer ever ran waits in its queue."""
    from common.config import BusSettings
    from common.topology import SUBMISSION_QUEUES
    from common.transport.rabbit import RabbitBus

    bus = RabbitBus(BusSettings(kind="amqp", exchange=EXCHANGE))
    d = definitions()
    queues = {q["name"]: q for q in d["queues"]}
    for topology_queue in SUBMISSION_QUEUES:
        name = bus.queue_name(topology_queue.name)
        assert name in queues, f"definitions.json does not declare {name} ({topology_queue.consumer}'s)"
        q = queues[name]
        # the bus's own arguments: the dead-letter exchange, and the default bound where there is one
        arguments = bus.queue_arguments(topology_queue.name)
        assert arguments["x-dead-letter-exchange"] == DLX
        assert (q["durable"], q["auto_delete"], q["arguments"]) == (True, False, arguments), name
        declared = sorted(
            (b["source"], b["destination_type"], b["routing_key"], json.dumps(b["arguments"]))
            for b in d["bindings"] if b["destination"] == name
        )
        assert declared == sorted((EXCHANGE, "queue", k, "{}") for k in topology_queue.bindings), name
        # and its consumer's user is the one that may consume it, with these bindings
        spec = SERVICES[topology_queue.consumer]
        assert name in spec.queues and set(topology_queue.bindings) <= set(spec.bindings), topology_queue.consumer


def test_the_dead_letter_cap_touches_only_the_dead_letter_queue() -> None:
    for policy in definitions()["policies"]:
        assert policy["apply-to"] == "queues"
        every_queue = [q for spec in SERVICES.values() for q in spec.queues] + [DEAD_LETTERS]
        assert [q for q in every_queue if rabbit_matches(policy["pattern"], q)] == [DEAD_LETTERS]


# -- definitions.json: permissions, as RabbitMQ evaluates them -------------------------------------


def rabbit_matches(pattern: str, name: str, user: str = "", vhost: str = VHOST) -> bool:
    """RabbitMQ's test: an unanchored regex search; the empty pattern means "^$" (nothing);
    topic patterns may name {username} and {vhost}."""
    if pattern == "":
        pattern = "^$"
    pattern = pattern.replace("{username}", re.escape(user)).replace("{vhost}", re.escape(vhost))
    return re.search(pattern, name) is not None


def permissions_of(user: str) -> dict[str, str]:
    found = [p for p in definitions()["permissions"] if p["user"] == user and p["vhost"] == VHOST]
    assert len(found) == 1, f"{user}: {len(found)} permission entries on vhost {VHOST}"
    return found[0]


def topic_permissions_of(user: str) -> dict[str, str] | None:
    found = [t for t in definitions()["topic_permissions"] if t["user"] == user and t["exchange"] == EXCHANGE]
    assert len(found) <= 1
    return found[0] if found else None


def needs(spec: ServiceSpec) -> set[tuple[str, str]]:
    """(permission, resource) pairs the service's operations need (RabbitMQ access-control guide,
    AMQP 0-9-1 table)."""
    need = {
        # exchange.declare x2, queue.declare of the dead-letter queue (passive=false)
        ("configure", EXCHANGE), ("configure", DLX), ("configure", DEAD_LETTERS),
        # queue.bind of the dead-letter queue to the DLX: write on the queue, read on the exchange
        ("write", DEAD_LETTERS), ("read", DLX),
        # basic.publish to the exchange, and of failed deliveries to the DLX
        ("write", EXCHANGE), ("write", DLX),
    }  # fmt: skip
    for q in spec.queues:
        # queue.declare with a DLX: configure and read on the queue, write on the DLX;
        # queue.bind: write on the queue, read on the exchange; basic.consume: read on the queue
        need |= {("configure", q), ("read", q), ("write", DLX), ("write", q), ("read", EXCHANGE)}
    need |= {("read", q) for q in spec.gets}
    need |= {("configure", q) for q in spec.claims}  # queue.declare, exclusive, no arguments, never bound
    return need


def other_services_queues(name: str) -> set[str]:
    mine = set(SERVICES[name].queues) | set(SERVICES[name].gets)
    return {q for other, spec in SERVICES.items() if other != name for q in spec.queues} - mine


@pytest.mark.parametrize("name", GAVEL_SERVICES)
def test_each_user_may_do_what_its_service_does(name: str) -> None:
    spec = SERVICES[name]
    perms = permissions_of(spec.user)
    missing = sorted((perm, res) for perm, res in needs(spec) if not rabbit_matches(perms[perm], res))
    assert not missing, f"{spec.user} lacks {missing}"


@pytest.mark.parametrize("name", GAVEL_SERVICES)
def test_no_user_may_touch_another_services_queues(name: str) -> None:
    spec = SERVICES[name]
    perms = permissions_of(spec.user)
    granted = sorted(
        (perm, q)
        for q in other_services_queues(name)
        for perm in ("configure", "write", "read")
        if rabbit_matches(perms[perm], q)
    )
    assert not granted, f"{spec.user} may {granted}"


@pytest.mark.parametrize("name", sorted(set(GAVEL_SERVICES) - {"cli"}))
def test_only_the_cli_reads_dead_letters(name: str) -> None:
    assert not rabbit_matches(permissions_of(SERVICES[name].user)["read"], DEAD_LETTERS)


def test_the_cli_needs_no_permission_on_the_submission_queues() -> None:
    """A passive declaration needs none; a full one would need configure (which allows deleting
    the queue) and read (which allows consuming other people's submissions)."""
    from common.topology import SUBMISSION_QUEUES

    perms = permissions_of("gavel-cli")
    for queue in SUBMISSION_QUEUES:
        for perm in ("configure", "write", "read"):
            assert not rabbit_matches(perms[perm], f"{EXCHANGE}.{queue.name}"), (queue.name, perm)


@pytest.mark.parametrize("name", GAVEL_SERVICES)
def test_each_user_may_publish_and_bind_its_own_routing_keys(name: str) -> None:
    spec = SERVICES[name]
    topic = topic_permissions_of(spec.user)
    assert topic is not None, f"{spec.user}: no topic permissions on {EXCHANGE} (it could publish anything)"
    refused_pub = [k for k in spec.publishes if not rabbit_matches(topic["write"], k, spec.user)]
    refused_bind = [k for k in spec.bindings if not rabbit_matches(topic["read"], k, spec.user)]
    assert not refused_pub and not refused_bind, f"{spec.user}: publish {refused_pub}, bind {refused_bind}"


@pytest.mark.parametrize("name", GAVEL_SERVICES)
def test_no_user_may_publish_another_services_messages(name: str) -> None:
    spec = SERVICES[name]
    topic = topic_permissions_of(spec.user)
    assert topic is not None
    theirs = {k for other, s in SERVICES.items() if other != name for k in s.publishes}
    if name == "mechanism":
        # worker.cmd.<id>.* is the mechanism's to command workers with, the workers' gang rendezvous
        # included: it may run any command on a worker anyway, so a rendezvous gives it nothing more.
        theirs = {k for k in theirs if not k.startswith("worker.cmd.")}
    forged = sorted(k for k in theirs - set(spec.publishes) if rabbit_matches(topic["write"], k, spec.user))
    assert not forged, f"{spec.user} may publish {forged}"


@pytest.mark.parametrize("name", GAVEL_SERVICES)
def test_no_user_may_bind_to_all_traffic(name: str) -> None:
    spec = SERVICES[name]
    topic = topic_permissions_of(spec.user)
    assert topic is not None
    for key in ("#", "*.#", "#.#", "*.*", "worker.#", "allocation.#"):
        assert not rabbit_matches(topic["read"], key, spec.user), f"{spec.user} may bind {key!r}"
    if name != "mechanism":
        # Commands for workers: only the fleet and the workers, per worker (no wildcard worker id).
        for key in ("worker.cmd.#", "worker.cmd.*.*", "worker.cmd.*.run"):
            assert not rabbit_matches(topic["read"], key, spec.user), f"{spec.user} may bind {key!r}"


def test_the_worker_user_has_exactly_least_privilege() -> None:
    """Every real worker connects as gavel-worker: its own queues gavel.worker.<id> (configure,
    write, read), the claim on its id gavel.claim.worker.<id> (configure: an exclusive queue,
    never bound or consumed), the exchanges and the dead-letter queue every service declares at
    start, none of the mechanism's queues; it publishes only registrations, heartbeats, progress,
    gang rendezvous, a refused claim (worker.id_in_use) and its answers to `gavel logs`, and binds
    only per-worker commands, round starts and `gavel logs`'s question. (One user for every worker:
    a worker could bind another worker's commands. A multi-tenant cluster gives each worker a user
    of its own, pinned to its worker id: docs/deploy.md, section 5.)"""
    assert permissions_of("gavel-worker") == {
        "user": "gavel-worker",
        "vhost": VHOST,
        "configure": r"^(gavel|gavel\.dlx|gavel\.dead-letters|gavel\.worker\..+|gavel\.claim\.worker\..+)$",
        "write": r"^(gavel|gavel\.dlx|gavel\.dead-letters|gavel\.worker\..+)$",
        "read": r"^(gavel|gavel\.dlx|gavel\.worker\..+)$",
    }
    assert topic_permissions_of("gavel-worker") == {
        "user": "gavel-worker",
        "vhost": VHOST,
        "exchange": EXCHANGE,
        "write": r"^(worker\.(registered|heartbeat|id_in_use)|job\.progress|worker\.cmd\.[^.*#]+\.rendezvous|logs\.reply\.[^.]+)$",
        "read": r"^(worker\.cmd\.[^.*#]+\.[^.]+|round\.started|logs\.requested)$",
    }
    perms, topic = permissions_of("gavel-worker"), topic_permissions_of("gavel-worker")
    for queue in ("gavel.mechanism.submissions", "gavel.mechanism.progress", "gavel.mechanism.workers", DEAD_LETTERS):
        assert not rabbit_matches(perms["read"], queue), queue
    for forged in (
        "worker.cmd.v1-1.run", "worker.cmd.v1-1.kill", "worker.cmd.v1-1.fenced", "job.completed", "round.started",
        "status.reply.3f9a1c2b7d4e", "logs.requested",
    ):
        assert not rabbit_matches(topic["write"], forged), forged
    assert not any(rabbit_matches(topic["read"], k) for k in ("job.progress", "job.submitted", "round.*", "worker.heartbeat"))


def test_the_admin_may_do_anything_in_the_vhost() -> None:
    perms = permissions_of(ADMIN_USER)
    assert all(rabbit_matches(perms[p], "anything.at-all") for p in ("configure", "write", "read"))


def test_permission_matching_follows_rabbitmq() -> None:
    assert not rabbit_matches("", "gavel")  # "" is "^$": nothing
    assert rabbit_matches("gavel", "xgavelx")  # unanchored
    assert not rabbit_matches(r"^gavel$", "gavel.dlx")
    assert rabbit_matches(r"^{username}\.", "gavel-cli.x", user="gavel-cli")


# -- passwords -------------------------------------------------------------------------------------


def rabbit_sha256(password: str, salt: bytes) -> str:
    """rabbit_password_hashing_sha256: base64(salt + sha256(salt + utf-8 password)), 4-byte salt."""
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode("utf-8")).digest()).decode()


def test_the_hash_function_is_rabbitmqs() -> None:
    # The worked example of RabbitMQ's "Credentials and Passwords" guide.
    assert rabbit_sha256("test12", bytes.fromhex("908DC60A")) == "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR"


@pytest.mark.parametrize("user", sorted(PASSWORD_VARS))
def test_the_password_hashes_are_those_of_the_example_passwords(user: str) -> None:
    record = next(u for u in definitions()["users"] if u["name"] == user)
    assert record["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    stored = base64.b64decode(record["password_hash"])
    assert len(stored) == 4 + 32
    password = env_example()[PASSWORD_VARS[user]]
    assert rabbit_sha256(password, stored[:4]) == record["password_hash"], (
        f"{user}: the hash in definitions.json is not that of {PASSWORD_VARS[user]} in .env.example"
    )


def test_example_passwords_are_url_safe_placeholders() -> None:
    for var in PASSWORD_VARS.values():
        password = env_example()[var]
        assert re.fullmatch(r"[A-Za-z0-9._-]+", password), f"{var}: would need escaping in an amqp:// URL"
        assert "change-me" in password, f"{var}: the example password must say it is one"
    assert len({env_example()[v] for v in PASSWORD_VARS.values()}) == len(PASSWORD_VARS), "one password per user"


# -- the image -------------------------------------------------------------------------------------


@cache
def dockerfile_text() -> str:
    return DOCKERFILE.read_text()


@cache
def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    lines = [ln for ln in dockerfile_text().splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile_instructions()
    last_from = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    return instructions[last_from:]


@cache
def dockerfile_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for word, rest in final_stage():
        if word == "ENV":
            for name, value in re.findall(r"([A-Z_][A-Z0-9_]*)=(\S+)", rest):
                env[name] = value
    return env


def build_args() -> dict[str, str]:
    return {m.group(1): m.group(2).strip('"') for m in re.finditer(r"^ARG (\w+)=(.*)$", dockerfile_text(), re.M)}


def test_the_image_is_python_311_slim() -> None:
    assert build_args()["PYTHON_IMAGE"] == "python:3.11-slim"
    froms = [rest for word, rest in dockerfile_instructions() if word == "FROM"]
    assert froms and all(f.startswith("${PYTHON_IMAGE}") for f in froms)


def test_the_image_installs_the_amqp_extra_and_no_torch_by_default() -> None:
    assert build_args()["GAVEL_EXTRAS"] == "amqp"
    assert "download.pytorch.org" in build_args()["TORCH_INDEX_URL"]


def test_dependencies_are_a_layer_of_their_own() -> None:
    """pyproject.toml is copied and the dependencies installed before any source is copied."""
    instructions = dockerfile_instructions()
    copies = [(i, rest) for i, (word, rest) in enumerate(instructions) if word == "COPY" and "--from" not in rest]
    first_pyproject = next(i for i, rest in copies if rest.startswith("pyproject.toml"))
    first_source = next(i for i, rest in copies if not rest.startswith("pyproject.toml"))
    assert first_pyproject < first_source
    assert any(w == "RUN" and "pip install" in r for w, r in instructions[first_pyproject:first_source])


def test_the_image_copies_every_package_it_installs() -> None:
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    copied = {rest.split()[0] for word, rest in dockerfile_instructions() if word == "COPY" and "--from" not in rest}
    assert {p.rstrip("*") for p in include} <= copied
    assert "README.md" in copied, "pyproject.toml names README.md as the long description"


def test_the_image_runs_gavel_as_a_non_root_user() -> None:
    stage = final_stage()
    users = [rest for word, rest in stage if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    entrypoints = [rest for word, rest in stage if word == "ENTRYPOINT"]
    assert entrypoints and json.loads(entrypoints[-1]) == ["gavel"]


def test_the_build_context_leaves_secrets_out_and_sources_in() -> None:
    patterns = [ln.strip() for ln in DOCKERIGNORE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    excluded = [p.rstrip("/") for p in patterns if not p.startswith("!")]
    assert "**/.env" in excluded, "deploy/.env (the secrets) must stay out of the build context"
    copied = {rest.split()[0] for word, rest in dockerfile_instructions() if word == "COPY" and "--from" not in rest}
    for source in copied:
        dropped = [p for p in excluded if fnmatch.fnmatch(source, p) or fnmatch.fnmatch(source, p.removeprefix("**/"))]
        assert not dropped, f".dockerignore {dropped} drops {source}, which the Dockerfile copies"


# -- docs/deploy.md --------------------------------------------------------------------------------


_RUN_OPTIONS_WITH_VALUE = ("-v", "--volume", "-e", "--env", "-w", "--workdir", "-u", "--user", "--name", "--entrypoint")


def doc_commands() -> Iterator[list[str]]:
    """The gavel commands in deploy.md's shell blocks: `gavel ...`, `docker compose run ... cli ...`
    and `docker compose exec SERVICE gavel ...`."""
    text = DEPLOY_DOC.read_text()
    for block in re.findall(r"```(?:sh|bash|console)\n(.*?)```", text, re.S):
        for raw in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = raw.split(" #", 1)[0].strip()
            line = re.sub(r"^(\w+=\S+\s+)+", "", line)  # VAR=value gavel ...
            if line.split()[:1] not in (["gavel"], ["docker"]):
                continue  # heredoc bodies, other tools
            words = shlex.split(line)
            if words[:1] == ["gavel"]:
                yield words[1:]
            elif words[:3] == ["docker", "compose", "run"]:
                rest = words[3:]
                while rest and rest[0].startswith("-"):  # options of `run` itself
                    rest = rest[2:] if rest[0] in _RUN_OPTIONS_WITH_VALUE else rest[1:]
                if rest[:1] == ["cli"]:
                    yield rest[1:]
            elif words[:3] == ["docker", "compose", "exec"] and "gavel" in words:
                yield words[words.index("gavel") + 1 :]


def guide_services() -> dict[str, tuple[str, str]]:
    """deploy.md's table of services: service (its first cell's first word) -> (its command cell,
    its broker user cell)."""
    rows = {}
    for line in DEPLOY_DOC.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[1].startswith("`gavel "):
            rows[cells[0].split()[0].lower()] = (cells[1], cells[3])
    return rows


def test_the_deploy_guide_says_what_each_service_runs_and_as_whom() -> None:
    """The guide's table of services says what compose runs: each service's `gavel` command (a
    `gavel serve` one's first words are its container's) and the broker user it connects as; its
    shell blocks show gavel commands (each parsed by the test below)."""
    table = guide_services()
    assert set(table) == set(GAVEL_SERVICES), f"docs/deploy.md's table of services has rows for {sorted(table)}"
    for name in GAVEL_SERVICES:
        shown, user = table[name]
        assert user == f"`{SERVICES[name].user}`", (name, user)
        runs = ["gavel", *command(name)[: 2 if name in LONG_RUNNING else 1]]
        assert f"`{' '.join(runs)}" in shown, f"{name}: the table shows {shown}, its container runs {' '.join(runs)} ..."
    assert list(doc_commands()), "docs/deploy.md shows no gavel command in a shell block"


def test_the_deploy_guide_shows_the_permissions_that_are_granted() -> None:
    text = DEPLOY_DOC.read_text().replace("\\|", "|")
    shown = [t[op] for t in definitions()["topic_permissions"] for op in ("write", "read")]
    policy = permissions_of("gavel-policy")
    shown += [policy["configure"], policy["read"]]
    missing = [regex for regex in shown if f"`{regex}`" not in text]
    assert not missing, f"docs/deploy.md, section 5, shows other regexes than definitions.json: {missing}"


def test_every_gavel_command_in_the_deploy_guide_parses() -> None:
    refused = []
    for argv in doc_commands():
        try:
            parse_gavel(argv)
        except AssertionError as e:
            refused.append(str(e))
    assert not refused, "\n".join(refused)


# -- on a real broker: the definitions, imported, allow and refuse what they should ---------------


def _rabbitmqctl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["rabbitmqctl", "-q", *args], input=stdin, capture_output=True, text=True, timeout=60)


# The vhosts this module's broker tests use, each definitions.json imported under a name of its
# own, all in one import (below): variant -> how its definitions differ from the file's.
# ``queues=False``: without the queues the file declares (and their bindings), as users made by
# hand with rabbitmqctl have them (docs/deploy.md section 2); ``without``: without these queues
# (and their bindings), as definitions from before they were added have them.
VARIANTS: Mapping[str, Mapping[str, Any]] = {
    "probe": {},  # the users' operations probed, allowed and refused (leaves messages behind)
    "services": {},  # compose's services as processes: nothing else publishes there
    "before-estimator": {"without": (f"{EXCHANGE}.{ESTIMATOR_INPUTS.name}",)},
    "by-hand": {"queues": False},
}
ACTING_USER = "gavel-deploy-test"  # who the broker's log says removed the test's vhosts and users
VHOST_SECTIONS = ("permissions", "topic_permissions", "parameters", "policies", "exchanges", "queues", "bindings")


def _variant(
    d: dict[str, Any], vhost: str, users: Mapping[str, str], *, queues: bool = True, without: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The vhost-scoped sections of definitions ``d`` under ``vhost`` and the ``users``' names."""
    d = copy.deepcopy(d)
    if not queues:
        d["queues"] = [q for q in d["queues"] if q["name"] == DEAD_LETTERS]
        d["bindings"] = [b for b in d["bindings"] if b["destination"] == DEAD_LETTERS]
    d["queues"] = [q for q in d["queues"] if q["name"] not in without]
    d["bindings"] = [b for b in d["bindings"] if b["destination"] not in without]
    for section in VHOST_SECTIONS:
        for item in d.get(section, []):
            item["vhost"] = vhost
            if "user" in item:
                item["user"] = users[item["user"]]
    return {section: d.get(section, []) for section in VHOST_SECTIONS}


@contextlib.contextmanager
def _imported_definitions(
    broker_url: str, variants: Mapping[str, Mapping[str, Any]]
) -> Iterator[dict[str, dict[str, str]]]:
    """definitions.json imported into the local test broker, under a unique vhost for each of
    ``variants`` (VARIANTS' options) and one set of unique user names (users are broker-wide),
    granted on each vhost what the file grants; removed afterwards. Yields variant -> service name
    -> its AMQP URL. One rabbitmqctl call imports them all and one removes them: each call costs
    ~1.5 s of wall time and ~0.6 s of CPU (an Erlang VM's start), and a call per vhost and per
    user (delete_vhost, delete_user) was ~40 calls a module run."""
    host = urllib.parse.urlparse(broker_url)
    # Under `make test`/CI this broker is local (scripts/ensure-broker), so these fail rather
    # than skip; a developer pointing GAVEL_AMQP_URL at a remote broker gets a skip with the reason.
    local = host.hostname in ("127.0.0.1", "localhost", "::1")
    if shutil.which("rabbitmqctl") is None or not local:
        _unavailable("importing definitions needs rabbitmqctl and the test broker on this host", local)
    suffix = uuid.uuid4().hex[:8]
    d = definitions()
    users = {u["name"]: f"{u['name']}-{suffix}" for u in d["users"]}
    vhosts = {variant: f"gavel-deploy-test-{variant}-{suffix}" for variant in variants}
    combined: dict[str, Any] = {k: v for k, v in copy.deepcopy(d).items() if k not in VHOST_SECTIONS}
    combined["users"] = [{**u, "name": users[u["name"]]} for u in combined["users"]]
    combined["vhosts"] = [{"name": vhost} for vhost in vhosts.values()]
    for section in VHOST_SECTIONS:
        combined[section] = []
    for variant, options in variants.items():
        for section, items in _variant(d, vhosts[variant], users, **options).items():
            combined[section] += items
    result = _rabbitmqctl("import_definitions", "--format", "json", stdin=json.dumps(combined))
    if result.returncode != 0 and _rabbitmqctl("status").returncode != 0:
        _unavailable("rabbitmqctl cannot reach the local broker node", local)
    try:
        assert result.returncode == 0, result.stderr
        where = f"{host.hostname}:{host.port or 5672}"
        yield {
            variant: {
                name: f"amqp://{users[spec.user]}:{env_example()[spec.password_var]}@{where}/{vhost}"
                for name, spec in SERVICES.items()
            }
            for variant, vhost in vhosts.items()
        }
    finally:
        _remove(list(vhosts.values()), list(users.values()))


def _unavailable(reason: str, local: bool) -> None:
    if broker_required() and local:
        pytest.fail(reason)
    pytest.skip(reason)


def _remove(vhosts: list[str], users: list[str]) -> None:
    """The vhosts and users, in one call (rabbitmqctl eval, the functions delete_vhost and
    delete_user call); if that fails (another broker version, one already gone), one call each."""

    def erlang(names: list[str]) -> str:
        return ", ".join(f'<<"{name}">>' for name in names)

    acting = f'<<"{ACTING_USER}">>'
    removed = _rabbitmqctl(
        "eval",
        f"[rabbit_vhost:delete(V, {acting}) || V <- [{erlang(vhosts)}]] ++ "
        f"[rabbit_auth_backend_internal:delete_user(U, {acting}) || U <- [{erlang(users)}]].",
    )
    if removed.returncode == 0 and removed.stdout.strip() == f"[{','.join(['ok'] * (len(vhosts) + len(users)))}]":
        return
    for vhost in vhosts:
        _rabbitmqctl("delete_vhost", vhost)
    for user in users:
        _rabbitmqctl("delete_user", user)


@pytest.fixture(scope="module")
def imported(broker_url: str) -> Iterator[dict[str, dict[str, str]]]:
    """Every variant of the definitions on the test broker (VARIANTS), once a module."""
    with _imported_definitions(broker_url, VARIANTS) as urls:
        yield urls


@pytest.fixture(scope="module")
def deployed(imported: dict[str, dict[str, str]]) -> dict[str, str]:
    """The definitions on the test broker, for probing permissions (leaves messages behind)."""
    return imported["probe"]


def _bus(url: str, name: str) -> Any:
    from common.config import BusSettings
    from common.transport.rabbit import RabbitBus

    settings = BusSettings(kind="amqp", amqp_url=url, exchange=EXCHANGE, confirm_timeout_s=10)
    return RabbitBus(settings, source=f"deploy-test-{name}")


def _feeder(name: str) -> tuple[str, str]:
    """Another service that publishes to one of ``name``'s bindings: (that service, the key)."""
    for other, spec in SERVICES.items():
        for key in spec.publishes:
            if other != name and any(topic_matches(b, key) for b in SERVICES[name].bindings):
                return other, key
    raise AssertionError(f"no service publishes what {name} is bound to")


@pytest.mark.slow  # ~1-1.5 s importing the definitions (once a module, every variant), then 0.1-0.3 s a service
@pytest.mark.parametrize("name", GAVEL_SERVICES)
def test_each_user_can_do_its_services_work_on_the_broker(name: str, deployed: dict[str, str]) -> None:
    """The service's own bus operations (RabbitBus), as its user: start, subscribe to its queues,
    publish its routing keys, dead-letter what it cannot decode (a body another service's user
    sends it: its letter reaches the dead-letter queue with the reason this user gave, not the
    broker's rejection), take dead letters (the CLI)."""
    spec = SERVICES[name]
    feeder_name, key = _feeder(name)
    body = f"deploy-test {name} {uuid.uuid4().hex}".encode()  # not msgpack: undecodable

    async def work() -> list[Any]:
        bus, feeder = _bus(deployed[name], name), _bus(deployed[feeder_name], f"{feeder_name}-feeder")
        reader = bus if spec.gets else _bus(deployed["cli"], "cli-reader")  # only the CLI reads dead letters
        letters: list[Any] = []
        await bus.start()
        try:
            for queue in spec.queues:
                async def ignore(delivery: Any) -> None:
                    pass

                name_on_bus = queue.removeprefix(f"{EXCHANGE}.")
                await bus.subscribe(name_on_bus, list(spec.bindings), ignore, durable=not spec.exclusive)
            for routing_key in spec.publishes:
                await bus.publish_raw(routing_key, b"deploy-test", mandatory=False)
            await feeder.start()
            if reader is not bus:
                await reader.start()
            await feeder.publish_raw(key, body, mandatory=False)

            async def dead_lettered() -> bool:
                letters.extend(letter for letter in await reader.take_dead_letters(limit=1000) if letter.body == body)
                return len(letters) >= len(spec.queues)  # a copy from each of its queues (all bound alike)

            await until(dead_lettered, timeout_s=30, poll_s=0.1)
        finally:
            for each in {id(b): b for b in (bus, feeder, reader)}.values():
                await each.close()
        return letters

    letters = asyncio.run(work())
    assert {letter.queue for letter in letters} == {q.removeprefix(f"{EXCHANGE}.") for q in spec.queues}, letters
    assert all(letter.routing_key == key and letter.reason.startswith("undecodable: ") for letter in letters), letters


def test_the_cli_can_make_sure_the_submission_queues_exist(deployed: dict[str, str]) -> None:
    """`gavel submit` makes sure the mechanism's and the estimator's queues exist before
    publishing. definitions.json creates them, and the CLI has no permission on them: a passive
    declaration (no permission needed) must come first, and a full one only where a queue is
    missing (a broker without these definitions, where the CLI has the permissions)."""
    from common.topology import SUBMISSION_QUEUES

    async def declare() -> None:
        bus = _bus(deployed["cli"], "cli")
        await bus.start()
        try:
            for queue in SUBMISSION_QUEUES:
                await bus.declare(queue.name, list(queue.bindings))
        finally:
            await bus.close()

    asyncio.run(declare())


def gavel_as_cli_user(urls: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    """`gavel ARGV` as a process logged in as the definitions' CLI user (no other GAVEL_*
    settings): these tests check the whole stderr a user's process prints."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAVEL_")}
    env.update(GAVEL_AMQP_URL=urls["cli"], GAVEL_EXCHANGE=EXCHANGE)
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *argv], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )


def test_without_the_estimators_queue_the_cli_user_warns_once_and_submits(imported: dict[str, dict[str, str]]) -> None:
    """Definitions from before the estimator's queue (the mechanism's is there), no estimator ever
    started: the CLI user may not create the estimator's queue. `gavel submit` says in one line that
    the estimator will not see these jobs, and what to do, and publishes them all the same (the
    refusal must not cost it the channel it publishes on); `gavel cancel`, which the estimator's
    queue would not receive, says nothing about it."""
    import aio_pika

    from common.topology import MECHANISM_SUBMISSIONS

    estimator_queue = f"{EXCHANGE}.{ESTIMATOR_INPUTS.name}"
    assert VARIANTS["before-estimator"] == {"without": (estimator_queue,)}
    urls = imported["before-estimator"]

    def gavel(*argv: str) -> subprocess.CompletedProcess[str]:
        return gavel_as_cli_user(urls, *argv)

    out = gavel("submit", "--job-type", "A3C", "--steps", "100", "--job-id", "early", "--no-wait")
    assert out.returncode == 0 and out.stdout.strip() == "early", out.stderr
    user = urllib.parse.urlparse(urls["cli"]).username
    assert out.stderr.strip().splitlines() == [
        f"gavel: warning: the estimator will not see these jobs until its queue exists: queue {estimator_queue!r} does "
        f"not exist and user {user!r} may not create it; start `gavel serve estimator` once, or load "
        "deploy/rabbitmq/definitions.json into the broker (docs/deploy.md)"
    ], out.stderr
    cancel = gavel("cancel", "early", "--timeout-s", "0.5")
    assert cancel.returncode == 1 and cancel.stderr.strip().splitlines() == [
        "gavel: no answer from the mechanism within 0.5 s (is it running?); the cancel waits in its queue and "
        "applies when it runs"
    ], cancel.stderr

    async def waiting() -> dict[str, int | None]:
        """Messages in each queue (a passive declaration: no permission needed), None: no queue."""
        connection = await aio_pika.connect(urls["cli"])
        counts: dict[str, int | None] = {}
        try:
            for name in (f"{EXCHANGE}.{MECHANISM_SUBMISSIONS.name}", estimator_queue):
                channel = await connection.channel()
                try:
                    declared = await channel.declare_queue(name, passive=True)
                    counts[name] = declared.declaration_result.message_count
                except aio_pika.exceptions.ChannelNotFoundEntity:
                    counts[name] = None
        finally:
            await connection.close()
        return counts

    # the submission, its seal and the cancel wait for the mechanism
    assert asyncio.run(waiting()) == {f"{EXCHANGE}.{MECHANISM_SUBMISSIONS.name}": 3, estimator_queue: None}


def test_the_cli_user_says_in_one_line_that_the_mechanism_never_ran(imported: dict[str, dict[str, str]]) -> None:
    """Users made by hand (no submissions queue) and a mechanism never started: the CLI user may
    not create the mechanism's queue, and `gavel submit` / `gavel cancel` say so and what to do,
    instead of ~60 lines of ChannelAccessRefused (issue 9)."""
    urls = imported["by-hand"]
    for argv in (("submit", "--job-type", "A3C", "--steps", "100"), ("cancel", "x")):
        out = gavel_as_cli_user(urls, *argv)
        assert out.returncode == 1, out.stderr
        user = urllib.parse.urlparse(urls["cli"]).username
        assert out.stderr.strip().splitlines() == [
            f"gavel: the mechanism has never run here: queue 'gavel.mechanism.submissions' does not exist and "
            f"user {user!r} may not create it; start it once (`gavel serve mechanism` declares its queues), or "
            "load deploy/rabbitmq/definitions.json into the broker (docs/deploy.md)"
        ], out.stderr


@pytest.mark.slow  # ~0.5 s, with the definitions' import (~1-1.5 s) it shares
def test_the_broker_refuses_what_the_definitions_refuse(deployed: dict[str, str]) -> None:
    import aio_pika
    import aiormq

    dlx_args = {"x-dead-letter-exchange": DLX}

    async def attempt(service_name: str, operation: Any) -> str:
        connection = await aio_pika.connect(deployed[service_name])
        try:
            channel = await connection.channel(publisher_confirms=True)
            try:
                await operation(channel)
            except aiormq.exceptions.ChannelAccessRefused:
                return "refused"
            return "ok"
        finally:
            await connection.close()

    def subscribe(queue: str, bindings: tuple[str, ...], exclusive: bool = False) -> Any:
        async def op(ch: Any) -> None:  # what RabbitBus.subscribe() does
            q = await ch.declare_queue(
                queue, durable=not exclusive, exclusive=exclusive, auto_delete=exclusive, arguments=dlx_args
            )
            exchange = await ch.get_exchange(EXCHANGE, ensure=False)
            for binding in bindings:
                await q.bind(exchange, binding)
            async def ignore(message: object) -> None:  # a coroutine: aio-pika deprecates plain functions
                return None

            tag = await q.consume(ignore)
            await q.cancel(tag)

        return op

    def publish(routing_key: str) -> Any:
        async def op(ch: Any) -> None:
            exchange = await ch.get_exchange(EXCHANGE, ensure=False)
            await exchange.publish(aio_pika.Message(b"deploy-test"), routing_key, mandatory=False)

        return op

    def get(queue: str) -> Any:
        async def op(ch: Any) -> None:
            q = await ch.get_queue(queue, ensure=False)
            await q.get(no_ack=False, fail=False)

        return op

    def delete(queue: str) -> Any:
        async def op(ch: Any) -> None:
            await ch.queue_delete(queue)

        return op

    def passive(queue: str) -> Any:
        async def op(ch: Any) -> None:
            await ch.declare_queue(queue, passive=True)

        return op

    cases: list[tuple[str, str, Any, str]] = []
    for name, spec in SERVICES.items():
        for queue in sorted(other_services_queues(name))[:3]:
            cases.append((name, f"subscribe to {queue}", subscribe(queue, ("job.submitted",)), "refused"))
        if name != "mechanism":
            cases.append((name, "delete the submissions queue", delete("gavel.mechanism.submissions"), "refused"))
        cases.append((name, "bind its queue to #", subscribe(spec.queues[0], ("#",), spec.exclusive), "refused"))
        forged = next(k for o, s in SERVICES.items() if o != name for k in s.publishes if k not in spec.publishes)
        cases.append((name, f"publish {forged}", publish(forged), "refused"))
        if name != "cli":
            cases.append((name, f"take from {DEAD_LETTERS}", get(DEAD_LETTERS), "refused"))
    cases.append(("cli", "passively declare the submissions queue", passive("gavel.mechanism.submissions"), "ok"))
    cases.append(("cli", "take a submission", get("gavel.mechanism.submissions"), "refused"))
    cases.append(("cli", "passively declare the estimator's queue", passive("gavel.estimator.inputs"), "ok"))
    cases.append(("cli", "take an estimator input", get("gavel.estimator.inputs"), "refused"))
    # A real worker: its own queue and its reports, nothing of the mechanism's, no other's commands.
    worker_queue, worker_bindings = SERVICES["worker"].queues[0], SERVICES["worker"].bindings
    cases += [
        ("worker", f"declare {worker_queue}, bind {', '.join(worker_bindings)}", subscribe(worker_queue, worker_bindings), "ok"),
        ("worker", "publish job.progress", publish(key(JobProgress)), "ok"),
        ("worker", "publish a rendezvous to a peer", publish(key(GangRendezvous, worker_id="k80-3")), "ok"),
        ("worker", "consume the submissions", subscribe("gavel.mechanism.submissions", ("job.submitted",)), "refused"),
        ("worker", "take a submission", get("gavel.mechanism.submissions"), "refused"),
        ("worker", "publish worker.cmd.k80-3.run", publish(key(RunJobs, worker_id="k80-3")), "refused"),
        ("worker", "bind every worker's commands", subscribe(worker_queue, ("worker.cmd.*.*",)), "refused"),
    ]

    async def run_all() -> list[str]:
        wrong = []
        for name, what, operation, want in cases:
            got = await attempt(name, operation)
            if got != want:
                wrong.append(f"{SERVICES[name].user}: {what}: expected {want}, got {got}")
        return wrong

    wrong = asyncio.run(run_all())
    assert not wrong, "\n".join(wrong)


@pytest.fixture(scope="module")
def services_running(imported: dict[str, dict[str, str]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """What `docker compose up` starts with .env.example's profile (policy, mechanism, estimator,
    fleet), each a local process with the entrypoint, command and environment compose gives it (the
    broker and the paths pointed at this machine), as its own user on the imported definitions.
    Yields {"dir": Path, "env": the cli's environment, "env_for": service -> its environment, ...}."""
    run = tmp_path_factory.mktemp("deploy-run")
    gavel = str(Path(sys.executable).with_name("gavel"))  # the venv's console script

    def env_for(name: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GAVEL_")}
        env.update(environment(name))
        env["GAVEL_AMQP_URL"] = deployed[name]
        env["GAVEL_HEALTH_FILE"] = str(run / f"{name}.json")
        if "GAVEL_JOURNAL_PATH" in env:
            env["GAVEL_JOURNAL_PATH"] = str(run / "mechanism.sqlite")
        env["XDG_STATE_HOME"] = str(run)  # any default state here, never in the home directory
        # `gavel` in an entrypoint snippet is the venv's, as the image's is on its PATH
        env["PATH"] = os.pathsep.join([os.path.dirname(gavel), env.get("PATH", os.defpath)])
        return env

    processes: dict[str, subprocess.Popen[bytes]] = {}
    with contextlib.ExitStack() as stack:
        deployed = imported["services"]  # a vhost of their own
        stack.callback(_stop, processes)
        for name in ("policy", "mechanism", "estimator", "fleet"):
            log = open(run / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
            argv = container_argv(name, gavel)
            if "--state" in argv:  # the estimator's, on its volume in compose
                argv[argv.index("--state") + 1] = str(run / "estimator.sqlite")
            _metrics_on_a_free_port(argv)
            processes[name] = subprocess.Popen(argv, env=env_for(name), stdout=log, stderr=subprocess.STDOUT)
        yield {"dir": run, "env": env_for("cli"), "env_for": env_for, "gavel": gavel, "processes": processes}


def _metrics_on_a_free_port(argv: list[str]) -> None:
    """Compose gives every container the same metrics port (each has a network namespace of its
    own); on one machine each process gets a free loopback port instead."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        argv[argv.index("--metrics-port") + 1] = str(s.getsockname()[1])
    argv[argv.index("--metrics-host") + 1] = "127.0.0.1"


def _stop(processes: dict[str, subprocess.Popen[bytes]]) -> None:
    for p in processes.values():
        p.terminate()
    for p in processes.values():
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _gavel(running: dict[str, Any], *argv: str) -> subprocess.CompletedProcess[str]:
    """`gavel ARGV` as the cli service runs it (its environment, as gavel-cli): its exit code and
    what it printed. In this process (services.cli.main), not in one of its own: the commands'
    answers are what these tests check, and the ~30 runs of a module (health polls, `gavel
    cluster`, `gavel jobs`) cost ~0.4 s of CPU each as processes. The services themselves, and
    their entrypoints, run as processes."""
    from services.cli import main

    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, running["env"], clear=True), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as e:  # argparse's refusals exit from the parser
            code = e.code if isinstance(e.code, int) else 2
    return subprocess.CompletedProcess(["gavel", *argv], code, out.getvalue(), err.getvalue())


def _logs(running: dict[str, Any]) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(running["dir"].glob("*.log")))


@pytest.mark.slow  # ~5-12 s (~3 s of CPU): the services started as processes (once a module), then healthy
def test_the_compose_services_run_as_their_users(services_running: dict[str, Any]) -> None:
    """Each becomes healthy (`gavel health`, as the compose healthcheck runs it) and the CLI, as
    gavel-cli, gets the mechanism's answer."""
    deadline = time.monotonic() + 90
    waiting = {"policy", "mechanism", "estimator", "fleet"}
    while waiting and time.monotonic() < deadline:
        for name in sorted(waiting):
            assert services_running["processes"][name].poll() is None, f"{name} exited\n{_logs(services_running)}"
            hc = service(name)["healthcheck"]["test"][2:]
            argv = [*hc[:1], str(services_running["dir"] / f"{name}.json"), *hc[2:]]
            if _gavel(services_running, *argv).returncode == 0:
                waiting.discard(name)
        time.sleep(0.5)
    assert not waiting, f"not healthy: {sorted(waiting)}\n{_logs(services_running)}"
    # the fleet may have announced its workers before the mechanism's queue existed: it
    # announces them again every few seconds (a heartbeat), so wait for one
    deadline = time.monotonic() + 30
    while True:
        answer = _gavel(services_running, "cluster", "--json", "--timeout-s", "20")
        assert answer.returncode == 0, answer.stderr
        if json.loads(answer.stdout)["capacity_gpus"] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert json.loads(answer.stdout)["capacity_gpus"], _logs(services_running)


@pytest.mark.slow  # ~3-4 s: a trace through the services as processes
def test_a_trace_submitted_by_the_cli_user_completes(services_running: dict[str, Any]) -> None:
    test_the_compose_services_run_as_their_users(services_running)
    trace = services_running["dir"] / "small.jsonl"
    jobs = [
        {"job_id": n, "arrival_time_s": 0.0, "job_type": job_type, "total_steps": 2000, "scale_factor": 1,
         "priority_weight": 1.0, "slo_s": None, "command": "", "working_directory": "", "num_steps_arg": "",
         "needs_data_dir": False}
        for n, job_type in enumerate(
            ("ResNet-18 (batch size 64)", "Transformer (batch size 16)", "Recommendation (batch size 2048)")
        )
    ]  # fmt: skip
    trace.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    submitted = _gavel(services_running, "submit", "--trace", str(trace), "--json")
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    answer = json.loads(submitted.stdout)
    ids = answer["job_ids"]  # the trace's ids under a prefix of its own
    assert answer["new"] == 3 and answer["refused"] == 0, answer
    deadline = time.monotonic() + 120
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        answer = _gavel(services_running, "jobs", "--json", "--timeout-s", "20")
        if answer.returncode == 0:
            states = {str(row["id"]): row["state"] for row in json.loads(answer.stdout)}
            if all(states.get(job_id) == "completed" for job_id in ids):
                break
        time.sleep(0.5)
    assert all(states.get(job_id) == "completed" for job_id in ids), f"{states}\n{_logs(services_running)}"
    cancelled = _gavel(services_running, "cancel", ids[0])  # the CLI user may cancel; an ended job says so
    assert cancelled.returncode == 1 and "has already completed" in cancelled.stderr, cancelled.stderr
    letters = _gavel(services_running, "bus", "dead-letters", "--json")
    assert letters.returncode == 0 and json.loads(letters.stdout) == [], letters.stdout


@pytest.mark.slow  # ~4 s, and ~2 s after it: the module's services stopped (~0.3 s), the definitions removed
def test_a_real_worker_joins_as_its_user_and_a_time_scaled_mechanism_refuses_it(services_running: dict[str, Any]) -> None:
    """compose's `worker` service as a local process, as gavel-worker (its checkpoint and run
    directories pointed at this machine): it becomes healthy, so its user may declare its queue,
    bind its commands and announce itself. The mechanism of .env.example's defaults runs
    TIME_SCALE times faster than the wall clock, for the simulated fleet: it refuses the worker,
    and says why, rather than lease it jobs whose leases would never end in time."""
    test_the_compose_services_run_as_their_users(services_running)
    run = services_running["dir"]
    argv = container_argv("worker", services_running["gavel"])
    for flag in ("--checkpoint-dir", "--run-dir"):
        argv[argv.index(flag) + 1] = str(run / flag.removeprefix("--"))
    _metrics_on_a_free_port(argv)
    env = services_running["env_for"]("worker")
    with open(run / "worker.log", "wb") as log:
        worker = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=run)
    services_running["processes"]["worker"] = worker  # stopped with the others, should this fail
    hc = service("worker")["healthcheck"]["test"][2:]
    health = [*hc[:1], env["GAVEL_HEALTH_FILE"], *hc[2:]]
    deadline = time.monotonic() + 60
    while _gavel(services_running, *health).returncode != 0:
        assert worker.poll() is None, f"the worker exited\n{_logs(services_running)}"
        assert time.monotonic() < deadline, f"the worker never got healthy\n{_logs(services_running)}"
        time.sleep(0.5)
    worker_id = f"{socket.gethostname()}-{parse_gavel(gavel_argv('worker')).accelerator_type}"  # its default id
    deadline = time.monotonic() + 30
    while True:
        answer = _gavel(services_running, "cluster", "--json", "--timeout-s", "20")
        assert answer.returncode == 0, answer.stderr
        refused = json.loads(answer.stdout).get("workers_refused") or {}
        if worker_id in refused or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert worker_id in refused, f"{refused}\n{_logs(services_running)}"
    assert "clock" in refused[worker_id] and "wall" in refused[worker_id], refused[worker_id]
    worker.terminate()
    assert worker.wait(timeout=60) == 0, _logs(services_running)


def test_the_submissions_bound_is_the_same_in_compose_and_the_definitions() -> None:
    """The bound is a queue argument: a service declaring another one is refused (406), so the
    services' setting must be the x-max-length the broker's definitions load (issue 13)."""
    from common.config import BusSettings
    from common.topology import MECHANISM_SUBMISSIONS

    queues = {q["name"]: q for q in definitions()["queues"]}
    declared = queues[f"{EXCHANGE}.{MECHANISM_SUBMISSIONS.name}"]["arguments"]
    for name in GAVEL_SERVICES:
        bound = BusSettings.from_env(environment(name)).submissions_max_length
        assert (declared["x-max-length"], declared["x-overflow"]) == (bound, "reject-publish"), name
