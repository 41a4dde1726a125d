"""A round boundary, as the steps both shells run in the same order (the mechanism service over
the bus, and the simulator's bus-free path), so that they make the same decisions:

    close_round      settle the leases that ended: credit steps and time, retire jobs
    admit_arrivals   the jobs that arrived meanwhile join (or are held, or refused)
    begin_reset      if due: fold the old allocation's time into the ledgers (then the shell
                     asks the policy and installs the answer with reducers.apply_allocation)
    open_round       priorities, greedy pick, placement, lease accounting

Pure except for mutating the MechanismState it is given.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from mechanism_service.core.catch_up import behind_jobs
from mechanism_service.core.migration import kept_and_stretches
from mechanism_service.core.model import Entry, JobState, MechanismState, Placement
from mechanism_service.core.planning.holds import fit_held_columns, held_columns
from mechanism_service.core.planning.ledger_reads import ledger_lists
from mechanism_service.core.planning.picking import pick_columns, type_order
from mechanism_service.core.planning.placement import count_extensions, place
from mechanism_service.core.planning.priority import plan_queues
from mechanism_service.core.policy_input import advance_isolated_time
from mechanism_service.core.profiling import ProfilingPick
from mechanism_service.core.rates import Rates
from mechanism_service.core.reducers import (
    LeaseResult,
    NewJob,
    Admission,
    admission,
    admit,
    record_first_runs,
    refresh_throughputs,
    reset_due,
    reset_ledgers,
    settle_round,
)
from mechanism_service.core.seams.admission import AdmissionPolicy
from mechanism_service.core.seams.admitting import decide, view_of
from mechanism_service.core.seams.chosen import DEFAULTS, Chosen
from mechanism_service.core.seams.launching import launch_with
from mechanism_service.core.seams.placing import place_with, remember_placements
from mechanism_service.core.settings import MechanismSettings

Shuffle = Callable[[list[str]], None]


class NumpyShuffle:
    """Reorders the visiting order in place from a numpy Generator (picklable, for the journal)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng

    def __call__(self, order: list[str]) -> None:
        self._rng.shuffle(order)  # type: ignore[arg-type]


def type_shuffler(preset: str, seed: int) -> Shuffle:
    """Randomness for the agnostic policies' type order. The gavel preset draws from Python's
    Mersenne Twister seeded as Gavel seeds it (seed + 5), so runs match Gavel's draw for draw."""
    if preset == "gavel":
        return random.Random(seed + 5).shuffle
    return NumpyShuffle(np.random.default_rng([seed, 5]))


@dataclass(slots=True)
class RoundClock:
    """When the running round started, for crediting its time. Gavel takes the previous round's
    end (stale after an idle gap, 0 before the first round); ours takes the dispatch time."""

    previous_end_s: float | None = None
    start_s: float = 0.0
    dispatched_at_s: float = 0.0

    def close(self, end_s: float, settings: MechanismSettings) -> float:
        """The start to credit the round that ends at ``end_s`` from."""
        if settings.round_start_from_previous_end:
            if self.previous_end_s is not None:
                self.start_s = self.previous_end_s
        else:
            self.start_s = self.dispatched_at_s
        self.previous_end_s = end_s
        return self.start_s


def close_round(
    state: MechanismState, results: Iterable[LeaseResult], round_start_s: float, settings: MechanismSettings
) -> list[JobState]:
    return settle_round(state, results, round_start_s, settings)


def admit_arrivals(
    state: MechanismState,
    jobs: Iterable[NewJob],
    settings: MechanismSettings,
    rates: Rates,
    elastic_types: Sequence[str] = (),
) -> list[tuple[NewJob, Admission]]:
    """Admit the jobs that can run here, in order; return the others with their verdict (refused,
    or held until the cluster can run them: only where ``elastic_types`` are given)."""
    others = []
    for job in jobs:
        verdict = admission(state.gpus, job, rates, elastic_types=elastic_types)
        if verdict.verdict == "admit":
            admit(state, job, settings, rates)
        else:
            others.append((job, verdict))
    return others


@dataclass(frozen=True, slots=True)
class Admitted:
    """A boundary's admission through an admission policy (``admit_through``)."""

    others: list[tuple[NewJob, Admission]]  # refused, or held until workers join (feasibility)
    queued: list[tuple[NewJob, str]]  # feasible, waiting in the admission queue: with why
    error: str = ""  # why the policy's answer was not used (then every feasible job joined)


def admit_through(
    state: MechanismState,
    policy: AdmissionPolicy,
    queue: Sequence[NewJob],
    jobs: Iterable[NewJob],
    settings: MechanismSettings,
    rates: Rates,
    now_s: float,
    elastic_types: Sequence[str] = (),
) -> Admitted:
    """``admit_arrivals`` with an admission policy after feasibility (core/seams/admission.py):
    the admission queue's jobs and the arrivals (in that order, which is arrival order) are
    checked as admit_arrivals checks them; of the feasible, the policy's choice joins now, in
    order, and the rest wait in the admission queue."""
    others: list[tuple[NewJob, Admission]] = []
    feasible: list[NewJob] = []
    for job in [*queue, *jobs]:
        verdict = admission(state.gpus, job, rates, elastic_types=elastic_types)
        if verdict.verdict == "admit":
            feasible.append(job)
        else:
            others.append((job, verdict))
    if not feasible:
        return Admitted(others, [])
    decision, error = decide(policy, view_of(state, feasible, rates, now_s))
    chosen = set(decision.admit)
    queued: list[tuple[NewJob, str]] = []
    for job in feasible:
        if job.job_id in chosen:
            state.admitted_at_s[admit(state, job, settings, rates).index] = now_s
        else:
            queued.append((job, decision.reason_for(job.job_id)))
    if len(state.admitted_at_s) > 2 * (len(state.jobs) + len(state.completed)) + 64:
        keep = set(state.jobs) | {j.index for j in state.completed}
        state.admitted_at_s = {i: t for i, t in state.admitted_at_s.items() if i in keep}
    return Admitted(others, queued, error)


def force_reset_when_idle(state: MechanismState) -> None:
    """Nothing ran last round and no job is on its way: re-solve at this boundary whatever the
    minimum interval says (Gavel does this by zeroing its last reset time; without it, jobs
    admitted since the last solve would wait, with the cluster idle, for a change that never
    comes)."""
    state.last_reset_s = 0.0


def begin_reset(
    state: MechanismState, now_s: float, settings: MechanismSettings, *, force: bool = False, rates: Rates | None = None
) -> bool:
    """True (and the ledgers reset) when the allocation must be recomputed now (``force``: after
    a change, whatever the minimum interval says). With estimated ``rates``, every entry takes the
    latest estimates first: the policy solves on them, the planner plans on them."""
    if state.resolve_at_s is not None and now_s >= state.resolve_at_s:
        state.needs_allocation = True  # the policy said its answer may have changed by now
        state.resolve_at_s = None
    if not reset_due(state, now_s, settings, force=force):
        return False
    if rates is not None and rates.explicit:
        refresh_throughputs(state, rates)
    advance_isolated_time(state)
    reset_ledgers(state, now_s, settings)
    return True


@dataclass(frozen=True, slots=True)
class RoundPlan:
    assignment: dict[Entry, Placement]  # in placement order
    kept: frozenset[Entry]  # entries that keep last round's GPUs (lease extensions)
    extended: int
    opportunities: int
    jobs_waiting: int  # active jobs not in this round
    profiled: frozenset[Entry] = frozenset()  # entries run to measure what the estimator lacks
    # why a seam's plug-in was not used this round ("launch", "placement" -> the reason): the
    # shell logs each once; the round ran its default instead
    seam_errors: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class RoundReport:
    """One dispatched round, for metrics: when, how busy each type was, the queue, the leases."""

    round_id: int
    start_s: float
    end_s: float
    busy_gpus_by_type: dict[str, int]
    busy_gpu_seconds_by_type: dict[str, float]
    jobs_running: int
    jobs_waiting: int
    leases_extended: int
    lease_opportunities: int
    reset: bool
    leases: int = 0  # leases dispatched (kept ones included): the moves are leases - extended


def round_report(
    state: MechanismState, round_id: int, start_s: float, plan: RoundPlan, results: Iterable[LeaseResult], reset: bool
) -> RoundReport:
    end_s, busy, busy_s, running = lease_totals(state, start_s, results)
    return RoundReport(
        round_id, start_s, end_s, busy, busy_s, running, plan.jobs_waiting, plan.extended, plan.opportunities, reset,
        len(plan.assignment),
    )


def lease_totals(
    state: MechanismState, start_s: float, results: Iterable[LeaseResult]
) -> tuple[float, dict[str, int], dict[str, float], int]:
    """(when the round's last lease ended, GPUs leased per type, GPU-seconds per type, jobs
    running) of a round's leases. The GPU-seconds are summed exactly rounded (math.fsum), so
    they do not depend on the leases' order: a round the simulator advances without planning
    it (sim/quiet.py) runs last round's leases in last round's order, which the priorities may
    have reordered since, and must record the same floats."""
    busy = dict.fromkeys(state.gpus, 0)
    terms: dict[str, list[float]] = {w: [] for w in state.gpus}
    end_s = start_s
    running = 0
    for lease in results:
        placement, finish_s = lease.placement, lease.finish_s
        w, gpus = placement.accelerator_type, len(placement.worker_ids)
        busy[w] += gpus
        terms[w].append(gpus * (finish_s - start_s))
        if finish_s > end_s:  # max(end_s, finish_s), without the call
            end_s = finish_s
        running += len(lease.entry)
    return end_s, busy, {w: math.fsum(t) for w, t in terms.items()}, running


def open_round(
    state: MechanismState, now_s: float, settings: MechanismSettings, shuffle: Shuffle,
    profiling: Sequence[ProfilingPick] = (),
    chosen: Chosen = DEFAULTS,
) -> RoundPlan:
    """Priorities, pick and place (with the profiling runs chosen for this round first);
    ``chosen``: the seams' choices (core/seams/), whose defaults are this function's own code."""
    order = type_order(state, settings)
    if settings.shuffle_type_order:
        shuffle(order)  # once per boundary, even an idle one, as Gavel draws
    reserved = [(p.entry, p.accelerator_type) for p in profiling]
    profiled = frozenset(entry for entry, _ in reserved)
    lists = ledger_lists(state)  # a few rows: the ledgers read once as lists for every pass (None: numpy)
    behind = behind_jobs(state, now_s, settings)  # fallen behind: no hold keeps them waiting, no move is charged
    reserved += fit_held_columns(state, held_columns(state, now_s, settings, lists), reserved, lists, behind)  # moves not yet paid for
    queues = plan_queues(state, settings, lists, behind)
    picked = pick_columns(state, queues, order, settings, reserved=reserved)
    errors: list[tuple[str, str]] = []
    if chosen.launch is not None:
        picked, error = launch_with(chosen.launch, state, picked, profiled)
        if error:
            errors.append(("launch", error))
    if chosen.placement is None:
        assignment = place(state, picked, order, settings, forced=profiled)
    else:
        assignment, error = place_with(chosen.placement, state, picked, order, settings, profiled)
        if error:
            errors.append(("placement", error))
        remember_placements(state, assignment)
    kept, state.stretch_rounds = kept_and_stretches(state.previous_assignment, state.stretch_rounds, assignment)
    extended, opportunities = count_extensions(state, assignment, kept)
    state.leases_extended += extended
    state.lease_opportunities += opportunities
    state.previous_assignment = assignment
    record_first_runs(state, assignment, now_s, continues_within_s=settings.round_s / 2)
    running = sum(map(len, assignment))
    return RoundPlan(assignment, kept, extended, opportunities, len(state.jobs) - running, profiled, tuple(errors))
