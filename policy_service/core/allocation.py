"""The output of every policy: time fractions per job (and per packed pair) and worker type.

Packed time travels grouped (:class:`PairShares`): the grouped LPs decide how much time a class
of interchangeable jobs spends with another class, not which two jobs meet. :func:`expand_pairs`
turns that into concrete job pairs whenever someone needs them (the JSON output, a mechanism
that places pairs); it lists O(n + classes^2) pairs instead of all O(n^2) of them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from policy_service.core.pair_expansion import expand_group_pairs


#: Time fractions below this are solver noise (interior-point methods leave ~1e-10 where the
#: optimum has 0): they are set to 0, and pairs with no more than this are not listed.
#: 1e-9 of a 360 s round is 0.4 us.
NOISE_FRACTION = 1e-9


class Status(enum.StrEnum):
    OPTIMAL = "optimal"
    OPTIMAL_INACCURATE = "optimal_inaccurate"
    INFEASIBLE = "infeasible"
    FAILED = "failed"


def _readonly(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class PairShares:
    """Time that jobs spend packed in pairs, by groups of interchangeable jobs.

    group_of_job  (n,)    group of each job (-1: in no group)
    group_pairs   (P, 2)  unordered group pairs, first <= second; (g, g) packs two different
                          jobs of group g
    pair_time     (P, K)  total pair time on each worker type: the sum, over the concrete job
                          pairs it stands for, of their time fractions. Each job of group a spends
                          pair_time / size(a) of its time with group b (2 * pair_time / size(a)
                          for a self pair); the pair occupies scale-factor GPUs while it runs.

    A pair of single jobs is the special case of groups of size one.
    """

    group_of_job: np.ndarray
    group_pairs: np.ndarray
    pair_time: np.ndarray

    @staticmethod
    def none(num_jobs: int, num_types: int) -> PairShares:
        return PairShares(
            group_of_job=_readonly(np.full(num_jobs, -1, dtype=np.int64)),
            group_pairs=_readonly(np.zeros((0, 2), dtype=np.int64)),
            pair_time=_readonly(np.zeros((0, num_types))),
        )

    @staticmethod
    def of_job_pairs(num_jobs: int, pair_jobs: np.ndarray, fractions: np.ndarray) -> PairShares:
        """Concrete job pairs ((P, 2) job indices, (P, K) fractions) as groups of one."""
        pair_jobs = np.sort(np.asarray(pair_jobs, dtype=np.int64).reshape(-1, 2), axis=1)
        return PairShares(
            group_of_job=_readonly(np.arange(num_jobs, dtype=np.int64)),
            group_pairs=_readonly(pair_jobs),
            pair_time=_readonly(np.asarray(fractions, dtype=float).reshape(len(pair_jobs), -1)),
        )

    @property
    def num_pairs(self) -> int:
        return int(self.group_pairs.shape[0])

    def group_sizes(self) -> np.ndarray:
        """(G,) number of jobs per group."""
        assigned = self.group_of_job[self.group_of_job >= 0]
        size = int(max(assigned.max(initial=-1), self.group_pairs.max(initial=-1))) + 1
        return np.bincount(assigned, minlength=size)

    def time_per_job(self) -> np.ndarray:
        """(n, K) time fraction each job spends packed (with anyone) on each type."""
        num_jobs, num_types = len(self.group_of_job), self.pair_time.shape[1]
        if self.num_pairs == 0:
            return np.zeros((num_jobs, num_types))
        sizes = self.group_sizes().astype(float)
        a, b = self.group_pairs[:, 0], self.group_pairs[:, 1]
        per_group = np.zeros((len(sizes), num_types))
        self_pair = (a == b)[:, None]
        np.add.at(per_group, a, np.where(self_pair, 2.0, 1.0) * self.pair_time / sizes[a][:, None])
        np.add.at(per_group, b, np.where(self_pair, 0.0, 1.0) * self.pair_time / sizes[b][:, None])
        out = np.zeros((num_jobs, num_types))
        grouped = self.group_of_job >= 0
        out[grouped] = per_group[self.group_of_job[grouped]]
        return out


@dataclass(frozen=True, eq=False)
class Allocation:
    """A policy's answer.

    job_fractions  (n, K)  time fraction each job runs alone on each worker type
    pairs                  packed time (see PairShares)
    objective              the policy's objective in its own units (see docs/policies.md), or
                           None when there is none (heuristics) or no solution
    solve_time_s           wall time of ``allocate``
    timings                where that time went (build_s, compile_s, solver_s, ...), for benches
    reason                 one line saying why, when status is not optimal (or what was relaxed)

    Invariants (checked by the tests): fractions >= 0; each job's singles + pairs <= 1; each
    type's scale-factor-weighted use <= its GPU count.
    """

    policy: str
    status: Status
    job_ids: tuple[str, ...]
    worker_types: tuple[str, ...]
    job_fractions: np.ndarray
    pairs: PairShares
    objective: float | None = None
    solve_time_s: float = 0.0
    reason: str = ""
    timings: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    policy_state: str | None = None  # hand back with the next problem (Problem.policy_state)
    refused_job_ids: tuple[str, ...] = ()  # infeasible because of these jobs alone (see ProblemError)
    # seconds after which the answer may change though no job arrives or leaves (Tiresias: a
    # running job crosses a queue threshold); None: it changes only with the job set
    valid_for_s: float | None = None

    @property
    def num_jobs(self) -> int:
        return len(self.job_ids)

    def total_time_per_job(self) -> np.ndarray:
        """(n,) fraction of wall time each job is scheduled (alone or packed), over all types."""
        return self.job_fractions.sum(axis=1) + self.pairs.time_per_job().sum(axis=1)

    def gpus_used(self, scale_factors: np.ndarray) -> np.ndarray:
        """(K,) GPUs busy on each type on average: sum of scale factor x fraction (a pair once)."""
        singles = (np.asarray(scale_factors, dtype=float)[:, None] * self.job_fractions).sum(axis=0)
        if self.pairs.num_pairs == 0:
            return singles
        member = _first_member_of_groups(self.pairs)
        pair_scale = np.asarray(scale_factors, dtype=float)[member[self.pairs.group_pairs[:, 0]]]
        return singles + (pair_scale[:, None] * self.pairs.pair_time).sum(axis=0)


def _first_member_of_groups(pairs: PairShares) -> np.ndarray:
    """(G,) one job index of each group (groups share a scale factor by construction)."""
    sizes = pairs.group_sizes()
    member = np.full(len(sizes), -1, dtype=np.int64)
    jobs = np.flatnonzero(pairs.group_of_job >= 0)
    # Reverse so that the first job of each group is the one written last (and kept).
    member[pairs.group_of_job[jobs[::-1]]] = jobs[::-1]
    return member


def expand_pairs(pairs: PairShares, *, min_fraction: float = NOISE_FRACTION) -> tuple[np.ndarray, np.ndarray]:
    """Concrete job pairs for grouped pair time: ((Q, 2) job indices, (Q, K) fractions).

    Every job keeps exactly the packed time per type that PairShares gives it, and every type's
    GPU use is unchanged. Between two different groups the pair time is laid out "north-west
    corner" style (jobs of each group side by side on one time line; each overlap is a pair), so
    at most size(a) + size(b) - 1 pairs; inside one group, jobs are matched two by two (a
    triangle absorbs an odd one). The same job pairs carry every type, in proportion to the
    type's share of the group pair's time.
    """
    # All group pairs at once (pair_expansion.py; the same pairs and fractions to the bit).
    return expand_group_pairs(pairs.group_of_job, pairs.group_pairs, pairs.pair_time, min_fraction)


def empty_allocation(
    policy: str, job_ids: tuple[str, ...], worker_types: tuple[str, ...], **kwargs: object
) -> Allocation:
    """An all-zero allocation (no jobs, or nothing decided); status defaults to optimal."""
    kwargs.setdefault("status", Status.OPTIMAL)
    return Allocation(
        policy=policy,
        job_ids=job_ids,
        worker_types=worker_types,
        job_fractions=_readonly(np.zeros((len(job_ids), len(worker_types)))),
        pairs=PairShares.none(len(job_ids), len(worker_types)),
        **kwargs,  # type: ignore[arg-type]
    )
