"""Shortest remaining time first (SRTF), preemptive: the jobs closest to done take whole GPUs.

The classic preemptive shortest-remaining-processing-time rule (Schrage, "A proof of the
optimality of the shortest remaining processing time discipline", Operations Research 16(3),
1968; minimises mean completion time on one machine). As a baseline for deep-learning clusters
it is the "SRTF" of Tiresias (Gu et al., NSDI 2019) and of Gavel's own comparisons (Narayanan et
al., OSDI 2020): the scheduler is told each job's remaining work.

Each job's remaining time is ``steps_remaining`` over its steps/s, divided by its priority
weight (weighted SRPT; identical when every weight is 1):

- heterogeneity-aware (``srtf_perf``): steps/s on the fastest type its gang fits on; jobs in
  that order each take 100% of their time on the fastest type that still has room for the gang;
- agnostic (``srtf``): steps/s on the reference type (v100 when the cluster has it, as Gavel's
  agnostic makespan and FTF), and a random type with room (the injected Generator), as
  agnostic FIFO.

Ties go to the job that arrived first, then to input order. A job that does not fit where
there is still room is skipped, and smaller ones behind it go on (work-conserving; FIFO stops
instead). A job never runs where its steps/s is 0 or its gang does not fit.

How it differs from Gavel's LAS (max-min fairness): no sharing of time — a job runs all the
time or not at all — and no fairness: long jobs wait while shorter ones keep arriving. The
allocation changes only when the mechanism asks again (a job arrives or ends): between those,
a running job's remaining time only shrinks, so the order of the jobs it holds GPUs against
cannot change.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from policy_service.core.allocation import Allocation, PairShares, Status, _readonly
from policy_service.core.baselines import reference_type
from policy_service.core.problem import Problem
from policy_service.core.waterfilling import arrival_order


def runnable_types(problem: Problem) -> np.ndarray:
    """(n, K) where each job can run at all: its gang fits the type and its steps/s is > 0."""
    fits = problem.scale_factors[:, None] <= problem.gang_capacity[None, :]
    return fits & (problem.throughputs_steps_per_s > 0)


def remaining_time_s(problem: Problem, heterogeneity_aware: bool, reference: str | None = None) -> np.ndarray:
    """(n,) seconds each job still needs alone: on its fastest runnable type (aware), or at its
    speed on the reference type (agnostic). inf where that speed is 0."""
    tput = problem.throughputs_steps_per_s
    if heterogeneity_aware:
        speed = np.where(runnable_types(problem), tput, 0.0).max(axis=1, initial=0.0)
    else:
        speed = tput[:, reference_type(problem, reference)] if problem.num_jobs else np.zeros(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(speed > 0, problem.steps_remaining / np.where(speed > 0, speed, 1.0), np.inf)


def place_in_order(problem: Problem, order: np.ndarray, preference: np.ndarray) -> np.ndarray:
    """(n, K) whole-GPU fractions: jobs in ``order`` each take the type of highest ``preference``
    (-inf: never) that still has room for their gang; a job with none is skipped. The pass stops
    as soon as no type has a GPU left, so it costs O(jobs placed + jobs skipped)."""
    n, num_types = problem.num_jobs, problem.num_types
    fractions = np.zeros((n, num_types))
    free = problem.worker_counts.astype(float).copy()
    scale_factors = problem.scale_factors
    smallest_gang = float(scale_factors.min(initial=1))
    for j in order.tolist():
        if free.max(initial=0.0) < smallest_gang:
            break
        room = np.where(free >= scale_factors[j], preference[j], -np.inf)
        k = int(np.argmax(room))
        if room[k] == -np.inf:
            continue
        fractions[j, k] = 1.0
        free[k] -= scale_factors[j]
    return fractions


def take_whole_gangs(
    problem: Problem, order: np.ndarray, heterogeneity_aware: bool, rng: np.random.Generator
) -> np.ndarray:
    """(n, K) ``place_in_order`` with the preference the whole-GPU schedulers share (SRTF,
    Tiresias): each job's fastest type with room (aware), else a random one (agnostic: one draw
    from ``rng`` per job and type, every solve)."""
    runnable = runnable_types(problem)
    if heterogeneity_aware:
        preference = np.where(runnable, problem.throughputs_steps_per_s, -np.inf)
    else:
        preference = np.where(runnable, rng.random((problem.num_jobs, problem.num_types)), -np.inf)
    return place_in_order(problem, order, preference)


def whole_gang_allocation(name: str, problem: Problem, fractions: np.ndarray, started_s: float, **fields: object) -> Allocation:
    """A whole-GPU heuristic's answer (SRTF, Tiresias, Optimus): ``fractions`` (n, K), nothing
    packed, no objective, solved since ``started_s`` (time.perf_counter); ``fields``: Allocation's
    others (policy_state, valid_for_s)."""
    return Allocation(
        policy=name, status=Status.OPTIMAL, job_ids=problem.job_ids, worker_types=problem.worker_types,
        job_fractions=_readonly(fractions), pairs=PairShares.none(problem.num_jobs, problem.num_types),
        objective=None, solve_time_s=time.perf_counter() - started_s, **fields,  # type: ignore[arg-type]
    )


def priority_order(problem: Problem, keys: np.ndarray) -> np.ndarray:
    """Job indices by ``keys`` (smallest first), ties by arrival (oldest first), then input order."""
    return np.lexsort((np.arange(problem.num_jobs), arrival_order(problem), keys))


@dataclass(frozen=True, eq=False)
class Srtf:
    heterogeneity_aware: bool = True
    reference: str | None = None
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    name: str = "srtf_perf"
    reads_previous: ClassVar[bool] = False

    def allocate(self, problem: Problem) -> Allocation:
        started = time.perf_counter()
        remaining = remaining_time_s(problem, self.heterogeneity_aware, self.reference)
        order = priority_order(problem, remaining / problem.priority_weights)
        fractions = take_whole_gangs(problem, order, self.heterogeneity_aware, self.rng)
        return whole_gang_allocation(self.name, problem, fractions, started)


def srtf(
    heterogeneity_aware: bool = True, *, reference: str | None = None, rng: np.random.Generator | None = None
) -> Srtf:
    """Shortest remaining time first: srtf (agnostic, v100 times, random types), srtf_perf."""
    return Srtf(
        heterogeneity_aware, reference, rng if rng is not None else np.random.default_rng(0),
        "srtf_perf" if heterogeneity_aware else "srtf",
    )
