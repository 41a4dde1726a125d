"""Where a service keeps its state by default, named for the cluster it belongs to.

Two clusters under one home directory (two vhosts on one broker, two brokers, two exchanges)
must not share a journal: the mechanism would replay one cluster's jobs into the other. So the
default file names the cluster: ``<service>-<exchange>@<host>_<port>[_<vhost>].sqlite`` below
``$XDG_STATE_HOME/gavel`` (the default vhost ``/`` adds nothing). And every journal records the
cluster it was first opened for (its exchange and vhost: a broker's address may change, through
DNS or a node of a multi-node cluster, and stay the same cluster), so a file given by hand to
another cluster is refused with one line (common.journal.Journal, ``cluster=``).

A file kept under the name used before the cluster was in it (``<service>-<exchange>.sqlite``)
is still used, so an upgrade loses nothing it accepted, unless it belongs to another cluster.
"""

from __future__ import annotations

import pathlib
import re
from urllib.parse import unquote, urlsplit

from common.config import BusSettings, Settings

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def cluster_identity(bus: BusSettings) -> str:
    """What a journal records as its cluster: the exchange and the vhost."""
    return f"exchange {bus.exchange!r} on vhost {_vhost(bus.amqp_url)!r}"


def cluster_file_part(bus: BusSettings) -> str:
    """The exchange, the broker's host and port, and the vhost unless it is the default, as a
    part of a file name (anything but letters, digits, '.', '_' and '-' becomes '_')."""
    url = urlsplit(bus.amqp_url)
    port = url.port or (5671 if url.scheme == "amqps" else 5672)
    vhost = _vhost(bus.amqp_url)
    parts = [f"{url.hostname or 'localhost'}_{port}", *([vhost] if vhost != "/" else [])]
    return f"{_UNSAFE.sub('_', bus.exchange)}@{_UNSAFE.sub('_', '_'.join(parts))}"


def default_state_path(settings: Settings, service: str) -> pathlib.Path:
    return pathlib.Path(settings.state_dir) / f"{service}-{cluster_file_part(settings.bus)}.sqlite"


def legacy_state_path(settings: Settings, service: str) -> pathlib.Path:
    """The name used before the cluster was in it (an upgrade's file)."""
    return pathlib.Path(settings.state_dir) / f"{service}-{settings.bus.exchange}.sqlite"


def _vhost(amqp_url: str) -> str:
    path = urlsplit(amqp_url).path
    return unquote(path[1:]) if len(path) > 1 else "/"
