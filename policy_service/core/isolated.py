"""Static shares: ``isolated`` (Gavel's isolated.py) and ``proportional``.

isolated: every job gets 1/n of each type's GPUs, X[j, k] = N_k / (n * s_j), scaled down so
    that no job exceeds 100% of its time (the baseline of finish-time fairness).
proportional: every job gets the same fraction alpha of each type's time, in proportion to the
    type's size: X[j, k] = alpha * N_k / sum_k N_k, alpha = min(1, sum_k N_k / sum_j s_j) so the
    cluster is not oversubscribed. (Gavel's ProportionalPolicy is only the normalisation of
    max-min fairness — alpha = 1 regardless of load, which oversubscribes the cluster as soon as
    there are more GPUs requested than exist; as a policy we scale it to fit.)
Deterministic; no solver.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from policy_service.core.allocation import Allocation, PairShares, Status, _readonly
from policy_service.core.baselines import isolated_fractions
from policy_service.core.problem import Problem


def _static(name: str, problem: Problem, fractions: np.ndarray, started: float) -> Allocation:
    return Allocation(
        policy=name, status=Status.OPTIMAL, job_ids=problem.job_ids, worker_types=problem.worker_types,
        job_fractions=_readonly(np.ascontiguousarray(fractions, dtype=float)),
        pairs=PairShares.none(problem.num_jobs, problem.num_types),
        objective=None, solve_time_s=time.perf_counter() - started,
    )


@dataclass(frozen=True)
class Isolated:
    name: str = "isolated"

    def allocate(self, problem: Problem) -> Allocation:
        started = time.perf_counter()
        return _static(self.name, problem, isolated_fractions(problem), started)


@dataclass(frozen=True)
class Proportional:
    name: str = "proportional"

    def allocate(self, problem: Problem) -> Allocation:
        started = time.perf_counter()
        counts = problem.worker_counts
        requested = float(problem.scale_factors.sum())
        alpha = min(1.0, counts.sum() / requested) if requested > 0 else 1.0
        fractions = np.broadcast_to(alpha * counts / counts.sum(), (problem.num_jobs, problem.num_types))
        return _static(self.name, problem, fractions, started)


def isolated() -> Isolated:
    return Isolated()


def proportional() -> Proportional:
    return Proportional()
