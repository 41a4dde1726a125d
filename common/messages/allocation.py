"""Allocation request and reply between the mechanism and the (stateless) policy service.

A request carries the whole problem snapshot, so any policy replica can answer it and a logged
request can be replayed.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from common.messages.base import Message, message, value


@value
class PolicyJob:
    job_id: str
    job_type: str
    scale_factor: int
    priority_weight: float
    throughputs_steps_per_s: Mapping[str, float]  # accelerator type -> isolated steps/s
    steps_remaining: int
    time_since_arrival_s: float
    slo_s: float | None = None
    entity: str | None = None


@value
class PairThroughputs:
    """Two jobs sharing the same GPUs: per accelerator type, each job's steps/s in that pair."""

    job_ids: tuple[str, ...]  # exactly two
    throughputs_steps_per_s: Mapping[str, tuple[float, ...]]  # type -> (first's, second's)


@value
class EntitySpec:
    name: str
    weight: float = 1.0
    policy: str = "fairness"  # how the entity shares its part among its jobs: fairness | fifo


@value
class PolicyProblem:
    worker_types: Mapping[str, int]  # accelerator type -> GPU count
    jobs: tuple[PolicyJob, ...]
    pairs: tuple[PairThroughputs, ...] = ()
    entities: tuple[EntitySpec, ...] = ()
    prices_per_hour: Mapping[str, float] | None = None  # None: the shipped prices table


@message("allocation.requested")
class AllocationRequested(Message):
    request_id: str
    policy: str
    problem: PolicyProblem
    deadline_s: float  # answer as expired, not solved, when received after this time


class SolveStatus(enum.StrEnum):
    OPTIMAL = "optimal"
    OPTIMAL_INACCURATE = "optimal_inaccurate"
    INFEASIBLE = "infeasible"
    FAILED = "failed"


@value
class AllocationEntry:
    """Fractions of wall time one job (or a packed pair) should spend on each accelerator type."""

    job_ids: tuple[str, ...]
    fractions: Mapping[str, float]


@message("allocation.computed")
class AllocationComputed(Message):
    request_id: str
    policy: str
    status: SolveStatus
    objective: float
    solve_time_s: float
    entries: tuple[AllocationEntry, ...]


@message("allocation.failed")
class AllocationFailed(Message):
    request_id: str
    policy: str
    reason: str
    expired: bool = False  # the request arrived after its deadline and was not solved
