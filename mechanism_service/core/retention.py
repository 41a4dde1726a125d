"""How long the mechanism remembers what is over: finished jobs, round reports, solve times and
lost workers. Pure.

A long-lived mechanism would otherwise keep every job it ever ran: its record, its placements
and attempts, its id (for deduplication), and a report per round, all in memory and all in the
snapshot written at every boundary, so both grow with the cluster's age (a 5,900-round run with
mechanism crashes took 568 s against 16 s without, rewriting a snapshot that only grew). Slurm
answers the same way: a finished job's record is kept ``MinJobAge`` seconds, and the controller
holds at most ``MaxJobCount`` jobs.

The rule: a finished job (completed, failed, cancelled or refused) is kept ``finished_s`` of the
mechanism's seconds after it ended, and never more than ``finished_jobs`` of them (the oldest go
first); the newest ``rounds`` round reports and solve times; the newest ``lost_workers`` lost
workers. Until it is forgotten a job answers `gavel job ID` and a second submission of its id is
deduplicated (or refused as a conflict); afterwards the id is unknown, and free again, as Slurm's
are.

``KEEP_ALL`` is a MechanismService's default (tests and benches that read its memory); `gavel
serve mechanism` keeps ``LIVE`` unless its flags say otherwise (services/cli/serve_cmd.py turns
their wall seconds into the mechanism's); the simulator forgets everything that is over into an
archive its results read (sim.driver.SIM_RETENTION, sim/archive.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

from common.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Retention:
    finished_s: float | None = 3600.0  # None: no age limit
    finished_jobs: int | None = 1_000  # None: no count limit (a finished job costs the snapshot up to ~9 KB)
    rounds: int | None = 10_000  # round reports and solve times kept
    lost_workers: int | None = 1_000

    def __post_init__(self) -> None:
        for name in ("finished_s", "finished_jobs", "rounds", "lost_workers"):
            value = getattr(self, name)
            if value is not None and not value >= 0:  # NaN too
                raise ConfigError(f"retention: {name} must be >= 0 or None (keep all), not {value!r}")

    @property
    def keeps_all(self) -> bool:
        return self.finished_s is None and self.finished_jobs is None and self.rounds is None and self.lost_workers is None


KEEP_ALL = Retention(finished_s=None, finished_jobs=None, rounds=None, lost_workers=None)
LIVE = Retention()


def expired_jobs(ended_at_s: Mapping[str, float], now_s: float, retention: Retention) -> list[str]:
    """The finished jobs to forget now: from the oldest (``ended_at_s`` is in the order they
    ended), those past the age limit or beyond the count limit. Costs what it forgets."""
    over = 0 if retention.finished_jobs is None else max(0, len(ended_at_s) - retention.finished_jobs)
    expired = list(itertools.islice(ended_at_s, over))
    if retention.finished_s is not None:
        horizon_s = now_s - retention.finished_s
        for job_id in itertools.islice(ended_at_s, over, None):
            if ended_at_s[job_id] > horizon_s:
                break
            expired.append(job_id)
    return expired


def excess(count: int, limit: int | None) -> int:
    """How many of the oldest of ``count`` items go under ``limit`` (None: none)."""
    return 0 if limit is None else max(0, count - limit)
