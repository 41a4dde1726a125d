"""The state files ``gavel serve`` and ``gavel up`` open for the services that keep one: the
mechanism's journal and the estimator's state.

The mechanism keeps a journal unless told not to (``--no-journal``): ``--journal``, else
GAVEL_JOURNAL_PATH, else ``$XDG_STATE_HOME/gavel/mechanism-<exchange>.sqlite`` (one per exchange,
so two deployments on one broker do not share it). ``gavel up`` on the in-memory bus keeps none
by default: nothing outside the process survives it anyway. The estimator's state is kept the
same way (``--state``, ``--no-state``).
"""

from __future__ import annotations

import argparse
import pathlib

import structlog

from common.config import Settings
from common.errors import JournalError
from common.journal import Journal, recorded_cluster
from services.cli.common import CommandFailed
from services.cli.state_paths import cluster_identity, default_state_path, legacy_state_path

log = structlog.get_logger("gavel.serve")


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
