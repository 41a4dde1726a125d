"""Finish-time fairness (Themis' rho; paper section 4.1; Gavel's finish_time_fairness.py).

    rho_j(X) = (t_j + R_j / throughput_j(X)) / (I_j + R_j / T_iso_j)

    minimize   max_j  w_j * rho_j(X)      subject to cluster constraints

t_j: time since arrival; R_j: steps remaining; T_iso_j: steps/s under Gavel's isolated share
(baselines.isolated_throughputs: 1/n of every type's GPUs); I_j: the time the job would have
needed, under the isolated share, for the steps it has already done ("isolated_time_s").
Gavel accumulates I_j inside the policy object between calls — (steps done since the previous
call) / (T_iso at the previous call) — which makes its policy stateful. Here it is an input,
so the policy stays a pure function and any replica can answer; the caller accumulates it
(``advance_isolated_time`` below is that update).

Convex: R_j / throughput_j is convex in X (inv_pos of an affine function), so each rho_j is;
the program is one SOCP (Gavel solves the same with ECOS), grouped over jobs identical in
throughputs, scale factor, t, R, I and w.

Priority weights: Gavel's _perf variant ignores them (a TODO in its code) and its _packed one
divides packed throughputs by w; here w multiplies rho in every variant, which is the same
when every w is 1 (as in all of Gavel's traces).

Heterogeneity-agnostic (Gavel's finish_time_fairness): every type runs each job at its speed on
a reference type (v100 when present), for both throughput_j and T_iso_j.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from policy_service.core.allocation import Allocation, empty_allocation
from policy_service.core.baselines import agnostic_reference_throughputs, isolated_throughputs
from policy_service.core.fairness import check_variant
from policy_service.core.formulation import SolveOptions, build_space
from policy_service.core.solving import solve
from policy_service.core.problem import Problem
from policy_service.core.sparse import sp

if TYPE_CHECKING:  # annotations only: cvxpy is loaded when a program is built
    import cvxpy as cp


def isolated_finish_time_s(problem: Problem) -> np.ndarray:
    """(n,) I_j + R_j / T_iso_j: the denominator of rho."""
    return problem.isolated_time_s + problem.steps_remaining / np.maximum(isolated_throughputs(problem), 1e-300)


def advance_isolated_time(
    isolated_time_s: np.ndarray,
    steps_done_since_last: np.ndarray,
    isolated_throughputs_last: np.ndarray,
) -> np.ndarray:
    """The caller's update of ``isolated_time_s`` between two allocations (Gavel's
    ``_cumulative_isolated_time``): add (steps done since the last allocation) / (the isolated
    throughput the last allocation used; ``baselines.isolated_throughputs`` of that problem)."""
    return isolated_time_s + steps_done_since_last / np.maximum(isolated_throughputs_last, 1e-300)


@dataclass(frozen=True)
class FinishTimeFairness:
    heterogeneity_aware: bool = True
    space_sharing: bool = False
    reference_type: str | None = None
    options: SolveOptions = field(default_factory=SolveOptions)
    name: str = "finish_time_fairness_perf"

    def isolated_baseline(self, problem: Problem) -> np.ndarray:
        """(n,) the isolated-share throughputs this policy measures rho against (the caller
        accumulates ``isolated_time_s`` from them between allocations)."""
        view = problem if self.heterogeneity_aware else agnostic_reference_throughputs(problem, self.reference_type)
        return isolated_throughputs(view)

    def allocate(self, problem: Problem) -> Allocation:
        import cvxpy as cp  # noqa: PLC0415 - loaded when a program is built, not when the package is imported
        started = time.perf_counter()
        if problem.num_jobs == 0:
            return empty_allocation(self.name, problem.job_ids, problem.worker_types)
        view = problem if self.heterogeneity_aware else agnostic_reference_throughputs(problem, self.reference_type)
        baseline_s = isolated_finish_time_s(view)
        space = build_space(
            view, packing=self.space_sharing, options=self.options,
            columns=[problem.time_since_arrival_s, problem.steps_remaining, baseline_s, problem.priority_weights],
        )
        reps = space.classes.representative
        steps = problem.steps_remaining[reps]
        # w * rho <= r  <=>  R / throughput <= r * B - t with B = (I + R / T_iso) / w. Divided
        # by B, with throughput measured in units of T_iso, every term is O(1) for the solver:
        #     (R / (T_iso * B)) * inv_pos(throughput / T_iso) <= r - t / B
        budget_s = baseline_s[reps] / problem.priority_weights[reps]
        unit = np.maximum(isolated_throughputs(view)[reps], 1e-300)
        share_left = steps / unit / budget_s
        waited = problem.time_since_arrival_s[reps] / budget_s
        v = cp.Variable(space.num_vars, nonneg=True)
        worst = cp.Variable()
        relative = sp.diags(1.0 / unit) @ space.throughput()
        busy = np.flatnonzero(steps > 0)
        constraints = [*space.constraints(v)]
        if len(busy):
            constraints.insert(
                0, cp.multiply(share_left[busy], cp.inv_pos(relative[busy] @ v)) <= worst - waited[busy]
            )
        idle = np.flatnonzero(steps <= 0)
        if len(idle):  # a job with nothing left is at rho = t / I whatever it gets
            constraints.append(worst >= waited[idle])
        program = cp.Problem(cp.Minimize(worst), constraints)
        outcome = solve(program, self.options, build_s=time.perf_counter() - started)
        objective = float(worst.value) if outcome.status.startswith("optimal") and worst.value is not None else None
        return space.allocation(
            v.value, policy=self.name, status=outcome.status, objective=objective,
            started_s=started, reason=outcome.reason, timings=outcome.timings,
        )


def finish_time_fairness(
    heterogeneity_aware: bool = True,
    space_sharing: bool = False,
    *,
    reference_type: str | None = None,
    solver: str = "CLARABEL",
    grouping: bool = True,
    exclude_oversized_gangs: bool = True,
    prune_dominated: bool = True,
    canon_backend: str | None = None,
    pair_variables: str = "auto",
) -> FinishTimeFairness:
    """Finish-time fairness. Gavel: finish_time_fairness (agnostic), _perf, _packed."""
    check_variant(heterogeneity_aware, space_sharing)
    options = SolveOptions(
        solver, grouping, exclude_oversized_gangs, prune_dominated, canon_backend, pair_variables=pair_variables
    )
    suffix = "_packed" if space_sharing else ("_perf" if heterogeneity_aware else "")
    name = "finish_time_fairness" + suffix
    return FinishTimeFairness(heterogeneity_aware, space_sharing, reference_type, options, name)
