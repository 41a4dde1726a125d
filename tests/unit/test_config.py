"""Settings from the environment: defaults, parsing, and errors that name the variable."""

from __future__ import annotations

import pytest

from common.config import BusSettings, Settings, redact_url
from common.errors import ConfigError


def test_defaults_work_on_a_developer_machine():
    s = Settings.from_env({})
    assert s.bus == BusSettings()
    assert s.bus.amqp_url == "amqp://guest:guest@127.0.0.1:5672/"
    assert s.bus.kind == "memory" and s.log.format == "auto"


def test_every_variable_is_read():
    env = {
        "GAVEL_BUS": "AMQP",
        "GAVEL_AMQP_URL": "amqps://svc:pw@broker.internal:5671/gavel",
        "GAVEL_EXCHANGE": "gavel-staging",
        "GAVEL_PREFETCH": "8",
        "GAVEL_MAX_MESSAGE_BYTES": "1048576",
        "GAVEL_CONFIRM_TIMEOUT_S": "2.5",
        "GAVEL_PUBLISH_RETRIES": "3",
        "GAVEL_CONNECT_TIMEOUT_S": "4",
        "GAVEL_RECONNECT_INTERVAL_S": "0.5",
        "GAVEL_LOG_LEVEL": "debug",
        "GAVEL_LOG_FORMAT": "json",
        "GAVEL_SHUTDOWN_TIMEOUT_S": "12",
    }
    s = Settings.from_env(env)
    assert s.bus == BusSettings(
        "amqp", "amqps://svc:pw@broker.internal:5671/gavel", "gavel-staging", 8, 1048576, 2.5, 3, 4.0, 0.5
    )
    assert (s.log.level, s.log.format, s.shutdown_timeout_s) == ("debug", "json", 12.0)
    assert s.as_dict()["bus"]["amqp_url"] == "amqps://svc:***@broker.internal:5671/gavel"  # type: ignore[index]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GAVEL_PREFETCH": "0"}, "GAVEL_PREFETCH must be a positive integer, got '0'"),
        ({"GAVEL_PREFETCH": "lots"}, "GAVEL_PREFETCH must be a positive integer, got 'lots'"),
        ({"GAVEL_CONFIRM_TIMEOUT_S": "nan"}, "GAVEL_CONFIRM_TIMEOUT_S must be a positive number, got 'nan'"),
        ({"GAVEL_BUS": "kafka"}, "GAVEL_BUS must be one of memory, amqp, got 'kafka'"),
        ({"GAVEL_AMQP_URL": "http://h/"}, "GAVEL_AMQP_URL must be an amqp:// or amqps:// URL with a host"),
        ({"GAVEL_AMQP_URL": "amqp://u:secret@h:99999/"}, "GAVEL_AMQP_URL has a bad port: 'amqp://u:***@h:99999/'"),
        ({"GAVEL_EXCHANGE": "a b"}, "GAVEL_EXCHANGE may hold only letters, digits"),
        ({"GAVEL_LOG_LEVEL": "loud"}, "GAVEL_LOG_LEVEL must be one of debug, info, warning, error"),
    ],
)
def test_bad_values_name_the_variable_and_never_leak_a_password(env, message):
    with pytest.raises(ConfigError) as info:
        Settings.from_env(env)
    assert str(info.value).startswith(message)
    assert "secret" not in str(info.value)


def test_redact_url():
    assert redact_url("amqp://user:pa55@h:5672/v") == "amqp://user:***@h:5672/v"
    assert redact_url("amqp://h/") == "amqp://h/"
