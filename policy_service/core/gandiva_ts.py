"""Gandiva's time-slicing with introspective packing (Xiao et al., "Gandiva: Introspective Cluster
Scheduling for Deep Learning", OSDI 2018, sections 3.1-3.2 and 4), heterogeneity-agnostic.

Gandiva runs more jobs than GPUs by suspend-resume: when the cluster is oversubscribed the jobs
take turns on the GPUs, round-robin, each suspended at a mini-batch boundary and resumed later
(here the rounds realise the turns: the mechanism's time ledgers give every job its share of
the rounds). To cut the turns it packs jobs, introspectively: it tries two jobs on one GPU,
measures them, and keeps the pair only while it pays off (the pair does more work packed than
the two would by taking turns).

    occupants  the jobs alone and the kept pairs; each takes one gang of its scale factor
    packing    only while oversubscribed (the occupants ask for more GPUs than exist): pairs of
               the same scale factor whose packed throughput pays off (``gain > pack_above``,
               below) are kept, the pairs of the allocation in force first (introspection:
               a measured pair is kept while it still pays), then the best; no more than needed
               to end the oversubscription
    gain       of a pair: each member's packed over alone steps/s, summed over the two,
               averaged over the types where it can run, weighted by their GPUs (Gandiva knows
               no types: it measures on whatever GPU it got). 1 is what taking turns gives.
    time       every occupant the same share, min(1, GPUs / GPUs asked for), spread over the
               types in proportion to their GPUs (round-robin over every GPU); a type an
               occupant cannot run on is left out, and a type asked for beyond its GPUs is
               scaled down

How it differs from ``gandiva`` (gandiva.py, Gavel's model of Gandiva): there the pairs are
drawn at random (kept while their normalised throughput summed over types is at least 1) and
every job is paired when oversubscribed; here the pairs are the measured best, only those that
pay off (a pair that slows its members below taking turns is never formed, and is unpacked
when it stops paying), and only as many as the oversubscription needs; the rest take turns.
There is no heterogeneity-aware variant: Gandiva's decisions come from measurement on the GPUs
it has, not from a model of the types (Gavel's heterogeneity-aware packing is
``max_min_fairness_packed``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from policy_service.core.allocation import Allocation, PairShares, Status, _readonly
from policy_service.core.problem import Problem
from policy_service.core.srtf import runnable_types


def pair_gains(problem: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every pair of jobs that may share GPUs: ((P, 2) job indices a < b, (P,) gain, (P, K)
    where the pair can run packed: the gang fits and both keep some speed)."""
    n = problem.num_jobs
    first, second = np.triu_indices(n, 1)
    same = problem.scale_factors[first] == problem.scale_factors[second]
    listed = (problem.colocation.key_of_job[first] >= 0) & (problem.colocation.key_of_job[second] >= 0)
    first, second = first[same & listed], second[same & listed]
    index, packed = problem.colocation.job_pair_throughputs(first, second)  # (P, K, 2)
    listed = index >= 0
    first, second, index, packed = first[listed], second[listed], index[listed], packed[listed]
    alone = np.stack([problem.throughputs_steps_per_s[first], problem.throughputs_steps_per_s[second]], axis=2)
    fits = problem.scale_factors[first][:, None] <= problem.gang_capacity[None, :]
    usable = (index >= 0)[:, None] & fits & (packed > 0).all(axis=2) & (alone > 0).all(axis=2)
    with np.errstate(divide="ignore", invalid="ignore"):
        normalised = np.where(usable, (packed / np.where(alone > 0, alone, 1.0)).sum(axis=2), 0.0)
    weight = np.where(usable, problem.worker_counts[None, :], 0.0)
    gain = (normalised * weight).sum(axis=1) / np.maximum(weight.sum(axis=1), 1e-300)
    return np.stack([first, second], axis=1), gain, usable


def choose_pairs(
    problem: Problem, candidates: np.ndarray, gain: np.ndarray, pack_above: float
) -> np.ndarray:
    """Indices into ``candidates`` of the pairs kept: those paying off, the allocation in force's
    first, then by gain; each job in one pair; while the occupants ask for more GPUs than exist."""
    excess = float(problem.scale_factors.sum() - problem.worker_counts.sum())
    paying = np.flatnonzero(gain > pack_above)
    if excess <= 0 or not len(paying):
        return np.zeros(0, dtype=np.int64)
    kept_before = np.zeros(len(candidates), dtype=bool)
    if problem.previous is not None and len(problem.previous.pair_jobs):
        running = problem.previous.pair_fractions.sum(axis=1) > 0
        before = np.sort(problem.previous.pair_jobs[running], axis=1)
        codes = candidates[:, 0] * problem.num_jobs + candidates[:, 1]
        kept_before = np.isin(codes, before[:, 0] * problem.num_jobs + before[:, 1])
    order = paying[np.lexsort((paying, -gain[paying], ~kept_before[paying]))]
    used = np.zeros(problem.num_jobs, dtype=bool)
    chosen = []
    for p in order.tolist():
        a, b = candidates[p]
        if used[a] or used[b]:
            continue
        chosen.append(p)
        used[a] = used[b] = True
        excess -= problem.scale_factors[a]  # two gangs become one
        if excess <= 0:
            break
    return np.asarray(chosen, dtype=np.int64)


def time_slices(problem: Problem, gangs: np.ndarray, runnable: np.ndarray) -> np.ndarray:
    """(m, K) each occupant's share of time on each type: the same share for all, min(1, GPUs /
    GPUs asked for), over its runnable types in proportion to their GPUs; then each type's
    column scaled down to its GPUs where the occupants that can use it ask for more."""
    counts = problem.worker_counts
    share = min(1.0, float(counts.sum()) / max(float(gangs.sum()), 1e-300))
    spread = np.where(runnable, counts[None, :], 0.0)
    x = share * spread / np.maximum(spread.sum(axis=1, keepdims=True), 1e-300)
    used = (gangs[:, None] * x).sum(axis=0)
    return x * np.minimum(1.0, counts / np.maximum(used, 1e-300))[None, :]


@dataclass(frozen=True, eq=False)
class GandivaTimeSlicing:
    pack_above: float = 1.0
    name: str = "gandiva_ts"

    def __post_init__(self) -> None:
        if not self.pack_above >= 0:
            raise ValueError(f"pack_above: a normalised throughput >= 0, got {self.pack_above!r}")

    def allocate(self, problem: Problem) -> Allocation:
        started = time.perf_counter()
        n, num_types = problem.num_jobs, problem.num_types
        if problem.scale_factors.sum() > problem.worker_counts.sum():  # oversubscribed: packing may pay
            candidates, gain, usable = pair_gains(problem)
            chosen = choose_pairs(problem, candidates, gain, self.pack_above)
        else:
            candidates, usable = np.zeros((0, 2), dtype=np.int64), np.zeros((0, num_types), dtype=bool)
            chosen = np.zeros(0, dtype=np.int64)
        pairs = candidates[chosen]
        alone = np.ones(n, dtype=bool)
        alone[pairs.ravel()] = False
        singles = np.flatnonzero(alone)
        gangs = np.concatenate([problem.scale_factors[singles], problem.scale_factors[pairs[:, 0]]]).astype(float)
        runnable = np.concatenate([runnable_types(problem)[singles], usable[chosen]])
        x = time_slices(problem, gangs, runnable)
        fractions = np.zeros((n, num_types))
        fractions[singles] = x[: len(singles)]
        shares = (
            PairShares.of_job_pairs(n, pairs, x[len(singles):]) if len(pairs) else PairShares.none(n, num_types)
        )
        return Allocation(
            policy=self.name, status=Status.OPTIMAL, job_ids=problem.job_ids, worker_types=problem.worker_types,
            job_fractions=_readonly(fractions), pairs=shares, objective=None,
            solve_time_s=time.perf_counter() - started,
        )


def gandiva_time_slicing(*, pack_above: float = 1.0) -> GandivaTimeSlicing:
    """Gandiva's round-robin time-slicing with introspective packing (``gandiva_ts``)."""
    return GandivaTimeSlicing(float(pack_above))
