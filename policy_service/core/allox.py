"""AlloX (Le et al., EuroSys 2020; Gavel's allox.py): minimise the sum of completion times of
single-GPU jobs on heterogeneous workers, as an assignment problem.

Each job j and worker w of type k has a processing time p[j, k] = steps_remaining_j / T[j, k].
Putting j in the r-th-from-last position on a worker costs r * p[j, k] (it delays itself and the
r - 1 jobs after it); a minimum-cost assignment of jobs to (worker, position) slots minimises
the total completion time. Each worker runs the job in its last-filled (highest r) slot now:
that job gets 100% of its time on the worker's type. Jobs that held a whole GPU in the previous
allocation keep it until they finish (Gavel keeps them in the policy object; here they come in
``problem.previous``), and their GPUs are not offered again.

Differences from Gavel, both exact:
- Gavel adds each job's waiting time to all of its costs; a constant per job does not change
  which assignment is cheapest, so it is left out.
- Gavel builds all n x (workers x n) slots (32 M cells at 2,048 jobs on 1,536 GPUs). Workers of
  one type are identical, so the slots needed are bounded: we solve with positions up to R and
  double R while the optimum uses position R on some type. That is exact: an unused slot has a
  zero dual price (complementary slackness), so any deeper slot, costing more on the same
  worker, has a nonnegative reduced cost and cannot improve the solution.
``alpha`` < 1 considers only the oldest max(alpha * m, workers) waiting jobs, as in Gavel.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from common.errors import ProblemError
from policy_service.core.allocation import Allocation, PairShares, Status, _readonly
from policy_service.core.problem import Problem
from policy_service.core.waterfilling import arrival_order

_ZERO_THROUGHPUT = 1e-10  # Gavel's stand-in for a zero throughput


@dataclass(frozen=True)
class AlloX:
    alpha: float = 1.0
    name: str = "allox"

    def allocate(self, problem: Problem) -> Allocation:
        started = time.perf_counter()
        n, num_types = problem.num_jobs, problem.num_types
        multi = np.flatnonzero(problem.scale_factors != 1)
        if len(multi):
            j = int(multi[0])
            raise ProblemError(
                f"jobs[{j}].scale_factor: policy {self.name!r} supports only single-GPU jobs "
                f"(job {problem.job_ids[j]!r} asks for {problem.scale_factors[j]})"
            )
        fractions = np.zeros((n, num_types))
        free = problem.worker_counts.astype(np.int64).copy()
        kept = np.zeros(n, dtype=bool)
        if problem.previous is not None:
            previous = problem.previous.job_fractions
            kept = previous.sum(axis=1) >= 1.0 - 1e-9
            fractions[kept] = previous[kept]
            free -= (previous[kept] >= 1.0 - 1e-9).sum(axis=0)
        free = np.maximum(free, 0)
        waiting = np.flatnonzero(~kept)
        waiting = waiting[np.argsort(arrival_order(problem)[waiting], kind="stable")]
        workers = int(free.sum())
        waiting = waiting[: max(int(self.alpha * len(waiting)), workers)]
        if len(waiting) and workers:
            first_jobs = _first_jobs(problem, waiting, free)
            for k, jobs in first_jobs.items():
                fractions[jobs, k] = 1.0
        return Allocation(
            policy=self.name, status=Status.OPTIMAL, job_ids=problem.job_ids, worker_types=problem.worker_types,
            job_fractions=_readonly(fractions), pairs=PairShares.none(n, num_types), objective=None,
            solve_time_s=time.perf_counter() - started,
        )


def _first_jobs(problem: Problem, jobs: np.ndarray, free: np.ndarray) -> dict[int, list[int]]:
    """Per type k: the jobs that start now on its free workers (one per worker used)."""
    tput = np.where(problem.throughputs_steps_per_s[jobs] > 0, problem.throughputs_steps_per_s[jobs], _ZERO_THROUGHPUT)
    processing_s = problem.steps_remaining[jobs, None] / tput  # (m, K)
    # Workers in Gavel's order: types sorted by name, each type's free workers in a row.
    types = sorted(range(problem.num_types), key=lambda k: problem.worker_types[k])
    worker_type = np.concatenate([np.full(free[k], k, dtype=np.int64) for k in types])
    num_jobs, num_workers = len(jobs), len(worker_type)
    depth = max(1, -(-num_jobs // num_workers))  # ceil: enough slots for everyone
    while True:
        depth = min(depth, num_jobs)
        # Columns position-major, as Gavel: [all workers at r=1, all workers at r=2, ...].
        position = np.repeat(np.arange(1, depth + 1), num_workers)
        column_type = np.tile(worker_type, depth)
        cost = processing_s[:, column_type] * position[None, :]
        rows, cols = _linear_sum_assignment(cost)
        deepest = position[cols].max()
        if deepest < depth or depth == num_jobs:
            break
        depth *= 2
    worker = cols % num_workers
    top: dict[int, tuple[int, int]] = {}  # worker -> (position, job)
    for row, w, r in zip(rows.tolist(), worker.tolist(), position[cols].tolist()):
        if w not in top or r > top[w][0]:
            top[w] = (r, int(jobs[row]))
    started: dict[int, list[int]] = {}
    for w, (_, job) in top.items():
        started.setdefault(int(worker_type[w]), []).append(job)
    return started


def allox(*, alpha: float = 1.0) -> AlloX:
    return AlloX(alpha)


def _linear_sum_assignment(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # scipy.optimize is imported here, when AlloX assigns, not with the policy library: it costs
    # ~0.3-0.5 s (scipy.special, scipy.linalg), which every `gavel simulate` of another policy paid.
    from scipy.optimize import linear_sum_assignment  # noqa: PLC0415

    return linear_sum_assignment(cost)
