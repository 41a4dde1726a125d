"""Default state files are named for their cluster, and a journal refuses another cluster (issue 23:
two clusters under one home directory shared `mechanism-gavel.sqlite`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from common.config import BusSettings, Settings
from common.errors import JournalError
from common.journal import Journal, recorded_cluster
from services.cli.serve_cmd import default_journal_path
from services.cli.state_paths import cluster_file_part, cluster_identity


def bus(url: str, exchange: str = "gavel") -> BusSettings:
    return BusSettings(kind="amqp", amqp_url=url, exchange=exchange)


@pytest.mark.parametrize(
    ("url", "exchange", "part"),
    [
        ("amqp://guest:guest@127.0.0.1:5672/", "gavel", "gavel@127.0.0.1_5672"),
        ("amqp://guest:guest@127.0.0.1/", "gavel", "gavel@127.0.0.1_5672"),  # the default port, said
        ("amqps://u:p@broker.example.org/gavel", "gavel", "gavel@broker.example.org_5671_gavel"),
        ("amqp://u:p@rabbit:5672/team%2Fa", "prod", "prod@rabbit_5672_team_a"),  # '/' in a vhost
        ("amqp://u:p@[::1]:5673/", "x y", "x_y@__1_5673"),
    ],
)
def test_the_file_names_exchange_broker_and_vhost(url: str, exchange: str, part: str) -> None:
    assert cluster_file_part(bus(url, exchange)) == part


def test_two_vhosts_of_one_broker_get_two_files(tmp_path: Path) -> None:
    base = Settings.from_env({"XDG_STATE_HOME": str(tmp_path)})
    a = dataclasses.replace(base, bus=bus("amqp://g:g@127.0.0.1:5672/a"))
    b = dataclasses.replace(base, bus=bus("amqp://g:g@127.0.0.1:5672/b"))
    assert default_journal_path(a) != default_journal_path(b)
    assert default_journal_path(a, "estimator").name == "estimator-gavel@127.0.0.1_5672_a.sqlite"


def test_a_journal_records_its_cluster_and_refuses_another(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    mine, theirs = cluster_identity(bus("amqp://g:g@h/a")), cluster_identity(bus("amqp://g:g@h/b"))
    Journal(path, cluster=mine).close()
    assert recorded_cluster(path) == mine == "exchange 'gavel' on vhost 'a'"
    Journal(path, cluster=mine).close()  # the same cluster, again
    with pytest.raises(JournalError, match=r"is the journal of another cluster \(exchange 'gavel' on vhost 'a'; this one is"):
        Journal(path, cluster=theirs)
    Journal(path).close()  # naming no cluster (tools, tests) checks nothing


def test_a_file_under_the_old_name_is_kept_unless_another_cluster_has_it(tmp_path: Path) -> None:
    settings = dataclasses.replace(Settings.from_env({"XDG_STATE_HOME": str(tmp_path)}), bus=bus("amqp://g:g@h:5672/"))
    old = tmp_path / "gavel" / "mechanism-gavel.sqlite"
    assert default_journal_path(settings).name == "mechanism-gavel@h_5672.sqlite"  # nothing there yet
    Journal(old).close()  # an upgrade's journal, from before clusters were recorded
    assert default_journal_path(settings) == old  # what it accepted is not lost
    Journal(old, cluster=cluster_identity(settings.bus)).close()
    assert default_journal_path(settings) == old
    other = dataclasses.replace(settings, bus=bus("amqp://g:g@h:5672/other"))
    assert default_journal_path(other).name == "mechanism-gavel@h_5672_other.sqlite"  # not the first cluster's
