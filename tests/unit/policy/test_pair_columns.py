"""Space sharing when every job has its own throughput row: the forms that do not materialise
every job pair (column generation, pair_columns.py; partners keyed by colocation class,
packing.cell_colocation) reach the full pair program's optimum, to 1e-6 on the objective, with a
feasible allocation that scores that objective, for every `_packed` policy that solves a program.
Cost: ~15 s in all (the full program is solved beside each form)."""

from __future__ import annotations

import numpy as np
import pytest

from common.throughputs import ThroughputTable, format_job_key
from policy_service.core import REGISTRY, ClassPairSpec, JobSpec, PairSpec, Problem, build_problem, make_policy
from policy_service.core.allocation import expand_pairs
from policy_service.core.evaluate import objective_value
from policy_service.core.formulation import SolveOptions, build_space
from policy_service.core.problem import PreviousAllocation
from tests.unit.policy.builders import TYPES, assert_feasible, gavel_table

# fifo_packed is a heuristic (no program): nothing to compare.
PROGRAM_POLICIES = tuple(name for name in REGISTRY.names() if name.endswith(("_packed", "_packed_SLOs")) and name != "fifo_packed")


def per_job_rows(n: int, seed: int, *, table: ThroughputTable | None = None, entities: int = 0) -> Problem:
    """n jobs drawn from Gavel's table (as bench/policy_solve.py), each with its own row: the
    table's times a factor in [0.9, 1.1] per job and type; packing from class colocations (the
    estimator's form: the table's pair / alone per pair of job types)."""
    from policy_service.core import Entity

    table = table or gavel_table()
    rng = np.random.default_rng(seed)
    keys = sorted(table.job_keys)
    by_scale = {sf: [k for k in keys if k[1] == sf] for sf in (1, 2, 4, 8)}
    names = [f"e{e}" for e in range(entities)]
    jobs = []
    for i in range(n):
        sf = int(rng.choice([1, 2, 4, 8], p=[0.7, 0.1, 0.15, 0.05]))
        job_type = by_scale[sf][int(rng.integers(len(by_scale[sf])))][0]
        row = np.array([table.isolated(job_type, sf, k) for k in TYPES]) * rng.uniform(0.9, 1.1, len(TYPES))
        jobs.append(JobSpec(
            id=f"j{i}", job_type=job_type, scale_factor=sf, steps_remaining=float(1000 * (1 + i % 7)),
            time_since_arrival_s=float(37 * i % 500), throughputs_steps_per_s=dict(zip(TYPES, row.tolist(), strict=True)),
            colocation_class=format_job_key(job_type, sf), slo_s=float(5e4) if i % 5 == 0 else None,
            entity=names[i % len(names)] if names else None,
        ))
    present = sorted({(job.job_type, job.scale_factor) for job in jobs})
    colocations = []
    for x, (type_a, sf_a) in enumerate(present):
        for type_b, sf_b in present[x:]:
            if sf_a != sf_b:
                continue
            fractions = {}
            for k in TYPES:
                packed = table.pair(type_a, type_b, sf_a, k)
                if packed is not None:
                    alone = (table.isolated(type_a, sf_a, k), table.isolated(type_b, sf_b, k))
                    fractions[k] = tuple(min(1.0, p / s) if s > 0 else 0.0 for p, s in zip(packed, alone, strict=True))
            if fractions:
                colocations.append(ClassPairSpec((format_job_key(type_a, sf_a), format_job_key(type_b, sf_b)), fractions))
    count = max(8, n // 4)
    return build_problem(
        dict.fromkeys(TYPES, count), jobs, colocations=colocations, table=table,
        entities=[Entity(name, weight=float(e + 1)) for e, name in enumerate(names)],
        prices_per_hour={"v100": 2.48, "p100": 1.46, "k80": 0.45},
    )


def _relative_gap(a: float, b: float) -> float:
    return abs(a - b) / max(1.0, abs(a), abs(b))


def _assert_same_optimum(problem: Problem, name: str, form: str) -> None:
    full_policy = make_policy(name, pair_variables="class_pairs")
    policy = make_policy(name, pair_variables=form)
    full, fast = full_policy.allocate(problem), policy.allocate(problem)
    assert full.status == "optimal" and fast.status == "optimal", (full.reason, fast.reason)
    assert_feasible(problem, fast)
    # The same optimum, and an allocation that scores it (not only a reported number).
    assert _relative_gap(fast.objective, full.objective) < 1e-6, (fast.objective, full.objective)
    scored = objective_value(policy, problem, fast)
    if scored is not None and name != "max_min_fairness_water_filling_packed":  # levels, not one number
        assert _relative_gap(scored, full.objective) < 1e-6, (scored, full.objective)
    expand_pairs(fast.pairs)  # the packed time lays out as concrete job pairs


@pytest.mark.parametrize("name", PROGRAM_POLICIES)
def test_partners_by_colocation_class_reach_the_full_optimum(name: str) -> None:
    problem = per_job_rows(40, seed=1, entities=2 if "water_filling" in name else 0)
    space = build_space(problem, packing=True, options=SolveOptions(pair_variables="partner_keys"))
    assert space.partners is not None and space.partners.key_pairs is not None  # keyed by cells
    _assert_same_optimum(problem, name, "partner_keys")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_generated_pair_columns_reach_the_full_optimum(seed: int) -> None:
    _assert_same_optimum(per_job_rows(48, seed=seed), "max_min_fairness_packed", "generated")


def test_generated_columns_need_no_factorisation_pairs_listed_job_by_job() -> None:
    """Arbitrary per-pair steps/s (no class fractions): only column generation applies."""
    rng = np.random.default_rng(5)
    n = 30
    jobs = [
        JobSpec(id=f"j{i}", steps_remaining=1000.0, throughputs_steps_per_s=dict(zip(TYPES, rng.uniform(0.5, 2.0, 3).tolist(), strict=True)))
        for i in range(n)
    ]
    pairs = [
        PairSpec((f"j{i}", f"j{j}"), {k: tuple(rng.uniform(0.3, 1.2, 2).tolist()) for k in TYPES})
        for i in range(n) for j in range(i + 1, n) if rng.random() < 0.6
    ]
    problem = build_problem(dict.fromkeys(TYPES, 6), jobs, pairs=pairs)
    _assert_same_optimum(problem, "max_min_fairness_packed", "generated")


def test_auto_generates_only_where_classes_do_not_collapse() -> None:
    options = SolveOptions()
    per_job = per_job_rows(160, seed=3)
    space = build_space(per_job, packing=True, options=options, columns=[per_job.priority_weights], can_generate=True)
    assert space.pool is not None and space.pool.num_columns > 0
    # Policies that cannot generate get every variable they need (here: partners by cell).
    assert build_space(per_job, packing=True, options=options).pool is None
    # Jobs of one type sharing one row (a table): classes collapse, the grouped program as before.
    grouped = build_problem(dict.fromkeys(TYPES, 40), [
        JobSpec(id=f"g{i}", job_type=job.job_type, scale_factor=job.scale_factor, steps_remaining=1000.0)
        for i, job in enumerate(_specs_of(per_job))
    ], table=gavel_table())
    space = build_space(grouped, packing=True, options=options, columns=[grouped.priority_weights], can_generate=True)
    assert space.pool is None and space.mode == "class_pairs" and space.num_classes < grouped.num_jobs // 2


def _specs_of(problem: Problem) -> list[JobSpec]:
    return [JobSpec(id=job_id, job_type=job_type, scale_factor=int(sf), steps_remaining=1.0)
            for job_id, job_type, sf in zip(problem.job_ids, problem.job_types, problem.scale_factors, strict=True)]


def test_a_previous_allocation_warm_starts_generation() -> None:
    problem = per_job_rows(64, seed=4)
    policy = make_policy("max_min_fairness_packed", pair_variables="generated")
    cold = policy.allocate(problem)
    member_pairs, pair_fractions = expand_pairs(cold.pairs)
    previous = PreviousAllocation(
        job_fractions=cold.job_fractions,
        pair_jobs=np.asarray(member_pairs, dtype=np.int64).reshape(-1, 2),
        pair_fractions=np.asarray(pair_fractions).reshape(-1, problem.num_types),
    )
    from dataclasses import replace

    warm = policy.allocate(replace(problem, previous=previous))
    assert warm.status == "optimal"
    assert _relative_gap(warm.objective, cold.objective) < 1e-6
    assert warm.timings["iterations"] < cold.timings["iterations"], (warm.timings, cold.timings)


def test_solving_prints_nothing(capfd) -> None:
    """HiGHS announces itself on stdout unless built quietly; `gavel policy solve --json` and
    the services must keep stdout clean."""
    make_policy("max_min_fairness_packed", pair_variables="generated").allocate(per_job_rows(20, seed=6))
    out, _ = capfd.readouterr()
    assert out == ""


def test_another_solver_generates_through_cvxpy_with_its_duals() -> None:
    problem = per_job_rows(40, seed=7)
    generated = make_policy("max_min_fairness_packed", solver="ECOS", pair_variables="generated").allocate(problem)
    full = make_policy("max_min_fairness_packed", pair_variables="class_pairs").allocate(problem)
    assert generated.status == "optimal" and generated.timings["iterations"] >= 1
    assert _relative_gap(generated.objective, full.objective) < 1e-6
    assert_feasible(problem, generated)


def test_pricing_is_each_columns_reduced_gain_in_the_programs_own_matrices() -> None:
    """Candidates.gains_and_costs against the column's entries of the restricted program's
    matrices (every pool column present): gain = prices . throughput column, cost = time and
    GPU prices . budget and usage columns."""
    from policy_service.core.fairness import fairness_coefficients
    from policy_service.core.pair_columns import Candidates, Prices, column_codes

    problem = per_job_rows(30, seed=8)
    space = build_space(problem, packing=True, options=SolveOptions(pair_variables="generated"), can_generate=True)
    assert space.pool is not None
    full = space.with_pairs(space.pool.allowed)
    rng = np.random.default_rng(0)
    coefficients = fairness_coefficients(problem)[space.classes.representative]
    prices = Prices(rng.uniform(0, 1, space.num_classes) * coefficients, rng.uniform(0, 1, space.num_classes),
                    rng.uniform(0, 1, problem.num_types))
    candidates = Candidates.of(space)
    gain, cost = candidates.gains_and_costs(prices)
    # Variable of each candidate in the full program: its code is num_x + pool cell.
    codes = column_codes(full)
    variable = np.searchsorted(codes, space.num_x + candidates.column)
    assert np.array_equal(codes[variable], space.num_x + candidates.column)
    expected_gain = prices.throughput @ full.throughput()[:, variable].toarray()
    expected_cost = prices.budget @ full.budget[:, variable].toarray() + prices.usage @ full.usage[:, variable].toarray()
    np.testing.assert_allclose(gain, expected_gain, rtol=1e-12)
    np.testing.assert_allclose(cost, expected_cost, rtol=1e-12)


def test_generation_drops_stale_columns_and_still_reaches_the_full_optimum() -> None:
    """Columns priced well below their cost leave the restricted program (pair_columns
    DROP_RELATIVE); the answer is the full program's all the same."""
    problem = per_job_rows(96, seed=9)
    generated = make_policy("max_min_fairness_packed", pair_variables="generated").allocate(problem)
    assert generated.timings["columns_dropped"] > 0, dict(generated.timings)
    assert generated.timings["pair_columns"] == generated.timings["columns_added"] - generated.timings["columns_dropped"]
    _assert_same_optimum(problem, "max_min_fairness_packed", "generated")


def test_the_master_sheds_nonbasic_columns_and_keeps_its_basis() -> None:
    """highs_columns.MaxMinMaster: columns absent from a call are deleted; nonbasic ones leave
    the basis valid, so re-solving takes no pivot and returns the same optimum."""
    import scipy.sparse as sp

    from policy_service.core.highs_columns import MaxMinMaster

    rng = np.random.default_rng(3)
    num_classes, num_types, num_columns = 12, 2, 60
    level = sp.random(num_classes, num_columns, density=0.15, random_state=4, format="csc")
    level = level + sp.csc_matrix((rng.uniform(0.5, 1.0, num_classes), (np.arange(num_classes), np.arange(num_classes))),
                                  shape=level.shape)  # every class can reach a level alone
    budget = sp.csc_matrix((level != 0).astype(float))
    usage = sp.csc_matrix(rng.uniform(0.5, 2.0, (num_types, num_columns)))
    master = MaxMinMaster(num_classes, np.array([3.0, 2.0]))
    codes = np.arange(num_columns) * 7  # any stable names
    values, objective, duals, status = master.solve(codes, level, budget, usage)
    assert status == "optimal" and objective > 0
    mu, beta, gamma = duals
    assert abs(mu.sum() - 1.0) < 1e-9
    reduced = mu @ level.toarray() - beta @ budget.toarray() - gamma @ usage.toarray()
    stale = reduced < -1e-6  # nonbasic at zero
    assert stale.any() and np.all(values[stale] == 0)
    pivots = master.pivots
    keep = np.flatnonzero(~stale)
    again, objective_again, _, _ = master.solve(codes[keep], level[:, keep], budget[:, keep], usage[:, keep])
    assert objective_again == pytest.approx(objective, rel=1e-12)
    assert master.pivots == pivots  # the basis survived the deletion
    np.testing.assert_allclose(again, values[keep], atol=1e-12)
