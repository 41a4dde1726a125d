"""A policy plug-in: weighted share, each type's GPUs divided in proportion to weight x speed.

On accelerator type k with N_k GPUs, job j gets the time fraction

    X[j, k] = N_k * w_j * T[j, k] / sum_i (s_i * w_i * T[i, k])

(w: priority weight, T: steps/s of the job's gang alone on k, s: its GPUs), so the jobs that run
fastest on a type get most of it, and a job with twice the weight gets twice the share. Every
type is used in full: sum_j s_j * X[j, k] = N_k. A job's fractions over the types may then add
up to more than 1 (all of its time); its row is scaled down to 1, which leaves GPUs idle rather
than giving a job more time than there is. No solver: a few numpy operations, whatever the
number of jobs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from policy_service.core import Allocation, PairShares, Problem, Status


@dataclass(frozen=True)
class WeightedShare:
    """Each type's GPUs shared by priority weight x throughput; a job's total capped at 1."""

    name: str = "weighted_share"

    def allocate(self, problem: Problem) -> Allocation:
        started = time.perf_counter()
        # (n, K) each job's claim on each type: its weight times its speed there
        claims = problem.priority_weights[:, None] * problem.throughputs_steps_per_s
        # (K,) the GPUs those claims ask for in all: a gang of s GPUs holds s of them
        demand = (problem.scale_factors[:, None] * claims).sum(axis=0)
        per_claim = np.divide(problem.worker_counts, demand, out=np.zeros(problem.num_types), where=demand > 0)
        fractions = claims * per_claim[None, :]
        totals = fractions.sum(axis=1, keepdims=True)
        fractions = np.divide(fractions, np.maximum(totals, 1.0))
        fractions.setflags(write=False)
        return Allocation(
            policy=self.name,
            status=Status.OPTIMAL,
            job_ids=problem.job_ids,
            worker_types=problem.worker_types,
            job_fractions=fractions,
            pairs=PairShares.none(problem.num_jobs, problem.num_types),
            solve_time_s=time.perf_counter() - started,
        )
