"""What a simulated mechanism forgot, kept for the run's results.

The mechanism forgets finished jobs and old round reports as a live one does
(mechanism_service/core/retention.py), so that its memory and the snapshot it writes at every
boundary do not grow with the run; a simulation's results are every job and every round, so the
driver keeps what it forgets here and reads the two together. Forgotten items may come twice
(forgotten after the last snapshot, then again after a restart replays to that point): each is
kept under what identifies it, and the mechanism's own copy wins where both have one.
"""

from __future__ import annotations

from mechanism_service.core.model import JobState, MechanismState
from mechanism_service.core.retention import Forgotten
from mechanism_service.core.rounds import RoundReport
from mechanism_service.service import MechanismService


class Archive:
    def __init__(self) -> None:
        self.jobs: dict[str, JobState] = {}  # completed and failed, by id
        self.rejected: dict[str, None] = {}
        self.rounds: dict[int, RoundReport] = {}
        self.solve_times_s: dict[int, float] = {}  # by the solve's index since the start
        self._ended: list[str] = []  # ids of the jobs handed over since ``take_ended`` last ran

    def __call__(self, forgotten: Forgotten) -> None:
        self.jobs.update((job.job_id, job) for job in forgotten.jobs)
        self.rejected.update(dict.fromkeys(forgotten.rejected))
        self._ended += [job.job_id for job in forgotten.jobs]
        self._ended += forgotten.rejected
        self.rounds.update((report.round_id, report) for report in forgotten.rounds)
        self.solve_times_s.update(enumerate(forgotten.solve_times_s, forgotten.first_solve))

    def take_ended(self) -> list[str]:
        """The ids of the jobs that ended and were handed over since the last call (a driver's
        stop condition reads them once each, not the whole archive at every boundary)."""
        ended, self._ended = self._ended, []
        return ended

    def completed(self, state: MechanismState) -> list[JobState]:
        """Every job that ended, forgotten or not (the mechanism's copy where it has one). A job
        the mechanism runs again (it ended after the last snapshot of a mechanism that crashed,
        and the replay took it back) is the mechanism's active job, not an ended one."""
        merged = dict(self.jobs)
        merged.update((job.job_id, job) for job in state.completed)
        for job in state.jobs.values():
            merged.pop(job.job_id, None)
        return list(merged.values())

    def with_mechanism(self, mechanism: MechanismService) -> tuple[list[RoundReport], list[float], list[str]]:
        """The run's round reports, solve times and rejected ids: the forgotten and the kept."""
        memory = mechanism.memory
        rounds = dict(self.rounds)
        rounds.update((report.round_id, report) for report in memory.round_reports)
        solves = dict(self.solve_times_s)
        solves.update(enumerate(memory.solve_times_s, memory.solves_forgotten))
        return (
            [rounds[k] for k in sorted(rounds)], [solves[k] for k in sorted(solves)],
            list(dict.fromkeys([*self.rejected, *mechanism.rejected])),
        )
