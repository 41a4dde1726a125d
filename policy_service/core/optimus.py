"""Optimus-style throughput-greedy: GPUs go, greedily, where they buy the most progress.

Peng et al., "Optimus: An Efficient Dynamic Resource Scheduler for Deep Learning Clusters",
EuroSys 2018, section 5.1: Optimus gives each resource unit, in turn, to the job whose
completion time it shortens most per unit, from each job's fitted speed function and its
remaining work. Here a job's gang size is its own (the trace's scale factor), so the unit is a
whole gang of a job on one type, and its marginal gain is the job's normalised progress rate per
GPU there: the fraction of its remaining work that one second on that gang does, per GPU,

    gain[j, k] = w_j * T[j, k] / (R_j * s_j)

(the reciprocal of the GPU-seconds the job would still need on type k). The greedy takes the
(job, type) of the largest gain whose type still has room for the gang, gives that job 100% of
its time there, and goes on until no GPU is left or no job fits (a job that fits nowhere is
skipped: work-conserving); each job takes one gang.

- heterogeneity-aware (``optimus_perf``): the greedy picks the type too — a job goes where its
  progress per GPU is highest among the types with room, and the order of the jobs is the order
  of their best remaining (job, type) pairs, so a job much faster on one type can win it over a
  job slightly shorter everywhere;
- agnostic (``optimus``): every type runs each job at its reference-type speed (v100 when
  present), the type is random among those with room (the injected Generator).

Unlike SRTF (srtf.py) the gain is per GPU: a gang of 8 must be 8 times as close to done as a
single-GPU job to go first, as Optimus weighs a job's gain by the resources it takes. Unlike
Gavel's max_sum_throughput it weighs steps by the work left (progress, not steps, is what
shortens a completion).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from policy_service.core.allocation import Allocation
from policy_service.core.baselines import agnostic_reference_throughputs
from policy_service.core.problem import Problem
from policy_service.core.srtf import (
    place_in_order,
    priority_order,
    runnable_types,
    whole_gang_allocation,
)


def marginal_gain(problem: Problem) -> np.ndarray:
    """(n, K) normalised progress rate per GPU of each job on each type, times its weight;
    -inf where it cannot run; inf for a job with nothing left (it finishes at once)."""
    tput = problem.throughputs_steps_per_s
    per_gpu = problem.priority_weights[:, None] * tput / problem.scale_factors[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = np.where(problem.steps_remaining[:, None] > 0, per_gpu / problem.steps_remaining[:, None], np.inf)
    return np.where(runnable_types(problem), gain, -np.inf)


def greedy(problem: Problem, gain: np.ndarray) -> np.ndarray:
    """(n, K) whole-gang fractions: (job, type) pairs by decreasing ``gain`` (ties: the older job,
    then input order, then type order), each taken when its job has none yet and its type has
    room for the gang. One sort, then one pass that stops when no GPU is left."""
    n, num_types = gain.shape
    fractions = np.zeros((n, num_types))
    job_of = np.repeat(np.arange(n), num_types)
    type_of = np.tile(np.arange(num_types), n)
    flat = gain.ravel()
    candidates = np.flatnonzero(flat > -np.inf)
    age = -problem.time_since_arrival_s[job_of[candidates]]
    order = candidates[np.lexsort((type_of[candidates], job_of[candidates], age, -flat[candidates]))]
    free = problem.worker_counts.astype(float).copy()
    placed = np.zeros(n, dtype=bool)
    smallest_gang = float(problem.scale_factors.min(initial=1))
    scale_factors = problem.scale_factors
    for j, k in zip(job_of[order].tolist(), type_of[order].tolist()):
        if placed[j] or free[k] < scale_factors[j]:
            if free.max(initial=0.0) < smallest_gang:
                break
            continue
        fractions[j, k] = 1.0
        free[k] -= scale_factors[j]
        placed[j] = True
    return fractions


@dataclass(frozen=True, eq=False)
class Optimus:
    heterogeneity_aware: bool = True
    reference_type: str | None = None
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    name: str = "optimus_perf"
    reads_previous: ClassVar[bool] = False

    def allocate(self, problem: Problem) -> Allocation:
        started = time.perf_counter()
        n, num_types = problem.num_jobs, problem.num_types
        if self.heterogeneity_aware:
            fractions = greedy(problem, marginal_gain(problem))
        else:
            # jobs by their reference-type gain; each on a random type with room
            view = agnostic_reference_throughputs(problem, self.reference_type) if n else problem
            best = np.where(runnable_types(problem), marginal_gain(view), -np.inf).max(axis=1, initial=-np.inf)
            preference = np.where(runnable_types(problem), self.rng.random((n, num_types)), -np.inf)
            fractions = place_in_order(problem, priority_order(problem, -best), preference)
        return whole_gang_allocation(self.name, problem, fractions, started)


def optimus(
    heterogeneity_aware: bool = True, *, reference_type: str | None = None, rng: np.random.Generator | None = None
) -> Optimus:
    """Optimus-style throughput-greedy: optimus (agnostic, reference speeds, random types), optimus_perf."""
    return Optimus(
        heterogeneity_aware, reference_type, rng if rng is not None else np.random.default_rng(0),
        "optimus_perf" if heterogeneity_aware else "optimus",
    )
