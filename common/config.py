"""Settings: environment variables -> frozen dataclasses, with errors that name the variable.

Every setting has a default that works on a developer machine (a local RabbitMQ with the guest
user). Parsing is pure: ``Settings.from_env(os.environ)`` in a shell, any mapping in tests.
"""

from __future__ import annotations

import dataclasses
import math
import os
import urllib.parse
from collections.abc import Callable, Mapping
from typing import TypeVar

from common.codec import DEFAULT_MAX_BODY_BYTES
from common.errors import ConfigError

T = TypeVar("T")

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
# Messages waiting in the mechanism's submissions queue before a publish is refused: a trace of
# up to this many jobs still gets in whole while the mechanism is down (bench/submit_throughput.py
# submits 10,000 so; 10,000 with its seal would not fit a bound of 10,000), and it is ~15-30 s of the
# mechanism's intake (3,700-7,450/s, README) and ~50 MB on the broker: a submitter far ahead of
# the mechanism is told so instead of queueing hours of work.
DEFAULT_SUBMISSIONS_MAX_LENGTH = 100_000


def _get(env: Mapping[str, str], name: str, default: T, parse: Callable[[str, str], T]) -> T:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    return parse(name, raw.strip())


def _positive_int(name: str, raw: str) -> int:
    try:
        v = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a positive integer, got {raw!r}") from None
    if v <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {raw!r}")
    return v


def _positive_int_or_none(name: str, raw: str) -> int | None:
    if raw.lower() == "none":
        return None
    try:
        return _positive_int(name, raw)
    except ConfigError:
        raise ConfigError(f"{name} must be a positive integer or 'none', got {raw!r}") from None


def _positive_float(name: str, raw: str) -> float:
    try:
        v = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a positive number, got {raw!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ConfigError(f"{name} must be a positive number, got {raw!r}")
    return v


def _non_negative_float(name: str, raw: str) -> float:
    try:
        v = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number >= 0, got {raw!r}") from None
    if not math.isfinite(v) or v < 0:
        raise ConfigError(f"{name} must be a number >= 0, got {raw!r}")
    return v


def _choice(*choices: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        v = raw.lower()
        if v not in choices:
            raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
        return v

    return parse


def _amqp_url(name: str, raw: str) -> str:
    parsed = urllib.parse.urlparse(raw)
    if parsed.scheme not in ("amqp", "amqps") or not parsed.hostname:
        raise ConfigError(f"{name} must be an amqp:// or amqps:// URL with a host, got {redact_url(raw)!r}")
    try:
        parsed.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ConfigError(f"{name} has a bad port: {redact_url(raw)!r}") from None
    return raw


def _name(name: str, raw: str) -> str:
    if not all(c.isalnum() or c in "-_." for c in raw) or len(raw) > 200:
        raise ConfigError(f"{name} may hold only letters, digits, '-', '_' and '.', got {raw!r}")
    return raw


def redact_url(url: str) -> str:
    """The URL with its password replaced, for logs and error messages."""
    parsed = urllib.parse.urlparse(url)
    if parsed.password is None:
        return url
    netloc = parsed.netloc.replace(f":{parsed.password}@", ":***@", 1)
    return parsed._replace(netloc=netloc).geturl()


@dataclasses.dataclass(frozen=True, slots=True)
class BusSettings:
    kind: str = "memory"  # GAVEL_BUS: memory | amqp
    amqp_url: str = DEFAULT_AMQP_URL  # GAVEL_AMQP_URL
    exchange: str = "gavel"  # GAVEL_EXCHANGE: queues are named "<exchange>.<queue>"
    prefetch: int = 32  # GAVEL_PREFETCH: unacknowledged deliveries per consumer
    max_message_bytes: int = DEFAULT_MAX_BODY_BYTES  # GAVEL_MAX_MESSAGE_BYTES
    confirm_timeout_s: float = 30.0  # GAVEL_CONFIRM_TIMEOUT_S: wait this long for a publish confirm
    publish_retries: int = 5  # GAVEL_PUBLISH_RETRIES: after a lost connection, retry this many times
    connect_timeout_s: float = 10.0  # GAVEL_CONNECT_TIMEOUT_S
    reconnect_interval_s: float = 1.0  # GAVEL_RECONNECT_INTERVAL_S: between attempts after a drop
    # GAVEL_SUBMISSIONS_MAX_LENGTH: the mechanism's submissions queue holds at most this many
    # messages waiting; a publish past it is refused (backpressure, common/topology.py). None
    # ("none"): no bound, for a queue declared before the bound existed.
    submissions_max_length: int | None = DEFAULT_SUBMISSIONS_MAX_LENGTH

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> BusSettings:
        d = cls()
        return cls(
            kind=_get(env, "GAVEL_BUS", d.kind, _choice("memory", "amqp")),
            amqp_url=_get(env, "GAVEL_AMQP_URL", d.amqp_url, _amqp_url),
            exchange=_get(env, "GAVEL_EXCHANGE", d.exchange, _name),
            prefetch=_get(env, "GAVEL_PREFETCH", d.prefetch, _positive_int),
            max_message_bytes=_get(env, "GAVEL_MAX_MESSAGE_BYTES", d.max_message_bytes, _positive_int),
            confirm_timeout_s=_get(env, "GAVEL_CONFIRM_TIMEOUT_S", d.confirm_timeout_s, _positive_float),
            publish_retries=_get(env, "GAVEL_PUBLISH_RETRIES", d.publish_retries, _positive_int),
            connect_timeout_s=_get(env, "GAVEL_CONNECT_TIMEOUT_S", d.connect_timeout_s, _positive_float),
            reconnect_interval_s=_get(env, "GAVEL_RECONNECT_INTERVAL_S", d.reconnect_interval_s, _positive_float),
            submissions_max_length=_get(
                env, "GAVEL_SUBMISSIONS_MAX_LENGTH", d.submissions_max_length, _positive_int_or_none
            ),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class LogSettings:
    level: str = "info"  # GAVEL_LOG_LEVEL: debug | info | warning | error
    format: str = "auto"  # GAVEL_LOG_FORMAT: auto (console on a TTY, JSON otherwise) | console | json

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LogSettings:
        d = cls()
        return cls(
            level=_get(env, "GAVEL_LOG_LEVEL", d.level, _choice("debug", "info", "warning", "error")),
            format=_get(env, "GAVEL_LOG_FORMAT", d.format, _choice("auto", "console", "json")),
        )


def _path(name: str, raw: str) -> str:
    if "\x00" in raw:
        raise ConfigError(f"{name} is not a usable path")
    return raw


def default_state_dir(env: Mapping[str, str]) -> str:
    """Where gavel keeps state by default: ``$XDG_STATE_HOME/gavel``, or ``~/.local/state/gavel``
    (the XDG base directory specification, which also says to ignore a relative XDG_STATE_HOME)."""
    base = env.get("XDG_STATE_HOME", "").strip()
    if not os.path.isabs(base):
        home = env.get("HOME") or os.path.expanduser("~")
        base = os.path.join(home, ".local", "state")
    return os.path.join(base, "gavel")


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    bus: BusSettings = BusSettings()
    log: LogSettings = LogSettings()
    shutdown_timeout_s: float = 30.0  # GAVEL_SHUTDOWN_TIMEOUT_S: wait for in-flight handlers
    journal_path: str | None = None  # GAVEL_JOURNAL_PATH: the mechanism's SQLite journal
    health_file: str | None = None  # GAVEL_HEALTH_FILE: where `gavel serve` writes its health
    # GAVEL_BROKER_WAIT_S: how long `gavel serve`/`gavel up` keep trying to reach a broker that
    # does not answer (0: not at all); plain processes have no restart policy to retry for them
    broker_wait_s: float = 60.0
    # XDG_STATE_HOME/gavel: the mechanism's default journal, mechanism-<exchange>.sqlite
    state_dir: str = dataclasses.field(default_factory=lambda: default_state_dir({}))

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        return cls(
            bus=BusSettings.from_env(env),
            log=LogSettings.from_env(env),
            shutdown_timeout_s=_get(env, "GAVEL_SHUTDOWN_TIMEOUT_S", 30.0, _positive_float),
            journal_path=_get(env, "GAVEL_JOURNAL_PATH", None, _path),
            health_file=_get(env, "GAVEL_HEALTH_FILE", None, _path),
            broker_wait_s=_get(env, "GAVEL_BROKER_WAIT_S", 60.0, _non_negative_float),
            state_dir=default_state_dir(env),
        )

    def as_dict(self) -> dict[str, object]:
        """For `gavel config`: every setting, with the password in the AMQP URL redacted."""
        d = dataclasses.asdict(self)
        d["bus"]["amqp_url"] = redact_url(self.bus.amqp_url)
        return d
