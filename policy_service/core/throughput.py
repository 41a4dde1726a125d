"""Maximum total throughput, optionally per dollar and under SLOs (paper section 4.1 "Minimize
cost" and "SLOs"; Gavel's max_sum_throughput.py).

    maximize   sum_j sum_k  throughput_jk(X) / (s_j * c_k)      (cost-normalised)
          or   sum_j        throughput_j(X)                     (max_sum_throughput_perf)
    subject to cluster constraints, and with SLOs:
               throughput_j(X) >= R_j / (SLO_j - t_j)   for every job with an SLO

throughput_jk is job j's steps/s from its time on type k (alone or packed); c_k the price of one
GPU-hour of type k; s_j the job's GPUs. Gavel divides by c_k only, i.e. charges a gang of 8 GPUs
the price of one; we charge all s_j of them (identical for single-GPU jobs). SLO_j is the job's
deadline measured from its arrival, t_j the time since arrival, so SLO_j - t_j is the time left.

When the SLOs cannot all be met, the status is ``infeasible`` and the reason names the first
job that cannot meet its SLO even with the cluster to itself, or says that the SLOs only fail
together. Gavel instead drops every SLO and solves again; ``on_infeasible_slos="drop"`` does
that (status optimal, the reason says the SLOs were dropped).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from common.errors import PolicyParameterError, ProblemError
from policy_service.core.allocation import Allocation, Status, empty_allocation
from policy_service.core.fairness import check_variant
from policy_service.core.formulation import SolveOptions, Space, build_space
from policy_service.core.solving import solve
from policy_service.core.problem import Problem

if TYPE_CHECKING:  # annotations only: cvxpy is loaded when a program is built
    import cvxpy as cp

_ON_INFEASIBLE = ("report", "drop")


@dataclass(frozen=True)
class MaxSumThroughput:
    space_sharing: bool = False
    cost_normalized: bool = False
    enforce_slos: bool = False
    on_infeasible_slos: str = "report"
    options: SolveOptions = field(default_factory=SolveOptions)
    name: str = "max_sum_throughput_perf"

    def allocate(self, problem: Problem) -> Allocation:
        import cvxpy as cp  # noqa: PLC0415 - loaded when a program is built, not when the package is imported
        started = time.perf_counter()
        if problem.num_jobs == 0:
            return empty_allocation(self.name, problem.job_ids, problem.worker_types)
        per_type = np.ones(problem.num_types)
        if self.cost_normalized:
            if problem.prices_per_hour is None:
                raise ProblemError(f"prices_per_hour: required by policy {self.name!r}")
            per_type = 1.0 / np.where(problem.prices_per_hour > 0, problem.prices_per_hour, np.inf)
        columns: list[np.ndarray] = []
        if self.enforce_slos:
            columns = [problem.slo_s, problem.time_since_arrival_s, problem.steps_remaining]
        space = build_space(problem, packing=self.space_sharing, options=self.options, columns=columns)
        sizes = space.classes.sizes.astype(float)
        weights = sizes / (space.class_scale_factors if self.cost_normalized else 1.0)
        value = weights @ space.throughput(per_type)  # (V,) objective coefficients
        v = cp.Variable(space.num_vars, nonneg=True)
        constraints = space.constraints(v)
        slo_rows: np.ndarray = np.zeros(0, dtype=np.int64)
        needed = np.zeros(0)
        if self.enforce_slos:
            slo_rows, needed, missed = _slo_requirements(problem, space)
            if missed is not None:
                return self._infeasible(problem, space, started, *missed)
            if len(slo_rows):
                constraints = [space.throughput()[slo_rows] @ v >= needed, *constraints]
        # Scale the objective to O(1) for the solver; the reported objective is unscaled.
        scale = float(np.abs(value).max()) or 1.0
        program = cp.Problem(cp.Maximize((value / scale) @ v), constraints)
        outcome = solve(program, self.options, build_s=time.perf_counter() - started)
        if outcome.status == Status.INFEASIBLE and len(slo_rows):
            reason, culprits = _diagnose(problem, space, slo_rows, needed)
            if self.on_infeasible_slos == "drop":
                return self._without_slos(problem, reason)
            infeasible = space.allocation(
                None, policy=self.name, status=Status.INFEASIBLE, objective=None, started_s=started,
                reason=reason, timings=outcome.timings,
            )
            return replace(infeasible, refused_job_ids=culprits)
        objective = float(program.value) * scale if outcome.status.startswith("optimal") else None
        return space.allocation(
            v.value, policy=self.name, status=outcome.status, objective=objective,
            started_s=started, reason=outcome.reason, timings=outcome.timings,
        )

    def _without_slos(self, problem: Problem, reason: str) -> Allocation:
        """Gavel's fallback: solve again with no SLO constraints, and say so."""
        relaxed = replace(self, enforce_slos=False).allocate(problem)
        return replace(relaxed, reason=f"{reason}; solved without SLOs (on_infeasible_slos=drop)")

    def _infeasible(self, problem: Problem, space: Space, started: float, reason: str, culprits: tuple[str, ...]) -> Allocation:
        if self.on_infeasible_slos == "drop":
            return self._without_slos(problem, reason)
        infeasible = space.allocation(
            None, policy=self.name, status=Status.INFEASIBLE, objective=None, started_s=started, reason=reason,
        )
        return replace(infeasible, refused_job_ids=culprits)


def _slo_requirements(
    problem: Problem, space: Space
) -> tuple[np.ndarray, np.ndarray, tuple[str, tuple[str, ...]] | None]:
    """Classes with an SLO, the steps/s each needs, or (reason, the jobs past their deadline) if a
    deadline already passed."""
    reps = space.classes.representative
    slo = problem.slo_s[reps]
    has_slo = ~np.isnan(slo)
    left_s = slo - problem.time_since_arrival_s[reps]
    passed = np.flatnonzero(has_slo & (left_s <= 0) & (problem.steps_remaining[reps] > 0))
    if len(passed):
        j = reps[passed[0]]
        reason = (
            f"SLOs infeasible: job {problem.job_ids[j]!r} is past its deadline "
            f"(slo_s {problem.slo_s[j]:g} <= time_since_arrival_s {problem.time_since_arrival_s[j]:g}) "
            f"with {problem.steps_remaining[j]:g} steps left"
        )
        return np.zeros(0, np.int64), np.zeros(0), (reason, _members(problem, space, passed))
    rows = np.flatnonzero(has_slo & (left_s > 0))
    return rows, problem.steps_remaining[reps[rows]] / left_s[rows], None


def _diagnose(problem: Problem, space: Space, slo_rows: np.ndarray, needed: np.ndarray) -> tuple[str, tuple[str, ...]]:
    """Name a job that cannot meet its SLO alone (with every job that cannot), else say the SLOs
    only fail together (no job to blame alone)."""
    counts = problem.worker_counts
    fits = space.class_scale_factors[slo_rows, None] <= counts[None, :]
    best_alone = np.where(fits, space.class_throughputs[slo_rows], 0.0).max(axis=1)
    alone_fails = np.flatnonzero(best_alone < needed * (1 - 1e-9))
    if len(alone_fails):
        c = slo_rows[alone_fails[0]]
        j = space.classes.representative[c]
        reason = (
            f"SLOs infeasible: job {problem.job_ids[j]!r} needs {needed[alone_fails[0]]:.4g} steps/s to finish "
            f"{problem.steps_remaining[j]:g} steps within its SLO, but reaches at most "
            f"{best_alone[alone_fails[0]]:.4g} steps/s even with the cluster to itself"
        )
        return reason, _members(problem, space, slo_rows[alone_fails])
    jobs = int(space.classes.sizes[slo_rows].sum())
    return f"SLOs infeasible: the SLOs of {jobs} jobs cannot all be met at once on this cluster", ()


def _members(problem: Problem, space: Space, classes: np.ndarray) -> tuple[str, ...]:
    """The ids of every job in these classes (jobs of a class share their SLO columns, so one
    fails its deadline exactly when all do)."""
    members = np.flatnonzero(np.isin(space.classes.class_of_job, classes))
    return tuple(problem.job_ids[j] for j in members)


def max_sum_throughput(
    space_sharing: bool = False,
    *,
    cost_normalized: bool = False,
    enforce_slos: bool = False,
    on_infeasible_slos: str = "report",
    solver: str = "CLARABEL",
    grouping: bool = True,
    exclude_oversized_gangs: bool = True,
    prune_dominated: bool = True,
    canon_backend: str | None = None,
    pair_variables: str = "auto",
) -> MaxSumThroughput:
    """Total throughput (per dollar with ``cost_normalized``; under SLOs with ``enforce_slos``).
    Gavel: max_sum_throughput_perf, max_sum_throughput_normalized_by_cost_perf[_SLOs],
    max_sum_throughput_normalized_by_cost_packed_SLOs. Always heterogeneity-aware."""
    check_variant(True, space_sharing)
    if on_infeasible_slos not in _ON_INFEASIBLE:
        known = ", ".join(_ON_INFEASIBLE)
        raise PolicyParameterError(f"on_infeasible_slos must be one of {known}, got {on_infeasible_slos!r}")
    options = SolveOptions(
        solver, grouping, exclude_oversized_gangs, prune_dominated, canon_backend, pair_variables=pair_variables
    )
    name = "max_sum_throughput"
    if cost_normalized:
        name += "_normalized_by_cost"
    name += "_packed" if space_sharing else "_perf"
    if enforce_slos:
        name += "_SLOs"
    return MaxSumThroughput(space_sharing, cost_normalized, enforce_slos, on_infeasible_slos, options, name)
