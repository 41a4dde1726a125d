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
serve mechanism` keeps ``LIVE`` unless its flags say otherwise (services/cli/serve_build.py turns
their wall seconds into the mechanism's); the simulator forgets everything that is over into an
archive its results read (sim.driver.SIM_RETENTION, sim/archive.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.errors import ConfigError
from mechanism_service.core.model import JobState, MechanismState
from mechanism_service.core.rounds import RoundReport

if TYPE_CHECKING:
    from mechanism_service.core.memory import Memory


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


@dataclass(frozen=True, slots=True)
class Forgotten:
    """What one boundary forgot under the retention rule, handed to the mechanism's ``archive``
    (the simulator keeps it: its results are every job and round). After a restart the same items
    may be handed over again (forgotten after the last snapshot, then replayed): ``jobs`` by
    id, rounds by ``round_id`` and solve times from ``first_solve`` are what identify them."""

    jobs: tuple[JobState, ...]  # completed and failed, as the state held them
    rejected: tuple[str, ...]  # ids refused (on receipt, or set aside by the policy)
    rounds: tuple[RoundReport, ...]
    first_solve: int  # the index of solve_times_s[0] among every solve since the start
    solve_times_s: tuple[float, ...]


def forget(memory: Memory, state: MechanismState, now_s: float, rule: Retention) -> tuple[Forgotten | None, list[str]]:
    """Forget what is over under the rule: finished jobs with everything kept about them, the
    oldest round reports and solve times, the oldest lost and refused workers. Deterministic
    from the memory and the time, so a replay forgets the same. Returns what was forgotten (None:
    nothing to archive) and the workers forgotten."""
    if rule.keeps_all:
        return None, []
    obs = memory.observations
    expired = expired_jobs(memory.ended_at_s, now_s, rule)
    jobs: list[JobState] = []
    rejected: list[str] = []
    if expired:
        gone = set(expired)
        kept = []
        for job in state.completed:
            (jobs if job.job_id in gone else kept).append(job)
        state.completed = kept
        rejected = [job_id for job_id in expired if job_id in obs.rejected]
        for job_id in expired:
            del memory.ended_at_s[job_id]
            for held in (
                obs.history, obs.history_dropped, obs.attempts, obs.measured, obs.failed, obs.cancelled, obs.rejected,
                memory.launch, memory.owners,
            ):
                held.pop(job_id, None)
            memory.intake.known.pop(job_id, None)  # the id is free again (module docstring)
            memory.ended_jobs.discard(job_id)
        obs.forgotten_jobs += len(expired)
    rounds = excess(len(memory.round_reports), rule.rounds)
    solves = excess(len(memory.solve_times_s), rule.rounds)
    forgotten = None
    if jobs or rejected or rounds or solves:
        forgotten = Forgotten(
            tuple(jobs), tuple(rejected), tuple(memory.round_reports[:rounds]), memory.solves_forgotten,
            tuple(memory.solve_times_s[:solves]),
        )
    if rounds:
        del memory.round_reports[:rounds]
        memory.rounds_forgotten += rounds
    if solves:
        del memory.solve_times_s[:solves]
        memory.solves_forgotten += solves
    workers: list[str] = []
    for held_workers in (memory.lost_workers, memory.refused_workers):
        for worker_id in list(itertools.islice(held_workers, excess(len(held_workers), rule.lost_workers))):
            del held_workers[worker_id]
            workers.append(worker_id)
    return forgotten, workers
