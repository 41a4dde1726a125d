"""Tiresias: discretised two-dimensional least-attained-service (2D-LAS), whole GPUs, preemptive.

Gu et al., "Tiresias: A GPU Cluster Manager for Distributed Deep Learning", NSDI 2019, section
4.2 (the discretised 2D-LAS scheduler when job durations are unknown). A job's *attained
service* is two-dimensional: GPUs x time it has run (``Problem.attained_service_gpu_s``). Jobs
sit in K priority queues by attained service (``thresholds_gpu_s``: a job with service below the
first threshold is in the highest queue, and so on); a higher queue always goes first, and
within a queue jobs go first-come first-served (by arrival; Tiresias discretises LAS precisely
so that jobs of similar service stop preempting each other). A job's service is divided by its
priority weight (weighted LAS; identical when every weight is 1).

Starvation guard (the paper's STARVELIMIT): a job that has waited, since its last run ended,
longer than ``starve_limit`` times the length of that run is promoted to the highest queue. The
promotion is kept in ``policy_state`` as the service the job had then: from there on its queue
is read from the service it attains after the promotion, so it is demoted again only as it
runs, as a new job would be.

- heterogeneity-aware (``tiresias_perf``): in that order each job takes 100% of its time on the
  fastest type that still has room for its gang;
- agnostic (``tiresias``): on a random type with room (the injected Generator), as Tiresias
  itself (it knows nothing of types) and agnostic SRTF.

A gang that does not fit where there is still room is skipped and smaller jobs behind it go on
(work-conserving). Unlike LAS in continuous form (Gavel's ``max_min_fairness``: equal shares of
time) no time is shared: a job runs all the time or not at all.

The answer changes as running jobs attain service, not only when jobs arrive or leave: it says
when (``Allocation.valid_for_s``: the soonest a running job crosses its queue's threshold or a
waiting job reaches its starvation limit), and the mechanism solves again then.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from common.errors import ProblemError
from policy_service.core.allocation import Allocation
from policy_service.core.problem import Problem
from policy_service.core.srtf import (
    priority_order,
    take_whole_gangs,
    whole_gang_allocation,
)

# Our defaults, for Gavel's traces (jobs of minutes to days on 1-8 GPUs): three queues split at
# one and ten GPU-hours. The paper derives K and its thresholds from the cluster's history
# (section 4.2.1: K = 2 captures most of the gain); both are parameters here.
DEFAULT_THRESHOLDS_GPU_S = (3600.0, 36000.0)
DEFAULT_STARVE_LIMIT = 8.0


@dataclass(frozen=True)
class Queues:
    """Where every job stands: (n,) each job's queue (0 = highest), its service counted for the
    queues (since its last promotion), and the promotions in force (job id -> service then)."""

    queue: np.ndarray
    service_gpu_s: np.ndarray
    promoted_at_gpu_s: dict[str, float]


def queues(
    problem: Problem, thresholds_gpu_s: tuple[float, ...], starve_limit: float, promoted: dict[str, float]
) -> Queues:
    """Each job's queue after this solve's promotions (``promoted``: the earlier ones, by job id):
    a job below the highest queue that has waited ``starve_limit`` times its last run is promoted."""
    attained, since_s, last_run_s = problem.service_columns()
    offset = np.array([promoted.get(job_id, 0.0) for job_id in problem.job_ids]) if promoted else np.zeros(problem.num_jobs)
    offset = np.minimum(offset, attained)  # (a promotion never counts more than the job ran)
    thresholds = np.asarray(thresholds_gpu_s, dtype=float)
    below_top = np.searchsorted(thresholds, (attained - offset) / problem.priority_weights, side="right") > 0
    with np.errstate(invalid="ignore"):  # (an infinite starve_limit times a zero run: never starving)
        starving = below_top & (last_run_s > 0) & (since_s > 0) & (since_s >= starve_limit * last_run_s)
    offset = np.where(starving, attained, offset)
    service = (attained - offset) / problem.priority_weights
    queue = np.searchsorted(thresholds, service, side="right")
    kept = {problem.job_ids[j]: float(offset[j]) for j in np.flatnonzero(offset > 0).tolist()}
    return Queues(queue, service, kept)


def valid_for_s(
    problem: Problem, state: Queues, fractions: np.ndarray, thresholds_gpu_s: tuple[float, ...], starve_limit: float
) -> float | None:
    """The soonest this answer may change with no job arriving or leaving: a running job crossing
    its queue's upper threshold (at scale factor x its time share GPU-seconds a second, over its
    weight), or a waiting job of a lower queue reaching its starvation limit. None: never."""
    _, since_s, last_run_s = problem.service_columns()
    share = fractions.sum(axis=1)
    running = share > 0
    upper = np.append(np.asarray(thresholds_gpu_s, dtype=float), np.inf)[state.queue]
    rate = problem.scale_factors * share / problem.priority_weights
    with np.errstate(divide="ignore", invalid="ignore"):
        crossing = np.where(running & np.isfinite(upper), (upper - state.service_gpu_s) / np.where(running, rate, 1.0), np.inf)
    # (a job in the highest queue has nothing to be promoted to)
    with np.errstate(invalid="ignore"):
        starving = np.where(~running & (last_run_s > 0) & (state.queue > 0), starve_limit * last_run_s - since_s, np.inf)
    soonest = float(min(crossing.min(initial=np.inf), starving.min(initial=np.inf)))
    return max(soonest, 0.0) if np.isfinite(soonest) else None


def _promotions(policy_state: str | None) -> dict[str, float]:
    if not policy_state:
        return {}
    try:
        data = json.loads(policy_state)
        promoted = {str(k): float(v) for k, v in data["promoted_at_gpu_s"].items()}
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ProblemError(f"policy_state: not a Tiresias state ({e.__class__.__name__}: {e})") from None
    return promoted


@dataclass(frozen=True, eq=False)
class Tiresias:
    heterogeneity_aware: bool = True
    thresholds_gpu_s: tuple[float, ...] = DEFAULT_THRESHOLDS_GPU_S
    starve_limit: float = DEFAULT_STARVE_LIMIT
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    name: str = "tiresias_perf"
    reads_previous: ClassVar[bool] = False
    reads_service: ClassVar[bool] = True

    def __post_init__(self) -> None:
        thresholds = np.asarray(self.thresholds_gpu_s, dtype=float)
        if thresholds.ndim != 1 or not np.all(np.isfinite(thresholds)) or np.any(thresholds <= 0) or np.any(np.diff(thresholds) <= 0):
            raise ValueError(f"thresholds_gpu_s: positive and increasing, got {self.thresholds_gpu_s!r}")
        if not self.starve_limit > 0:
            raise ValueError(f"starve_limit: must be > 0, got {self.starve_limit!r}")

    def allocate(self, problem: Problem) -> Allocation:
        started = time.perf_counter()
        state = queues(problem, self.thresholds_gpu_s, self.starve_limit, _promotions(problem.policy_state))
        order = priority_order(problem, state.queue)  # highest queue first, FIFO within
        fractions = take_whole_gangs(problem, order, self.heterogeneity_aware, self.rng)
        return whole_gang_allocation(
            self.name, problem, fractions, started,
            policy_state=json.dumps({"promoted_at_gpu_s": state.promoted_at_gpu_s}, sort_keys=True)
            if state.promoted_at_gpu_s else None,
            valid_for_s=valid_for_s(problem, state, fractions, self.thresholds_gpu_s, self.starve_limit),
        )


def tiresias(
    heterogeneity_aware: bool = True, *, thresholds_gpu_s: tuple[float, ...] = DEFAULT_THRESHOLDS_GPU_S,
    starve_limit: float = DEFAULT_STARVE_LIMIT, rng: np.random.Generator | None = None,
) -> Tiresias:
    """Tiresias' discretised 2D-LAS: tiresias (agnostic, random types), tiresias_perf."""
    return Tiresias(
        heterogeneity_aware, tuple(float(t) for t in thresholds_gpu_s), float(starve_limit),
        rng if rng is not None else np.random.default_rng(0), "tiresias_perf" if heterogeneity_aware else "tiresias",
    )
