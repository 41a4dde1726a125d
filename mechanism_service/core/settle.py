"""Settling a finished round (section 8): steps and time credited, gang failures counted,
finished jobs retired. Section numbers refer to docs/gavel-semantics.md."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from mechanism_service.core.job_entries import remove_job
from mechanism_service.core.model import Entry, JobState, MechanismState, Placement
from mechanism_service.core.settings import MechanismSettings


@dataclass(frozen=True, slots=True)
class LeaseResult:
    """What one entry did in a round: steps per member (same order as the entry) and when the
    last member stopped. ``ended``: how a real worker's lease ended when it was not the job's
    time running out: "crashed" (a member's process failed), "lost" (a worker of it was declared
    lost) or "unreported" (no report by the round's timeout). Each is launched afresh next, never
    extended. Simulated leases leave it empty."""

    entry: Entry
    placement: Placement
    steps: tuple[int, ...]
    finish_s: float
    ended: Literal["", "crashed", "lost", "unreported"] = ""

    def __init__(
        self, entry: Entry, placement: Placement, steps: tuple[int, ...], finish_s: float,
        ended: Literal["", "crashed", "lost", "unreported"] = "",
    ) -> None:
        # Written out (the generated one's work, ~0.2 us less a call): one is built per lease
        # settled, ~60,000 in the simulator's calibration run.
        _SET(self, "entry", entry)
        _SET(self, "placement", placement)
        _SET(self, "steps", steps)
        _SET(self, "finish_s", finish_s)
        _SET(self, "ended", ended)


_SET = object.__setattr__  # a frozen dataclass sets its fields so in its own __init__


def settle_round(
    state: MechanismState,
    results: Iterable[LeaseResult],
    round_start_s: float,
    settings: MechanismSettings,
) -> list[JobState]:
    """Section 8: credit steps and time, count gang failures, retire finished jobs.

    Results are settled latest finish first. Returns the jobs that completed (or were dropped).

    A lease that crashed or lost its worker is not a gang failure, whatever its steps: its steps
    (what was checkpointed, or reported before the loss) and time count, the job's gang-failure
    count is left as it was (crashes are counted as failed attempts by the shell), and its
    placement is forgotten: no process runs there any more, so the next round launches the job
    afresh instead of extending the lease."""
    done: list[JobState] = []
    jobs = state.jobs
    received = _ReceivedTime(state)
    type_time_s, max_failures = state.type_time_s, settings.max_gang_failures
    finishing_fails = settings.finishing_gang_fails
    for result in sorted(results, key=_FINISH_S, reverse=True):
        entry, steps_of = result.entry, result.steps
        if len(entry) == 1 and len(steps_of) == 1 and not result.ended:
            # A single job's lease that ended as planned (nearly every lease): the general path
            # below with one member, written out (one job per lease, no lists).
            job = jobs.get(entry[0])
            if job is None:
                continue
            finish_s = job.last_finish_s = result.finish_s
            exec_s = finish_s - round_start_s
            steps = steps_of[0]
            if exec_s <= 0 or (steps < job.scale_factor and (finishing_fails or steps < job.total_steps - job.steps_done)):
                state.needs_allocation = True
                if steps:
                    _forget_placement(state, result)
                job.failures += 1
                if job.failures >= max_failures:
                    done.append(remove_job(state, job.index, dropped=True))
                    received.moved()  # the removal may have moved the ledgers' rows
                continue
            job.failures = 0
            placement = result.placement
            w = placement.accelerator_type
            job.steps_done += steps
            by_type = job.gpu_seconds_by_type
            # (_credit's share, exec_s x GPUs / members: with one member the division is exact)
            by_type[w] = by_type.get(w, 0.0) + exec_s * len(placement.worker_ids)
            row = received.row_of.get(entry)
            if row is not None:  # received.add, written out
                cell = (row, received.column_of[w])
                received.cells[cell] += exec_s
                type_time_s[w] += exec_s
            if job.total_steps - job.steps_done <= 0:
                done.append(remove_job(state, job.index))
                received.moved()
            continue
        members = [(i, steps) for i, steps in zip(entry, steps_of, strict=True) if i in jobs]
        if not members:
            continue
        finish_s = result.finish_s
        for i, _ in members:
            jobs[i].last_finish_s = finish_s
        exec_s = finish_s - round_start_s
        scale_factor = jobs[members[0][0]].scale_factor
        if result.ended:
            _settle_ended_early(state, result, members, exec_s, done, received)
            continue
        if exec_s <= 0 or any(steps < scale_factor and (finishing_fails or steps < jobs[i].steps_remaining) for i, steps in members):
            # A gang that got fewer steps than GPUs: some worker did nothing (section 8.3), unless
            # that was every step it had left (settings.finishing_gang_fails).
            state.needs_allocation = True
            if any(steps for _, steps in members):
                _forget_placement(state, result)
            if len(result.entry) == 1:
                job = jobs[members[0][0]]
                job.failures += 1
                if job.failures >= max_failures:
                    done.append(remove_job(state, job.index, dropped=True))
                    received.moved()
            continue
        for i, _ in members:
            jobs[i].failures = 0
        _credit(state, result, members, exec_s, done, received)
    return done


_FINISH_S = operator.attrgetter("finish_s")


class _ReceivedTime:
    """Adds the leases' time to their entries' ledger cells as they are settled (one ``+=`` a
    cell, in settling order: the floats the ledgers always had), through a memoryview of the
    ledgers' array: a Python float read and written without a numpy scalar each way (~3x
    cheaper a cell than indexing the array). A removal may move the ledgers' rows (compact
    replaces ``row_of``; the array stays the same object): ``moved`` looks them up again."""

    __slots__ = ("_ledgers", "row_of", "column_of", "cells")

    def __init__(self, state: MechanismState) -> None:
        self._ledgers = state.entries
        self.moved()

    def moved(self) -> None:
        ledgers = self._ledgers
        self.row_of, self.column_of = ledgers.row_of, ledgers.column_of
        # a float64 array (the ledgers make no other): its cells are Python floats through the view
        self.cells = memoryview(ledgers.received_s)

    def add(self, entry: Entry, w: str, exec_s: float) -> bool:
        """Whether the entry has a ledger (its time then counts)."""
        row = self.row_of.get(entry)
        if row is None:
            return False
        cell = (row, self.column_of[w])
        self.cells[cell] += exec_s
        return True


def _credit(
    state: MechanismState, result: LeaseResult, members: list[tuple[int, int]], exec_s: float, done: list[JobState],
    received: _ReceivedTime,
) -> None:
    """A lease's steps and time to its members and its entry's ledger; the finished retire."""
    w = result.placement.accelerator_type
    share_s = exec_s * len(result.placement.worker_ids) / len(result.entry)
    jobs = state.jobs
    finished = False
    for i, steps in members:
        job = jobs[i]
        job.steps_done += steps
        by_type = job.gpu_seconds_by_type
        by_type[w] = by_type.get(w, 0.0) + share_s
        finished = finished or job.total_steps - job.steps_done <= 0
    if received.add(result.entry, w, exec_s):
        state.type_time_s[w] += exec_s
    if finished:
        for i, _ in members:
            if jobs[i].steps_remaining <= 0:
                done.append(remove_job(state, i))
                received.moved()  # the removal may have moved the ledgers' rows


def _settle_ended_early(
    state: MechanismState, result: LeaseResult, members: list[tuple[int, int]], exec_s: float, done: list[JobState],
    received: _ReceivedTime,
) -> None:
    """A crashed, lost or unreported lease (see settle_round): credit what it did (no time when it
    ran none), and launch it afresh next."""
    _forget_placement(state, result)
    _credit(state, result, members, max(exec_s, 0.0), done, received)


def _forget_placement(state: MechanismState, result: LeaseResult) -> None:
    """Launch the lease's entry afresh next round instead of extending it. After a crash or a
    loss no process runs there. After steps done but not credited (a gang failure: a packed
    partner or a gang's worker did none), the processes that did them would go on, if
    extended, from steps the scheduler never counted, and the job would end short of them:
    relaunched, it resumes from the newest checkpoint at or below the credited step
    (worker_service/training.py). A lease that did no step at all (a start-up longer than the
    round) is extended: its process is where the scheduler thinks it is."""
    if state.previous_assignment.get(result.entry) == result.placement:
        del state.previous_assignment[result.entry]


def record_first_runs(
    state: MechanismState, assignment: Mapping[Entry, Placement], now_s: float, *, continues_within_s: float = 0.0
) -> None:
    """The jobs of this round's assignment: their first run, and when their uninterrupted run
    began (``run_started_s``): now, unless the job ran up to within ``continues_within_s`` of now
    (it ran last round: its run goes on)."""
    jobs, run_started = state.jobs, state.run_started_s
    for entry in assignment:
        for i in entry:
            job = jobs[i]
            if job.first_run_s is None:
                job.first_run_s = now_s
            last = job.last_finish_s
            if last is None or now_s - last > continues_within_s or i not in run_started:
                run_started[i] = now_s
