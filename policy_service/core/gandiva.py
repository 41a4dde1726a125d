"""Gandiva-style packing (Gavel's gandiva.py; Xiao et al., OSDI 2018), heterogeneity-agnostic.

When the jobs ask for no more GPUs than the cluster has, every job gets an equal share (as
``isolated``). Otherwise jobs are packed in random pairs (same scale factor, drawn from the
injected Generator) and every "combination" — a pair or a job left alone — gets an equal share:
X[c, k] = N_k / (m * s_c), scaled so that no job exceeds 100% of its time (m combinations).
Pairs from the previous allocation (``problem.previous``) are kept while both jobs remain and
their normalised packed throughput, summed over all types, is at least 1 (Gavel keeps them in
the policy object; it also remembers pairs through rounds where the cluster was not full,
which a stateless policy cannot). Only pairs the problem lists as colocatable are formed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from policy_service.core.allocation import Allocation, PairShares, Status, _readonly
from policy_service.core.baselines import isolated_fractions
from policy_service.core.gavel_gandiva import gavel_gandiva
from policy_service.core.problem import Problem


def _pair_score(problem: Problem, a: int, b: int) -> float:
    """Gavel's _get_normalized_throughput: sum over types and both jobs of packed / alone,
    0 if any packed throughput is 0."""
    index, tput = problem.colocation.job_pair_throughputs(np.array([a]), np.array([b]))
    if index[0] < 0 or (tput[0] <= 0).any():
        return 0.0
    alone = problem.throughputs_steps_per_s[[a, b]].T  # (K, 2)
    with np.errstate(divide="ignore"):
        return float(np.where(alone > 0, tput[0] / np.where(alone > 0, alone, 1.0), 0.0).sum())


@dataclass(frozen=True, eq=False)
class Gandiva:
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    name: str = "gandiva"
    gavel_state: bool = False  # Gavel's exact behaviour, state carried in policy_state
    seed: int = 0

    def allocate(self, problem: Problem) -> Allocation:
        started = time.perf_counter()
        n, num_types = problem.num_jobs, problem.num_types
        if self.gavel_state:
            singles, pairs, pair_x, state = gavel_gandiva(problem, self.seed)
            result = self._result(problem, singles, list(zip(pairs, pair_x, strict=True)), started)
            return replace(result, policy_state=state)
        counts = problem.worker_counts
        if problem.scale_factors.sum() <= counts.sum():
            return self._result(problem, isolated_fractions(problem), [], started)
        pairs: list[tuple[int, int]] = []
        paired: set[int] = set()
        if problem.previous is not None:
            for (a, b), fractions in zip(problem.previous.pair_jobs.tolist(), problem.previous.pair_fractions):
                if fractions.sum() > 0 and a not in paired and b not in paired and _pair_score(problem, a, b) >= 1.0:
                    pairs.append((min(a, b), max(a, b)))
                    paired.update((a, b))
        alone = [j for j in range(n) if j not in paired]
        attempts = len(alone)
        for _ in range(attempts):
            if len(alone) < 2:
                break
            first, second = self.rng.choice(len(alone), size=2, replace=False)
            a, b = alone[int(first)], alone[int(second)]
            if problem.scale_factors[a] != problem.scale_factors[b]:
                continue
            if problem.colocation.job_pair_throughputs(np.array([a]), np.array([b]))[0][0] < 0:
                continue
            alone.remove(a)
            alone.remove(b)
            pairs.append((min(a, b), max(a, b)))
        combinations = len(alone) + len(pairs)
        share = counts[None, :] / combinations
        singles = np.zeros((n, num_types))
        if alone:
            singles[alone] = share / problem.scale_factors[alone, None]
        pair_sf = np.asarray([problem.scale_factors[a] for a, _ in pairs], dtype=float)
        pair_x = share / pair_sf[:, None] if pairs else np.zeros((0, num_types))
        # Scale every combination to at most 100% of its time.
        singles /= np.maximum(singles.sum(axis=1), 1.0)[:, None]
        if pairs:
            pair_x = pair_x / np.maximum(pair_x.sum(axis=1), 1.0)[:, None]
        return self._result(problem, singles, list(zip(pairs, pair_x)), started)

    def _result(self, problem: Problem, singles: np.ndarray, pairs: list, started: float) -> Allocation:
        n, num_types = problem.num_jobs, problem.num_types
        if pairs:
            shares = PairShares.of_job_pairs(n, np.asarray([p for p, _ in pairs]), np.asarray([x for _, x in pairs]))
        else:
            shares = PairShares.none(n, num_types)
        return Allocation(
            policy=self.name, status=Status.OPTIMAL, job_ids=problem.job_ids, worker_types=problem.worker_types,
            job_fractions=_readonly(np.ascontiguousarray(singles)), pairs=shares, objective=None,
            solve_time_s=time.perf_counter() - started,
        )


def gandiva(*, rng: np.random.Generator | None = None, gavel_state: bool = False, seed: int = 0) -> Gandiva:
    """Gandiva. ``gavel_state``: keep pairs and Python's random stream between solves exactly as
    Gavel's simulator does (in ``policy_state``), for the `gavel` preset."""
    return Gandiva(rng if rng is not None else np.random.default_rng(0), gavel_state=gavel_state, seed=seed)
