"""Minimum makespan (paper section 4.1 "Minimize makespan"; Gavel's min_total_duration.py).

    minimize   M
    subject to throughput_j(X) * M >= steps_remaining_j   for every job j
               cluster constraints

Gavel binary-searches M: it solves the feasibility LP "throughput_j(X) >= steps_j / M" for
M between 100 s and 10^6 s (extending by 10x until feasible) and stops when the bracket is
within 5%, so its answer is up to 5% worse than optimal and costs ~15 LP solves. Substituting
theta = 1 / M makes the problem one exact LP:

    maximize theta  subject to  throughput_j(X) >= steps_remaining_j * theta,  cluster constraints

or, numerically better and used here, in the time spent y = X * M (seconds):

    minimize M  subject to  sum_k T[j, k] y[j, k] >= steps_remaining_j,
                            each job's time sum_k y[j, k] <= M, each type's GPU-time <= N_k * M

That is the default (``exact=True``); the allocation is X = y / M. ``exact=False`` reproduces
Gavel's search, bracket and all, for the `gavel` simulator preset; its LP is compiled once and
re-solved with a new M (a cvxpy parameter).

Heterogeneity-agnostic (Gavel's min_total_duration): every type runs each job at its speed on a
reference type (v100 when present). Priority weights play no role (as in Gavel).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from policy_service.core.allocation import Allocation, Status, empty_allocation
from policy_service.core.baselines import agnostic_reference_throughputs
from policy_service.core.fairness import check_variant
from policy_service.core.formulation import SolveOptions, build_space
from policy_service.core.solving import solve
from policy_service.core.problem import Problem
from policy_service.core.sparse import sp

if TYPE_CHECKING:  # annotations only: cvxpy is loaded when a program is built
    import cvxpy as cp

# Gavel's search bracket (seconds) and stopping ratio.
_GAVEL_MIN_M_S = 100.0
_GAVEL_MAX_M_S = 1_000_000.0
_GAVEL_GAP = 1.05


@dataclass(frozen=True)
class MinTotalDuration:
    heterogeneity_aware: bool = True
    space_sharing: bool = False
    exact: bool = True
    reference_type: str | None = None
    options: SolveOptions = field(default_factory=SolveOptions)
    name: str = "min_total_duration_perf"

    def allocate(self, problem: Problem) -> Allocation:
        import cvxpy as cp  # noqa: PLC0415 - loaded when a program is built, not when the package is imported
        started = time.perf_counter()
        if problem.num_jobs == 0:
            return empty_allocation(self.name, problem.job_ids, problem.worker_types)
        view = problem if self.heterogeneity_aware else agnostic_reference_throughputs(problem, self.reference_type)
        space = build_space(view, packing=self.space_sharing, options=self.options, columns=[problem.steps_remaining])
        steps = problem.steps_remaining[space.classes.representative]
        throughput = space.throughput()
        v = cp.Variable(space.num_vars, nonneg=True)
        if self.exact:
            return self._exact(space, throughput, steps, v, started)
        return self._bisection(space, throughput, steps, v, started)

    def _exact(self, space, throughput, steps, v, started) -> Allocation:
        """One LP in the time each job spends on each type, y = X * M (module docstring).

        Scaled for the solver: throughput in units of each job's best steps/s, time in units of
        the longest job's time alone on its best type (reference_s). (The equivalent form
        "maximize theta = 1 / M" is degenerate enough that ECOS stalls on it.)
        """
        import cvxpy as cp  # noqa: PLC0415 - loaded when a program is built, not when the package is imported
        best = np.maximum(space.class_throughputs.max(axis=1), 1e-300)
        alone_s = steps / best
        reference_s = float(alone_s.max()) if alone_s.max() > 0 else 1.0
        makespan = cp.Variable(nonneg=True)  # M / reference_s
        time_spent = v  # y / reference_s, same layout as the fractions
        busy = np.flatnonzero(steps > 0)
        constraints = [
            space.budget @ time_spent <= makespan,
            space.usage @ time_spent <= space.problem.worker_counts * makespan,
            *space.pairing_constraints(time_spent),
        ]
        if len(busy):
            rows = sp.diags(1.0 / best[busy]) @ throughput[busy]
            constraints.insert(0, rows @ time_spent >= alone_s[busy] / reference_s)
        program = cp.Problem(cp.Minimize(makespan), constraints)
        outcome = solve(program, self.options, build_s=time.perf_counter() - started)
        values, objective = None, None
        if outcome.status.startswith("optimal") and makespan.value is not None:
            m = float(makespan.value)
            objective = m * reference_s if len(busy) else 0.0
            values = np.asarray(time_spent.value) / m if m > 0 else np.zeros(space.num_vars)
        return space.allocation(
            values, policy=self.name, status=outcome.status, objective=objective,
            started_s=started, reason=outcome.reason, timings=outcome.timings,
        )

    def _bisection(self, space, throughput, steps, v, started) -> Allocation:
        """Gavel's search: the smallest M in its bracket (within 5%) whose LP is feasible.

        Each step is a feasibility problem (constant objective), so the allocation returned is
        wherever the interior-point solver stops inside the feasible set. That point depends on
        how the program is written, so for Gavel's own program (``grouping=False``, no packing)
        it is written the way Gavel writes it: a (jobs x types) matrix variable, its three
        cluster constraints in its order, then the makespan rows. With ECOS this reproduces
        Gavel's allocations; any other form moved average JCTs by ~5% in the gavel preset.
        """
        import cvxpy as cp  # noqa: PLC0415 - loaded when a program is built, not when the package is imported
        inverse_m = cp.Parameter(nonneg=True)
        gavel_form = not self.options.grouping and not self.space_sharing and bool((space.x_index >= 0).all())
        if gavel_form:
            rates = space.class_throughputs
            num_jobs = rates.shape[0]
            x = cp.Variable(rates.shape)
            gangs = np.repeat(space.class_scale_factors[:, None], rates.shape[1], axis=1)
            program = cp.Problem(
                cp.Maximize(1),
                [
                    x >= 0,
                    cp.sum(cp.multiply(gangs, x), axis=0) <= space.problem.worker_counts,
                    cp.sum(x, axis=1) <= np.ones(num_jobs),
                    cp.sum(cp.multiply(rates, x), axis=1) >= inverse_m * steps,
                ],
            )

            def current() -> np.ndarray:
                return np.asarray(x.value).clip(0.0, 1.0)[space.x_index >= 0]
        else:
            # Rows scaled by each job's best steps/s: the same feasible set, better conditioned.
            best = np.maximum(space.class_throughputs.max(axis=1), 1e-300)
            program = cp.Problem(
                cp.Maximize(0), [sp.diags(1.0 / best) @ throughput @ v >= inverse_m * (steps / best), *space.constraints(v)]
            )

            def current() -> np.ndarray:
                return np.asarray(v.value)
        build_s = time.perf_counter() - started
        timings = {"build_s": build_s, "compile_s": 0.0, "solver_s": 0.0, "iterations": 0.0}
        low, high, last_high = _GAVEL_MIN_M_S, _GAVEL_MAX_M_S, _GAVEL_MAX_M_S
        best_values, best_m, inaccurate = None, None, False
        for _ in range(20):  # widen the bracket at most 20 times (M up to 10^26 s)
            while _GAVEL_GAP * low < high:
                middle = (low + high) / 2.0
                inverse_m.value = 1.0 / middle
                outcome = solve(program, self.options)
                timings["iterations"] += 1
                timings["compile_s"] += outcome.timings.get("compile_s", 0.0)
                timings["solver_s"] += outcome.timings.get("solver_s", 0.0)
                # Gavel accepts only status "optimal" as feasible.
                if outcome.status == Status.OPTIMAL:
                    best_values, best_m, high = current(), middle, middle
                else:
                    inaccurate |= outcome.status == Status.OPTIMAL_INACCURATE
                    low = middle
            if best_values is not None:
                break
            low, high = last_high, last_high * 10.0
            last_high *= 10.0
        timings["solve_call_s"] = time.perf_counter() - started - build_s
        if best_values is None:
            return space.allocation(
                None, policy=self.name, status=Status.FAILED, objective=None, started_s=started,
                reason="no makespan up to 1e26 s is feasible", timings=timings,
            )
        return space.allocation(
            best_values, policy=self.name, status=Status.OPTIMAL, objective=best_m, started_s=started,
            reason="makespan found by Gavel's bisection (within 5% of optimal)", timings=timings,
        )


def min_total_duration(
    heterogeneity_aware: bool = True,
    space_sharing: bool = False,
    *,
    exact: bool = True,
    reference_type: str | None = None,
    solver: str = "CLARABEL",
    grouping: bool = True,
    exclude_oversized_gangs: bool = True,
    prune_dominated: bool = True,
    canon_backend: str | None = None,
    pair_variables: str = "auto",
) -> MinTotalDuration:
    """Minimum makespan. Gavel: min_total_duration (agnostic), _perf, _packed."""
    check_variant(heterogeneity_aware, space_sharing)
    options = SolveOptions(
        solver, grouping, exclude_oversized_gangs, prune_dominated, canon_backend, pair_variables=pair_variables
    )
    suffix = "_packed" if space_sharing else ("_perf" if heterogeneity_aware else "")
    return MinTotalDuration(
        heterogeneity_aware, space_sharing, exact, reference_type, options, "min_total_duration" + suffix
    )
