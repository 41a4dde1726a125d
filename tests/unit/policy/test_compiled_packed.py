"""The packed max-min program where classes collapse goes to CLARABEL without cvxpy
(policy_service/core/compiled_packed.py): the same standard form as cvxpy's, so the same
optimum (to 1e-6 and in fact to the bit) and the same allocation, on random collapsed problems
in both pair forms."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

from policy_service.core import make_policy
from policy_service.core.compiled_packed import solve_packed_max_min, standard_form
from policy_service.core.fairness import fairness_coefficients, fairness_view
from policy_service.core.formulation import SolveOptions, build_space
from policy_service.core.sparse import sp
from tests.unit.policy.builders import assert_feasible, random_problem


def _space_and_level(problem, pair_variables: str):  # noqa: ANN001, ANN202
    view = fairness_view(problem, True)
    space = build_space(
        view, packing=True, options=SolveOptions(pair_variables=pair_variables),
        columns=[problem.priority_weights], can_generate=True,
    )
    coefficients = fairness_coefficients(view)[space.classes.representative]
    return space, sp.diags(coefficients) @ space.throughput()


def _cvxpy_program(space, level_matrix):  # noqa: ANN001, ANN202
    """The program as fairness.MaxMinFairness._restricted wrote it for cvxpy."""
    v = cp.Variable(space.num_vars, nonneg=True)
    level = cp.Variable()
    constraints = [
        level_matrix @ v >= level, space.budget @ v <= 1, space.usage @ v <= space.problem.worker_counts,
        *space.pairing_constraints(v),
    ]
    return cp.Problem(cp.Maximize(level), constraints), v, level


CASES = [(n, seed, form, weights) for n, seed, form, weights in [
    (12, 0, "class_pairs", False), (30, 1, "class_pairs", False), (60, 2, "class_pairs", True),
    (24, 3, "partner_keys", False), (48, 4, "partner_keys", True), (80, 5, "auto", True),
]]


@pytest.mark.parametrize(("n", "seed", "form", "weights"), CASES)
def test_the_standard_form_is_cvxpys(n: int, seed: int, form: str, weights: bool) -> None:
    problem = random_problem(n, seed, weights=weights)
    space, level_matrix = _space_and_level(problem, form)
    assert space.pool is None and space.num_classes < n  # classes collapse (rows from the table)
    program, _, _ = _cvxpy_program(space, level_matrix)
    data, _, _ = program.get_problem_data(cp.CLARABEL)
    a, b, q, num_eq, num_ineq = standard_form(
        level_matrix, space.budget, space.usage, problem.worker_counts, space.balance, space.no_self
    )
    expected = data["A"].tocsc()
    assert (num_eq, num_ineq) == (data["dims"].zero, data["dims"].nonneg)
    assert np.array_equal(expected.indptr, a.indptr)
    assert np.array_equal(expected.indices, a.indices)
    assert np.array_equal(expected.data, a.data)
    assert np.array_equal(data["b"], b) and np.array_equal(data["c"], q)


@pytest.mark.parametrize(("n", "seed", "form", "weights"), CASES)
def test_the_compiled_solve_reaches_cvxpys_optimum_and_solution(n: int, seed: int, form: str, weights: bool) -> None:
    problem = random_problem(n, seed, weights=weights)
    space, level_matrix = _space_and_level(problem, form)
    program, v, level = _cvxpy_program(space, level_matrix)
    program.solve(solver="CLARABEL")
    solution = solve_packed_max_min(
        level_matrix, space.budget, space.usage, problem.worker_counts, space.balance, space.no_self
    )
    assert solution.status == program.status == "optimal"
    assert solution.level == pytest.approx(level.value, abs=1e-6, rel=1e-6)
    assert solution.level > 0
    assert np.array_equal(solution.values, v.value)  # same data, same iterates


def test_the_policy_answers_as_through_cvxpy() -> None:
    """The whole packed policy: the compiled path (default) against the same program through
    cvxpy (CLARABEL with a solver option, which keeps the cvxpy path)."""
    problem = random_problem(40, 7, weights=True)
    compiled = make_policy("max_min_fairness_packed").allocate(problem)
    through_cvxpy = make_policy("max_min_fairness_packed")
    through_cvxpy = type(through_cvxpy)(
        through_cvxpy.heterogeneity_aware, through_cvxpy.space_sharing,
        SolveOptions(solver_options={"max_iter": 200}), through_cvxpy.name,
    ).allocate(problem)
    assert_feasible(problem, compiled)
    assert compiled.objective == pytest.approx(through_cvxpy.objective, abs=1e-6)
    assert np.array_equal(compiled.job_fractions, through_cvxpy.job_fractions)
    assert np.array_equal(compiled.pairs.pair_time, through_cvxpy.pairs.pair_time)
    assert compiled.pairs.pair_time.sum() > 0  # it packs


def test_an_infeasible_solve_returns_no_values() -> None:
    # A type with -1 GPUs: usage v <= -1 has no solution with v >= 0; with half a GPU, one
    # variable of level 2 at 0.5 gives the level 1.
    level = sp.csr_matrix(np.array([[1.0, 2.0]]))
    budget = sp.csr_matrix(np.array([[1.0, 1.0]]))
    usage = sp.csr_matrix(np.array([[1.0, 1.0]]))
    infeasible = solve_packed_max_min(level, budget, usage, np.array([-1.0]))
    assert infeasible.values is None and infeasible.level is None
    assert infeasible.status.startswith("infeasible")
    optimal = solve_packed_max_min(level, budget, usage, np.array([0.5]))
    assert optimal.status == "optimal" and optimal.level == pytest.approx(1.0, abs=1e-7)
