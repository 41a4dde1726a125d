"""First in, first out (Gavel's fifo.py): jobs in arrival order take whole GPUs until none fit.

Each job, oldest first, gets 100% of its time on one type that still has room for its gang:
- heterogeneity-aware (fifo_perf): the type where it runs fastest;
- agnostic (fifo): a random type, drawn from the injected Generator; jobs that held a type in
  the previous allocation (``problem.previous``) keep it, as in Gavel, where a running job is
  never moved;
- space sharing (fifo_packed): aware placement, then each job still queued joins the placed
  single job (same scale factor) whose pair has the highest normalised packed throughput
  (sum over the two jobs of packed / alone steps/s on that type), if that exceeds
  ``packing_threshold`` (1.5); the first job that finds no partner ends the packing, so no job
  jumps the queue.
The first job that fits on no type ends the pass (strict FIFO). A job whose throughput on its
chosen type is 0 is skipped, as Gavel does.

``type_choice="gavel_last_type"`` reproduces what Gavel's agnostic FIFO (commit c4fa400)
actually does: it draws a random index but then assigns the job to the stale loop variable —
the last type, by name, of those that still have free GPUs — so jobs pile onto one type (its
recorded runs use under a third of a 4:4:4 cluster). Only for the `gavel` simulator preset; it can oversubscribe
that type, which the mechanism then resolves by priority.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from common.errors import PolicyParameterError
from policy_service.core.allocation import Allocation, PairShares, Status, _readonly
from policy_service.core.gavel_fifo import gavel_fifo_fractions
from policy_service.core.problem import Problem
from policy_service.core.waterfilling import arrival_order

_TYPE_CHOICES = ("random", "gavel_last_type")


def normalised_packed_throughput(problem: Problem, job_a: int, job_b: int, k: int) -> float:
    """Sum over the two jobs of packed / isolated steps/s on type k (Gavel's packing score);
    0 when the pair is not listed."""
    index, tput = problem.colocation.job_pair_throughputs(np.array([job_a]), np.array([job_b]))
    if index[0] < 0:
        return 0.0
    alone = problem.throughputs_steps_per_s[[job_a, job_b], k]
    packed = tput[0, k]
    return float(sum(p / a for p, a in zip(packed, alone) if p > 0 and a > 0))


@dataclass(frozen=True, eq=False)
class Fifo:
    heterogeneity_aware: bool = True
    space_sharing: bool = False
    packing_threshold: float = 1.5
    type_choice: str = "random"
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    name: str = "fifo_perf"
    seed: int = 0  # Gavel's random.Random seed, for type_choice="gavel_last_type"

    def allocate(self, problem: Problem) -> Allocation:
        started = time.perf_counter()
        n, num_types = problem.num_jobs, problem.num_types
        if not self.heterogeneity_aware and self.type_choice == "gavel_last_type":
            fractions, state = gavel_fifo_fractions(problem, self.seed)
            return Allocation(
                policy=self.name, status=Status.OPTIMAL, job_ids=problem.job_ids, worker_types=problem.worker_types,
                job_fractions=_readonly(fractions), pairs=PairShares.none(n, num_types),
                objective=None, solve_time_s=time.perf_counter() - started, policy_state=state,
            )
        available = problem.worker_counts.copy()
        placed: dict[int, int] = {}  # job -> type, in placement order (Gavel iterates this order)
        if not self.heterogeneity_aware and problem.previous is not None:
            # Agnostic FIFO never moves a running job: keep whole previous placements.
            for j in np.argsort(arrival_order(problem)):
                row = problem.previous.job_fractions[j]
                if row.max(initial=0.0) >= 1.0 - 1e-9:
                    k = int(np.argmax(row))
                    placed[int(j)] = k
                    available[k] -= problem.scale_factors[j]
        queue = [int(j) for j in np.argsort(arrival_order(problem)) if int(j) not in placed]
        queue = self._place(problem, queue, available, placed)
        pairs: list[tuple[int, int, int]] = []
        if self.space_sharing:
            pairs = self._pack(problem, queue, placed)
        job_fractions = np.zeros((n, num_types))
        for j, k in placed.items():
            job_fractions[j, k] = 1.0
        pair_jobs = np.asarray([(a, b) for a, b, _ in pairs], dtype=np.int64).reshape(-1, 2)
        pair_fractions = np.zeros((len(pairs), num_types))
        for p, (_, _, k) in enumerate(pairs):
            pair_fractions[p, k] = 1.0
        return Allocation(
            policy=self.name, status=Status.OPTIMAL, job_ids=problem.job_ids, worker_types=problem.worker_types,
            job_fractions=_readonly(job_fractions),
            pairs=PairShares.of_job_pairs(n, pair_jobs, pair_fractions) if pairs else PairShares.none(n, num_types),
            objective=None, solve_time_s=time.perf_counter() - started,
        )

    def _place(self, problem: Problem, queue: list[int], available: np.ndarray, placed: dict[int, int]) -> list[int]:
        """Place queued jobs in order; return the jobs still queued."""
        tput = problem.throughputs_steps_per_s
        # Gavel keeps a list of types with free GPUs, sorted by name, and drops a type from it
        # only when its count reaches exactly 0.
        by_name = sorted(range(problem.num_types), key=lambda k: problem.worker_types[k])
        open_types = [k for k in by_name if available[k] > 0]
        while queue and open_types:
            j = queue.pop(0)
            sf = problem.scale_factors[j]
            candidates = [k for k in open_types if available[k] >= sf]
            if not candidates:
                queue.insert(0, j)
                break
            if self.heterogeneity_aware:
                choice = max(range(len(candidates)), key=lambda i: (tput[j, candidates[i]], -i))
                k = candidates[choice]
            else:
                choice = int(self.rng.integers(len(candidates)))
                # Gavel's stale loop variable: the last type (by name) that still had free GPUs
                # when this pass started or since, whatever was drawn.
                k = candidates[choice] if self.type_choice == "random" else open_types[-1]
            if tput[j, k] > 0:
                placed[j] = k
                available[k] -= sf
                if available[k] == 0:
                    open_types.remove(candidates[choice])
        return queue

    def _pack(self, problem: Problem, queue: list[int], placed: dict[int, int]) -> list[tuple[int, int, int]]:
        pairs: list[tuple[int, int, int]] = []
        for j in queue:
            best_score, partner = self.packing_threshold, None
            for other, k in placed.items():
                if problem.scale_factors[other] != problem.scale_factors[j]:
                    continue
                score = normalised_packed_throughput(problem, other, j, k)
                if score > best_score:
                    best_score, partner = score, other
            if partner is None:
                break  # FIFO: nobody jumps the queue
            k = placed.pop(partner)
            pairs.append((min(partner, j), max(partner, j), k))
        return pairs


def fifo(
    heterogeneity_aware: bool = True,
    space_sharing: bool = False,
    *,
    packing_threshold: float = 1.5,
    type_choice: str = "random",
    rng: np.random.Generator | None = None,
    seed: int = 0,
) -> Fifo:
    """FIFO. Gavel: fifo (agnostic, random types), fifo_perf, fifo_packed."""
    if space_sharing and not heterogeneity_aware:
        raise PolicyParameterError("space_sharing=True needs heterogeneity_aware=True")
    if type_choice not in _TYPE_CHOICES:
        raise PolicyParameterError(f"type_choice must be one of {', '.join(_TYPE_CHOICES)}, got {type_choice!r}")
    name = "fifo_packed" if space_sharing else ("fifo_perf" if heterogeneity_aware else "fifo")
    return Fifo(
        heterogeneity_aware, space_sharing, packing_threshold, type_choice,
        rng if rng is not None else np.random.default_rng(0), name, seed,
    )
