"""Max-min fairness / least attained service (paper section 4.1; Gavel's max_min_fairness*.py).

    maximize   min_j  s_j / (w_j * E_j) * throughput_j(X)
    subject to X >= 0, each job's time <= 1, each type's GPUs <= N_k

throughput_j(X) = sum_k T[j, k] X[j, k] (+ packed terms with space sharing). E_j is the job's
steps/s under an equal share of every type (baselines.equal_share_throughputs), so 1.0 means
"as fast as with 1/n of the cluster" up to a common factor; multiplying by the scale factor s_j
makes a 4-GPU job count its GPU-time, as Gavel does ("a job run on 1 GPU should receive
scale_factor more time than a job run on scale_factor GPUs"); w_j is the priority weight.

Heterogeneity-agnostic: T taken as all ones (time shares, Gavel's MaxMinFairnessPolicy).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from common.errors import PolicyParameterError
from policy_service.core.allocation import Allocation, Status, empty_allocation
from policy_service.core.baselines import agnostic_unit_throughputs, equal_share_throughputs
from policy_service.core.formulation import SolveOptions, build_space
from policy_service.core.compiled import solve_max_min
from policy_service.core.compiled_ecos import solve_ecos, space_ecos_data
from policy_service.core.compiled_packed import solve_packed_max_min
from policy_service.core.highs_columns import MaxMinMaster
from policy_service.core.allocation import expand_pairs
from policy_service.core.packing import cell_average_problem, cell_colocation
from policy_service.core.pair_columns import Prices, Restricted, column_codes, job_pair_columns, solve_by_columns
from policy_service.core.solving import STATUS_OF, solve
from policy_service.core.problem import Problem
from policy_service.core.sparse import sp

if TYPE_CHECKING:  # annotations only: cvxpy is loaded when a program is built
    import cvxpy as cp

    from policy_service.core.formulation import Space


def fairness_view(problem: Problem, heterogeneity_aware: bool) -> Problem:
    """The throughputs the policy optimises with (all ones when agnostic)."""
    return problem if heterogeneity_aware else agnostic_unit_throughputs(problem)


def fairness_coefficients(problem: Problem) -> np.ndarray:
    """(n,) s_j / (w_j * E_j): multiplies a job's steps/s into its fairness level."""
    return problem.scale_factors / (problem.priority_weights * equal_share_throughputs(problem))


def check_variant(heterogeneity_aware: bool, space_sharing: bool) -> None:
    if space_sharing and not heterogeneity_aware:
        raise PolicyParameterError(
            "space_sharing=True needs heterogeneity_aware=True: packing decisions depend on measured "
            "pair throughputs, which an agnostic policy does not use"
        )


@dataclass(frozen=True)
class MaxMinFairness:
    heterogeneity_aware: bool = True
    space_sharing: bool = False
    options: SolveOptions = field(default_factory=SolveOptions)
    name: str = "max_min_fairness_perf"

    @property
    def reads_previous(self) -> bool:
        """Whether ``allocate`` looks at ``problem.previous``: only the packed program does (its
        column generation starts from the last allocation's pairs, pair_columns.py), so a
        caller answering in process may leave it out of the others' problems."""
        return self.space_sharing

    def allocate(self, problem: Problem) -> Allocation:
        started = time.perf_counter()
        if problem.num_jobs == 0:
            return empty_allocation(self.name, problem.job_ids, problem.worker_types)
        view = fairness_view(problem, self.heterogeneity_aware)
        coefficients = fairness_coefficients(view)
        # Classes must agree on everything the program reads: throughputs and scale factor
        # (added by build_space) and the priority weight.
        space = build_space(
            view, packing=self.space_sharing, options=self.options, columns=[problem.priority_weights],
            can_generate=True,
        )
        if not self.space_sharing and self.options.grouping and self.options.solver == "CLARABEL":
            return self._compiled(space, coefficients, started)
        class_coefficients = coefficients[space.classes.representative]
        if space.pool is not None:  # one row per job: pair columns by generation (pair_columns.py)
            build_s = time.perf_counter() - started
            master = MaxMinMaster(space.num_classes, space.problem.worker_counts) if self.options.solver == "CLARABEL" else None
            final, result, timings = solve_by_columns(
                space, lambda s: self._restricted(s, class_coefficients, master=master), seed=self._seed(space)
            )
            return final.allocation(
                result.values, policy=self.name, status=result.status, objective=result.objective,
                started_s=started, reason=result.reason, timings={**timings, "build_s": build_s},
            )
        result = self._restricted(space, class_coefficients, started)
        return space.allocation(
            result.values, policy=self.name, status=result.status, objective=result.objective,
            started_s=started, reason=result.reason, timings=result.timings,
        )

    def _seed(self, space) -> np.ndarray | None:  # noqa: ANN001
        """First columns from the same problem with each colocation class at its mean row
        (packing.cell_average_problem: classes collapse, one small grouped solve): the job pairs
        that answer packs, laid out job by job."""
        cells = cell_colocation(space.problem)
        if cells is None:
            return None
        grouped = replace(self, options=replace(self.options, pair_variables="class_pairs"))
        answer = grouped.allocate(cell_average_problem(space.problem, cells))
        if not answer.status.startswith("optimal"):
            return None
        pair_jobs, fractions = expand_pairs(answer.pairs)
        return job_pair_columns(space, pair_jobs, fractions)

    def _restricted(
        self, space, class_coefficients: np.ndarray, started: float | None = None,  # noqa: ANN001
        master: MaxMinMaster | None = None,
    ) -> Restricted:
        """The program over the space's variables, with the prices of its pair columns."""
        started = time.perf_counter() if started is None else started
        if self.options.solver == "ECOS" and not self.options.solver_options:
            return self._ecos_restricted(space, class_coefficients, started)
        level_matrix = sp.diags(class_coefficients) @ space.throughput()
        # Generated columns with the default solver: one warm-started HiGHS simplex model over
        # the rounds (highs_columns.MaxMinMaster: no cvxpy canonicalisation per round, and no
        # interior-point fill-in). The full program keeps CLARABEL, in cvxpy's own layout
        # (compiled_packed.py), so allocations where classes collapse (the simulator's) are
        # unchanged to the bit.
        if master is not None:
            build_s = time.perf_counter() - started
            values, level, duals, status = master.solve(
                column_codes(space), level_matrix, space.budget, space.usage
            )
            outcome_status = STATUS_OF.get(status, Status.FAILED)
            timings = {"build_s": build_s, "solve_call_s": time.perf_counter() - started - build_s}
            reason = "" if outcome_status == Status.OPTIMAL else f"solver HiGHS returned {status}"
            prices = None
            if duals is not None:
                mu, beta, gamma = duals
                prices = Prices(mu * class_coefficients, beta, gamma)
            return Restricted(values, level, outcome_status, reason, timings, prices)
        if self.options.solver == "CLARABEL" and not self.options.solver_options:
            return self._compiled_restricted(space, level_matrix, class_coefficients, started)
        import cvxpy as cp  # noqa: PLC0415 - loaded when a program is built, not when the package is imported
        v = cp.Variable(space.num_vars, nonneg=True)
        level = cp.Variable()
        fair = level_matrix @ v >= level
        time_rows, gpu_rows = space.budget @ v <= 1, space.usage @ v <= space.problem.worker_counts
        program = cp.Problem(cp.Maximize(level), [fair, time_rows, gpu_rows, *space.pairing_constraints(v)])
        outcome = solve(program, self.options, build_s=time.perf_counter() - started)
        optimal = level.value is not None and outcome.status.startswith("optimal")
        prices = None
        if optimal and fair.dual_value is not None:
            prices = Prices(
                np.asarray(fair.dual_value) * class_coefficients, np.asarray(time_rows.dual_value),
                np.asarray(gpu_rows.dual_value),
            )
        return Restricted(
            v.value, float(level.value) if optimal else None, outcome.status, outcome.reason, outcome.timings, prices
        )

    def _compiled_restricted(
        self, space, level_matrix: sp.spmatrix, class_coefficients: np.ndarray, started: float,  # noqa: ANN001
    ) -> Restricted:
        """The cvxpy program of ``_restricted`` in CLARABEL's standard form, laid out as cvxpy lays
        it out (policy_service.core.compiled_packed): the same solution, without cvxpy's
        canonicalisation (20 of the 29 ms of CPU a packed answer cost at Gavel's paper scale)."""
        solve_started = time.perf_counter()
        solution = solve_packed_max_min(
            level_matrix, space.budget, space.usage, space.problem.worker_counts, space.balance, space.no_self
        )
        timings = {"build_s": solve_started - started, "solve_call_s": time.perf_counter() - solve_started}
        status = STATUS_OF.get(solution.status, Status.FAILED)
        reason = "" if status == Status.OPTIMAL else f"solver {self.options.solver} returned {solution.status}"
        prices = None
        if solution.values is not None:
            prices = Prices(solution.level_duals * class_coefficients, solution.time_duals, solution.gpu_duals)
        return Restricted(solution.values, solution.level, status, reason, timings, prices)

    def _ecos_restricted(self, space: Space, class_coefficients: np.ndarray, started: float) -> Restricted:
        """The cvxpy program of ``_restricted`` in ECOS's standard form, laid out and read back as
        cvxpy does (policy_service.core.compiled_ecos): preset "gavel"'s answers to the bit, without
        cvxpy's canonicalisation (~5 of the ~5.7 ms each per-job program cost at Gavel's scale)."""
        solve_started = time.perf_counter()
        solution = solve_ecos(space_ecos_data(space, class_coefficients))
        build_s = solve_started - started
        if solution.status == "solver_error":  # what cvxpy raises, and solving.solve reports
            reason = "solver ECOS failed: Solver 'ECOS' failed. Try another solver, or solve with verbose=True for more information."
            return Restricted(None, None, Status.FAILED, reason, {"build_s": build_s}, None)
        timings = {"build_s": build_s, "solver_s": solution.solve_time_s, "solve_call_s": time.perf_counter() - solve_started}
        status = STATUS_OF.get(solution.status, Status.FAILED)
        reason = "" if status == Status.OPTIMAL else f"solver ECOS returned {solution.status}"
        prices = None
        if solution.level is not None:
            prices = Prices(solution.level_duals * class_coefficients, solution.time_duals, solution.gpu_duals)
        return Restricted(solution.values, solution.level, status, reason, timings, prices)

    def _compiled(self, space, coefficients: np.ndarray, started: float) -> Allocation:  # noqa: ANN001
        """The same LP in CLARABEL's standard form, without cvxpy (policy_service.core.compiled)."""
        reps = space.classes.representative
        allowed = space.x_mask
        solve_started = time.perf_counter()
        x, level, status = solve_max_min(
            coefficients[reps, None] * space.class_throughputs,
            space.classes.sizes * space.class_scale_factors,
            space.problem.worker_counts,
            allowed,
        )
        timings = {"build_s": solve_started - started, "solve_call_s": time.perf_counter() - solve_started}
        outcome_status = STATUS_OF.get(status, Status.FAILED)
        values = x[allowed] if x is not None else None
        return space.allocation(
            values, policy=self.name, status=outcome_status,
            objective=level if outcome_status.startswith("optimal") else None, started_s=started,
            reason="" if outcome_status == Status.OPTIMAL else f"solver {self.options.solver} returned {status}",
            timings=timings,
        )


def max_min_fairness(
    heterogeneity_aware: bool = True,
    space_sharing: bool = False,
    *,
    solver: str = "CLARABEL",
    grouping: bool = True,
    exclude_oversized_gangs: bool = True,
    prune_dominated: bool = True,
    canon_backend: str | None = None,
    pair_variables: str = "auto",
) -> MaxMinFairness:
    """Max-min fairness (LAS). Gavel: max_min_fairness (agnostic), _perf (aware), _packed."""
    check_variant(heterogeneity_aware, space_sharing)
    options = SolveOptions(
        solver, grouping, exclude_oversized_gangs, prune_dominated, canon_backend, pair_variables=pair_variables
    )
    name = _gavel_name("max_min_fairness", heterogeneity_aware, space_sharing)
    return MaxMinFairness(heterogeneity_aware, space_sharing, options, name)


def _gavel_name(base: str, heterogeneity_aware: bool, space_sharing: bool) -> str:
    if space_sharing:
        return base + "_packed"
    return base + ("_perf" if heterogeneity_aware else "")
