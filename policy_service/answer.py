"""From an AllocationRequested to its answer: pure, so it runs the same inline, in a thread or in
a worker process (the service decides where).

    answer(request, context) -> AllocationComputed | AllocationFailed

Bad input (an unknown policy, a job type the table does not know, a NaN throughput, ...) is
answered with AllocationFailed and the reason, never raised.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from common.errors import GavelError
from common.messages import (
    AllocationComputed,
    AllocationEntry,
    AllocationFailed,
    AllocationRequested,
    PolicyProblem,
    SolveStatus,
)
from common.throughputs import ThroughputTable
from policy_service.core import (
    Allocation,
    Entity,
    JobSpec,
    PairSpec,
    Problem,
    allocation_to_json,
    build_problem,
    make_policy,
)
from policy_service.core import AllocationEntry as CoreEntry


@dataclasses.dataclass(frozen=True)
class SolveContext:
    """What a policy replica knows besides the request: the throughput table it fills omitted
    throughputs and pairs from, and the prices used when a request names none."""

    table: ThroughputTable | None = None
    prices_per_hour: Mapping[str, float] | None = None


def problem_from_message(problem: PolicyProblem, context: SolveContext) -> Problem:
    """The core's Problem for a wire snapshot. ProblemError names the offending field."""
    jobs = [
        JobSpec(
            id=j.job_id,
            steps_remaining=j.steps_remaining,
            job_type=j.job_type,
            scale_factor=j.scale_factor,
            priority_weight=j.priority_weight,
            throughputs_steps_per_s=j.throughputs_steps_per_s,
            time_since_arrival_s=j.time_since_arrival_s,
            slo_s=j.slo_s,
            entity=j.entity,
            isolated_time_s=j.isolated_time_s,
        )
        for j in problem.jobs
    ]
    pairs = None
    if problem.pairs is not None:
        pairs = [
            PairSpec(tuple(p.job_ids), {k: tuple(v) for k, v in p.throughputs_steps_per_s.items()})  # type: ignore[arg-type]
            for p in problem.pairs
        ]
    return build_problem(
        problem.worker_types,
        jobs,
        pairs=pairs,
        entities=[Entity(e.name, e.weight, e.policy) for e in problem.entities],
        prices_per_hour=problem.prices_per_hour if problem.prices_per_hour is not None else context.prices_per_hour,
        table=context.table,
        previous=[CoreEntry(e.job_ids, e.fractions) for e in problem.previous] or None,
    )


def computed_message(request_id: str, allocation: Allocation) -> AllocationComputed:
    """The wire form of an allocation: one entry per job, one per concrete packed pair."""
    as_json = allocation_to_json(allocation)
    return AllocationComputed(
        request_id=request_id,
        policy=allocation.policy,
        status=SolveStatus(allocation.status),
        objective=as_json["objective"],  # type: ignore[arg-type]
        solve_time_s=float(allocation.solve_time_s),
        entries=tuple(
            AllocationEntry(tuple(e["jobs"]), e["fractions"])  # type: ignore[index]
            for e in as_json["allocation"]  # type: ignore[union-attr]
        ),
        reason=allocation.reason or "",
    )


def answer(request: AllocationRequested, context: SolveContext) -> AllocationComputed | AllocationFailed:
    try:
        overrides = {"solver": request.solver} if request.solver else {}
        policy = make_policy(request.policy, **overrides)
        problem = problem_from_message(request.problem, context)
        return computed_message(request.request_id, policy.allocate(problem))
    except GavelError as e:
        return AllocationFailed(request.request_id, request.policy, str(e))
