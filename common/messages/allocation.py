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
    steps_remaining: int
    time_since_arrival_s: float
    # accelerator type -> isolated steps/s of the whole gang; None: the policy service looks the
    # job type up in its throughput table
    throughputs_steps_per_s: Mapping[str, float] | None = None
    slo_s: float | None = None
    entity: str | None = None
    isolated_time_s: float = 0.0  # finish-time fairness: time the job would have had alone so far
    # Its row in PolicyProblem.colocations ("": not packed by colocation classes)
    colocation_class: str = ""
    # What the job has run, for least-attained-service policies (Tiresias): GPU-seconds in all,
    # seconds since its last run ended (since arrival if it never ran), its last run's length
    attained_service_gpu_s: float = 0.0
    time_since_last_run_s: float = 0.0
    last_run_s: float = 0.0


@value
class PairThroughputs:
    """Two jobs sharing the same GPUs: per accelerator type, each job's steps/s in that pair."""

    job_ids: tuple[str, ...]  # exactly two
    throughputs_steps_per_s: Mapping[str, tuple[float, ...]]  # type -> (first's, second's)


@value
class ClassColocation:
    """Two colocation classes sharing GPUs (estimates): per accelerator type, the fraction of its
    steps/s alone that each keeps, (first's, second's). A packed pair's steps/s is each job's own
    throughputs_steps_per_s times its fraction."""

    classes: tuple[str, ...]  # exactly two; the same class twice packs two jobs of that class
    fractions: Mapping[str, tuple[float, ...]]


@value
class EntitySpec:
    name: str
    weight: float = 1.0
    policy: str = "fairness"  # how the entity shares its part among its jobs: fairness | fifo


@value
class AllocationEntry:
    """Fractions of wall time one job (or a packed pair) should spend on each accelerator type."""

    job_ids: tuple[str, ...]
    fractions: Mapping[str, float]


@value
class PolicyProblem:
    worker_types: Mapping[str, int]  # accelerator type -> GPU count
    jobs: tuple[PolicyJob, ...]
    # Jobs that may share GPUs. None: every same-scale-factor pair the policy service's table
    # lists (sending them would cost O(n^2)); (): no packing.
    pairs: tuple[PairThroughputs, ...] | None = None
    entities: tuple[EntitySpec, ...] = ()
    prices_per_hour: Mapping[str, float] | None = None  # None: the shipped prices table
    # The allocation in force, for the policies that keep running jobs in place (agnostic FIFO,
    # Gandiva, AlloX).
    previous: tuple[AllocationEntry, ...] = ()
    # Packing from estimates, when ``pairs`` is None: two jobs whose colocation classes' pair is
    # listed here may share GPUs (each job's throughputs_steps_per_s must then be given).
    colocations: tuple[ClassColocation, ...] | None = None


@message("allocation.requested")
class AllocationRequested(Message):
    request_id: str
    policy: str
    problem: PolicyProblem
    deadline_s: float  # answer as expired, not solved, when received after this time
    solver: str | None = None  # None: the policy's default (CLARABEL); e.g. ECOS, as Gavel used
    # "gavel": solve the programs exactly as Gavel writes them (per-job variables, ECOS, its
    # approximations and quirks), for the simulator's gavel preset; "default": ours
    preset: str = "default"
    seed: int | None = None  # for policies that draw random numbers (fifo, gandiva, POP)
    policy_state: str = ""  # the last AllocationComputed.policy_state, returned unchanged


class SolveStatus(enum.StrEnum):
    OPTIMAL = "optimal"
    OPTIMAL_INACCURATE = "optimal_inaccurate"
    INFEASIBLE = "infeasible"
    FAILED = "failed"


@message("allocation.computed")
class AllocationComputed(Message):
    request_id: str
    policy: str
    status: SolveStatus
    objective: float | None  # None for heuristics, and when no feasible allocation exists
    solve_time_s: float
    entries: tuple[AllocationEntry, ...]
    reason: str = ""  # why the status is infeasible or failed
    # job id -> steps/s under the policy's isolated share (1/n of every type): the baseline of
    # finish-time fairness, which the caller accumulates between requests (isolated_time_s)
    isolated_throughputs_steps_per_s: Mapping[str, float] | None = None
    # Opaque state of a stateful policy (assignments, a random stream) for the caller to send
    # back with its next request; "" for stateless policies.
    policy_state: str = ""
    # With status infeasible: the jobs it is infeasible because of, alone (a deadline that no
    # allocation can meet). The caller may set them aside and ask again.
    refused_job_ids: tuple[str, ...] = ()
    # Seconds after which this answer may change though no job arrived or left (a job crossing
    # a priority threshold of Tiresias as it runs): the caller solves again then. None: never.
    valid_for_s: float | None = None


@message("allocation.failed")
class AllocationFailed(Message):
    request_id: str
    policy: str
    reason: str
    expired: bool = False  # the request arrived after its deadline and was not solved
    # The jobs the problem was refused because of, alone (a field out of range, a job type the
    # policy's table does not know): the caller may set them aside and ask again, so one job
    # cannot stop every solve. Empty when no single job is to blame.
    refused_job_ids: tuple[str, ...] = ()
