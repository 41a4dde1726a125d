"""Max-min fairness under ECOS goes to ECOS without cvxpy (policy_service/core/compiled_ecos.py):
the arrays are the ones cvxpy's ECOS interface builds, element by element, and the answers the
cvxpy path's to the bit, on random problems of preset "gavel"'s form (per-job variables, per-job
pairs, nothing pruned) and on grouped ones (partner keys: ECOS's equality rows)."""

from __future__ import annotations

from dataclasses import replace

import cvxpy as cp
import numpy as np
import pytest
from cvxpy.reductions.solvers.conic_solvers.ecos_conif import ECOS
from cvxpy.settings import SOLUTION_PRESENT

from policy_service.core import JobSpec, PairSpec, build_problem
from policy_service.core.compiled_ecos import (
    _SOLUTION_PRESENT,
    ECOS_STATUS,
    EcosData,
    ecos_data,
    entry_layout,
    solve_ecos,
    space_ecos_data,
)
from policy_service.core.fairness import (
    MaxMinFairness,
    fairness_coefficients,
    fairness_view,
    max_min_fairness,
)
from policy_service.core.formulation import SolveOptions, build_space
from policy_service.core.problem import Problem
from policy_service.core.sparse import sp
from tests.unit.policy.builders import assert_feasible, random_problem

TYPES = ("v100", "p100", "k80")
# Preset "gavel"'s options (policy_service/answer.py PRESET_PARAMETERS)
GAVEL = {"solver": "ECOS", "grouping": False, "prune_dominated": False, "exclude_oversized_gangs": False}


def _random_problem(seed: int, packing: bool) -> Problem:
    """1-60 jobs on 1-3 types (1-36 GPUs each), scale factors 1/2/4/8, throughputs with ~15%
    zeros, priority weights 1/2/5, and with ``packing`` random pairs
    of jobs of one scale factor with their packed throughputs (some zero)."""
    rng = np.random.default_rng(seed)
    num_jobs = int(rng.integers(1, 61))
    types = TYPES[: int(rng.integers(1, 4))]
    # Every job must be able to run somewhere (build_problem refuses it otherwise): the first
    # type holds any gang and runs every job; the others may be smaller than a gang (preset
    # gavel keeps those variables) and have zero throughputs.
    counts = {t: int(rng.choice([8, 16, 36])) if k == 0 else int(rng.choice([1, 2, 4, 8, 16])) for k, t in enumerate(types)}
    scale_factors = rng.choice([1, 2, 4, 8], size=num_jobs, p=[0.55, 0.15, 0.2, 0.1])
    rates = rng.uniform(0.05, 20.0, size=(num_jobs, len(types))) * (rng.random((num_jobs, len(types))) > 0.15)
    rates[:, 0] = np.maximum(rates[:, 0], 0.05)
    jobs = [
        JobSpec(
            id=f"j{i}", steps_remaining=float(rng.integers(1, 10**6)), scale_factor=int(scale_factors[i]),
            priority_weight=float(rng.choice([1.0, 2.0, 5.0])),
            throughputs_steps_per_s={t: float(rates[i, k]) for k, t in enumerate(types)},
        )
        for i in range(num_jobs)
    ]
    pairs = []
    if packing:
        for i in range(num_jobs):
            for j in range(i + 1, num_jobs):
                if scale_factors[i] == scale_factors[j] and rng.random() < 0.3:
                    shares = rng.uniform(0.2, 0.9, size=(len(types), 2)) * (rng.random((len(types), 1)) > 0.1)
                    pairs.append(PairSpec(
                        (f"j{i}", f"j{j}"),
                        {t: (float(rates[i, k] * shares[k, 0]), float(rates[j, k] * shares[k, 1])) for k, t in enumerate(types)},
                    ))
    return build_problem(counts, jobs, pairs=pairs)


def _program(problem: Problem, options: SolveOptions, aware: bool, packing: bool):
    """The space, level matrix and class coefficients of MaxMinFairness.allocate, and the cvxpy
    program of its ``_restricted``."""
    view = fairness_view(problem, aware)
    space = build_space(view, packing=packing, options=options, columns=[problem.priority_weights], can_generate=True)
    coefficients = fairness_coefficients(view)[space.classes.representative]
    level_matrix = sp.diags(coefficients) @ space.throughput()
    v = cp.Variable(space.num_vars, nonneg=True)
    level = cp.Variable()
    constraints = [
        level_matrix @ v >= level, space.budget @ v <= 1, space.usage @ v <= space.problem.worker_counts,
        *space.pairing_constraints(v),
    ]
    return space, level_matrix, coefficients, cp.Problem(cp.Maximize(level), constraints)


def _assert_same_sparse(ours: sp.spmatrix | None, theirs: sp.spmatrix | None) -> None:
    if theirs is None:
        assert ours is None
        return
    assert ours.shape == theirs.shape
    assert np.array_equal(ours.indptr, theirs.indptr)
    assert np.array_equal(ours.indices, theirs.indices)
    assert np.array_equal(ours.data, theirs.data)


def _check_against_cvxpy(space, level_matrix, coefficients, program) -> bool:
    """Each layout (from the matrices; from the space's entries, which the policy uses) against
    cvxpy's; whether the entries' layout was made."""
    expected, _, _ = program.get_problem_data(cp.ECOS)
    counts = space.problem.worker_counts
    _assert_data_equal(ecos_data(level_matrix, space.budget, space.usage, counts, space.balance, space.no_self), expected)
    _assert_data_equal(space_ecos_data(space, coefficients), expected)
    entries = entry_layout(space, coefficients)
    if entries is not None:  # the layout the policy uses (not given way to the matrices)
        _assert_data_equal(entries, expected)
    return entries is not None


def _assert_data_equal(data: EcosData, expected: dict) -> None:
    assert np.array_equal(data.c, expected["c"])
    _assert_same_sparse(data.g, expected["G"])
    assert np.array_equal(data.h, expected["h"])
    _assert_same_sparse(data.a, expected["A"])
    assert (data.b is None) == (expected["b"] is None)
    if data.b is not None:
        assert np.array_equal(data.b, expected["b"])
    dims = expected["dims"]
    assert data.dims == {"l": dims.nonneg, "q": dims.soc, "e": dims.exp}
    assert data.a is None or data.a.shape[0] == dims.zero


CASES = [(seed, packing, aware) for seed in range(12) for packing, aware in ((False, True), (False, False), (True, True))]


@pytest.mark.parametrize(("seed", "packing", "aware"), CASES)
def test_the_ecos_data_are_cvxpys(seed: int, packing: bool, aware: bool) -> None:
    problem = _random_problem(seed, packing)
    space, level_matrix, coefficients, program = _program(problem, SolveOptions(**GAVEL), aware, packing)
    assert space.num_classes == problem.num_jobs  # preset gavel: a row per job
    assert _check_against_cvxpy(space, level_matrix, coefficients, program)


@pytest.mark.parametrize(("n", "seed", "weights"), [(24, 3, False), (48, 4, True)])
def test_the_ecos_data_with_equality_rows_are_cvxpys(n: int, seed: int, weights: bool) -> None:
    """Grouped partner keys (ECOS with the default grouping): balance rows are ECOS's A, b."""
    problem = random_problem(n, seed, weights=weights)
    options = SolveOptions(solver="ECOS", pair_variables="partner_keys")
    space, level_matrix, coefficients, program = _program(problem, options, True, True)
    assert space.balance is not None and space.balance.shape[0] > 0
    assert space.no_self is not None and (space.no_self.shape[0] > 0) == weights  # both forms of G's tail
    assert _check_against_cvxpy(space, level_matrix, coefficients, program)


def _through_cvxpy(policy: MaxMinFairness) -> MaxMinFairness:
    """The same policy on the cvxpy path: ECOS's default iteration limit passed as an option
    (a solver option keeps the program on cvxpy; the value is ECOS's own, so the same solve)."""
    options = SolveOptions(
        policy.options.solver, policy.options.grouping, policy.options.exclude_oversized_gangs,
        policy.options.prune_dominated, solver_options={"max_iters": 100}, pair_variables=policy.options.pair_variables,
    )
    return MaxMinFairness(policy.heterogeneity_aware, policy.space_sharing, options, policy.name)


@pytest.mark.parametrize(("seed", "packing", "aware"), CASES)
def test_the_answers_are_the_cvxpy_paths_to_the_bit(seed: int, packing: bool, aware: bool) -> None:
    problem = _random_problem(seed, packing)
    compiled = max_min_fairness(aware, packing, **GAVEL)
    through_cvxpy = _through_cvxpy(compiled)
    # The restricted program's answer: values, level and the prices column generation reads.
    space, _, coefficients, _ = _program(problem, compiled.options, aware, packing)
    ours, theirs = compiled._restricted(space, coefficients), through_cvxpy._restricted(space, coefficients)
    assert (ours.status, ours.reason) == (theirs.status, theirs.reason)
    assert np.array_equal(ours.values, theirs.values)
    assert ours.objective == theirs.objective and ours.objective is not None
    for field in ("throughput", "budget", "usage"):
        assert np.array_equal(getattr(ours.prices, field), getattr(theirs.prices, field))
    # The whole allocation.
    allocation, expected = compiled.allocate(problem), through_cvxpy.allocate(problem)
    assert_feasible(problem, allocation)
    assert (allocation.status, allocation.objective) == (expected.status, expected.objective)
    assert np.array_equal(allocation.job_fractions, expected.job_fractions)
    assert np.array_equal(allocation.pairs.group_pairs, expected.pairs.group_pairs)
    assert np.array_equal(allocation.pairs.pair_time, expected.pairs.pair_time)


@pytest.mark.parametrize(("n", "seed", "form"), [(40, 7, "partner_keys"), (300, 8, "generated")])
def test_grouped_ecos_answers_are_the_cvxpy_paths_to_the_bit(n: int, seed: int, form: str) -> None:
    """ECOS with grouping: partner keys (equality rows) and generated pair columns (the prices
    drive which columns enter, so every restricted program's duals must be cvxpy's)."""
    problem = random_problem(n, seed, weights=True)
    compiled = max_min_fairness(True, True, solver="ECOS", pair_variables=form)
    allocation, expected = compiled.allocate(problem), _through_cvxpy(compiled).allocate(problem)
    # (ECOS ends the generated program's last solve "optimal_inaccurate", either way)
    assert allocation.status == expected.status and allocation.status.startswith("optimal")
    assert allocation.objective == expected.objective
    assert np.array_equal(allocation.job_fractions, expected.job_fractions)
    assert np.array_equal(allocation.pairs.pair_time, expected.pairs.pair_time)
    assert allocation.pairs.pair_time.sum() > 0  # it packs


def test_an_infeasible_program_returns_no_values() -> None:
    # A type with -1 GPUs: usage v <= -1 has no solution with v >= 0; with half a GPU, one
    # variable of level 2 at 0.5 gives the level 1.
    level = sp.csr_matrix(np.array([[1.0, 2.0]]))
    budget = sp.csr_matrix(np.array([[1.0, 1.0]]))
    usage = sp.csr_matrix(np.array([[1.0, 1.0]]))
    infeasible = solve_ecos(ecos_data(level, budget, usage, np.array([-1.0])))
    assert infeasible.values is None and infeasible.level is None
    assert infeasible.status.startswith("infeasible")
    optimal = solve_ecos(ecos_data(level, budget, usage, np.array([0.5])))
    assert optimal.status == "optimal" and optimal.level == pytest.approx(1.0, abs=1e-7)


def test_ecos_exit_flags_read_as_cvxpy_reads_them() -> None:
    assert ECOS_STATUS == ECOS.STATUS_MAP
    assert set(_SOLUTION_PRESENT) == set(SOLUTION_PRESENT)


def test_a_space_whose_entries_repeat_is_laid_out_from_its_summed_matrices() -> None:
    """No Space repeats a (row, column) today; one that did would have it summed by scipy in its
    matrices, which cvxpy reads: the layout from entries must then give way to them."""
    problem = _random_problem(3, packing=True)
    space, level_matrix, coefficients, program = _program(problem, SolveOptions(**GAVEL), True, True)
    rows, cols, vals = (np.concatenate(part) for part in space.budget_triplets)
    halves = ([rows, rows], [cols, cols], [vals / 2, vals / 2])  # (1/size halves sum back exactly)
    split = replace(space, budget_triplets=halves)
    assert np.array_equal(split.budget.toarray(), space.budget.toarray())
    assert not _check_against_cvxpy(split, level_matrix, coefficients, program)  # the entries repeat
