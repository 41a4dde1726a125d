"""The policy registry, Gavel's names as aliases, and the throughput table parser."""

from __future__ import annotations

import numpy as np
import pytest

from common.errors import DuplicatePolicyError, PolicyParameterError, ProblemError, UnknownPolicyError
from common.throughputs import format_job_key, parse_job_key, throughput_table_from_json
from tests.unit.policy.builders import gavel_table
from policy_service.core import (
    Fifo,
    MaxMinFairness,
    MaxSumThroughput,
    MinTotalDuration,
    Policy,
    Registry,
    WaterFilling,
    default_registry,
    make_policy,
    max_min_fairness,
    policy_names,
)

GAVEL_NAMES = {
    "allox", "fifo", "fifo_perf", "fifo_packed", "finish_time_fairness", "finish_time_fairness_perf",
    "finish_time_fairness_packed", "gandiva", "isolated", "max_min_fairness", "max_min_fairness_perf",
    "max_min_fairness_packed", "max_min_fairness_water_filling", "max_min_fairness_water_filling_perf",
    "max_min_fairness_water_filling_packed", "max_sum_throughput_perf",
    "max_sum_throughput_normalized_by_cost_perf", "max_sum_throughput_normalized_by_cost_perf_SLOs",
    "max_sum_throughput_normalized_by_cost_packed_SLOs", "min_total_duration", "min_total_duration_perf",
    "min_total_duration_packed",
}


def test_every_gavel_name_is_registered() -> None:
    assert GAVEL_NAMES <= set(policy_names())
    assert "proportional" in policy_names()


@pytest.mark.parametrize("name", sorted(GAVEL_NAMES | {"proportional"}))
def test_each_name_builds_a_policy_carrying_that_name(name: str) -> None:
    policy = make_policy(name)
    assert isinstance(policy, Policy)
    assert policy.name == name


def test_names_bind_variant_parameters() -> None:
    names = ("max_min_fairness", "max_min_fairness_perf", "max_min_fairness_packed")
    agnostic, aware, packed = (make_policy(n) for n in names)
    assert isinstance(agnostic, MaxMinFairness) and not agnostic.heterogeneity_aware
    assert aware.heterogeneity_aware and not aware.space_sharing
    assert packed.heterogeneity_aware and packed.space_sharing
    assert isinstance(make_policy("max_min_fairness_water_filling_packed"), WaterFilling)
    assert isinstance(make_policy("min_total_duration"), MinTotalDuration)
    assert not make_policy("fifo").heterogeneity_aware and isinstance(make_policy("fifo"), Fifo)
    slos = make_policy("max_sum_throughput_normalized_by_cost_packed_SLOs")
    assert isinstance(slos, MaxSumThroughput) and slos.cost_normalized and slos.enforce_slos and slos.space_sharing
    assert max_min_fairness().name == "max_min_fairness_perf"  # the family's default is aware


def test_overrides_reach_the_solver_options_and_keep_the_name() -> None:
    policy = make_policy("max_min_fairness_packed", solver="ECOS", grouping=False)
    assert policy.options.solver == "ECOS" and not policy.options.grouping
    assert policy.name == "max_min_fairness_packed"


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(UnknownPolicyError) as caught:
        make_policy("max_min_fairnes")
    assert "max_min_fairness_perf" in str(caught.value)
    assert caught.value.known == sorted(policy_names())


def test_unknown_parameters_are_named() -> None:
    with pytest.raises(PolicyParameterError, match="'solvr'"):
        make_policy("max_min_fairness_perf", solvr="ECOS")


def test_agnostic_space_sharing_is_refused() -> None:
    with pytest.raises(PolicyParameterError, match="space_sharing"):
        make_policy("max_min_fairness", space_sharing=True)


def test_a_name_registered_twice_is_an_error() -> None:
    registry = Registry()
    registry.register("mine", max_min_fairness)
    with pytest.raises(DuplicatePolicyError, match="'mine'"):
        registry.register("mine", max_min_fairness, heterogeneity_aware=False)
    with pytest.raises(DuplicatePolicyError):
        default_registry().register("fifo", max_min_fairness)


def test_registering_bad_bound_parameters_fails_at_registration() -> None:
    with pytest.raises(PolicyParameterError):
        Registry().register("bad", max_min_fairness, heterogeneity=True)


def test_solvers_are_parameters_and_ecos_reaches_the_same_optimum() -> None:
    from tests.unit.policy.builders import random_problem

    problem = random_problem(30, 5, gpus_per_type=8)
    names = ("max_min_fairness_perf", "max_min_fairness_packed", "min_total_duration_perf", "finish_time_fairness_perf")
    for name in names:
        clarabel = make_policy(name).allocate(problem)
        ecos = make_policy(name, solver="ECOS").allocate(problem)
        assert ecos.status == "optimal", (name, ecos.reason)
        assert ecos.objective == pytest.approx(clarabel.objective, rel=1e-5)


def test_randomised_policies_depend_only_on_the_injected_generator() -> None:
    from tests.unit.policy.builders import random_problem

    problem = random_problem(40, 1, gpus_per_type=8)
    for name in ("fifo", "gandiva"):
        first = make_policy(name, rng=np.random.default_rng(42)).allocate(problem)
        again = make_policy(name, rng=np.random.default_rng(42)).allocate(problem)
        np.random.seed(0)  # the global state plays no part
        third = make_policy(name, rng=np.random.default_rng(42)).allocate(problem)
        assert np.array_equal(first.job_fractions, again.job_fractions)
        assert np.array_equal(first.job_fractions, third.job_fractions)


def test_gavel_last_type_fifo_reproduces_gavels_agnostic_fifo() -> None:
    """Gavel's agnostic FIFO draws a type but uses the last open type by name (v100 here); when
    v100 fills, the *drawn* type leaves the list, so v100 can stay and soak up the queue; a job
    that completes hands its type to the head of the queue (state carried in policy_state)."""
    import random

    from policy_service.core import JobSpec, build_problem

    speeds = {"v100": 3.0, "p100": 2.0, "k80": 1.0}
    # a seed whose first draw (of 3 open types) is not v100's position: v100 stays open
    seed = next(s for s in range(100) if random.Random(s).randrange(3) != 2)
    policy = make_policy("fifo", type_choice="gavel_last_type", seed=seed)

    def problem(ids, state):
        jobs = [JobSpec(id=i, steps_remaining=1.0, throughputs_steps_per_s=speeds) for i in ids]
        return build_problem({"v100": 1, "p100": 1, "k80": 1}, jobs, policy_state=state)

    first = policy.allocate(problem(["0", "1", "2"], None))
    column = list(first.worker_types).index("v100")
    assert first.job_fractions[:, column].tolist() == [1.0, 1.0, 1.0]  # all on v100, oversubscribed
    # job 0 completes, job 3 arrives: 3 inherits v100 at the head of the queue
    second = policy.allocate(problem(["1", "2", "3"], first.policy_state))
    assert second.job_fractions[:, column].tolist() == [1.0, 1.0, 1.0]
    assert second.job_fractions.sum() == 3.0


# ----------------------------------------------------------------------------- the table


def test_the_shipped_table_parses(table) -> None:
    assert {"v100", "p100", "k80"} <= set(table.accelerator_types)
    assert len(table.job_keys) == 83
    assert table.isolated("ResNet-50 (batch size 64)", 1, "v100") == pytest.approx(4.39, abs=0.01)
    assert table.isolated("Recommendation (batch size 1024)", 1, "p100") == pytest.approx(30.7, abs=0.1)
    a, b = table.pair("ResNet-50 (batch size 64)", "LM (batch size 20)", 1, "v100")
    assert (b, a) == table.pair("LM (batch size 20)", "ResNet-50 (batch size 64)", 1, "v100")
    assert table.pair("A3C", "A3C", 2, "v100") is None  # A3C only runs on one GPU


def test_unknown_lookups_name_what_is_missing(table) -> None:
    with pytest.raises(ProblemError, match="unknown job type 'Foo'"):
        table.isolated("Foo", 1, "v100")
    with pytest.raises(ProblemError, match="accelerator type 'a100'"):
        table.isolated("A3C", 1, "a100")
    with pytest.raises(ProblemError, match="scale factor 8"):
        table.isolated("A3C", 8, "v100")


def test_job_keys_round_trip() -> None:
    assert parse_job_key("('ResNet-50 (batch size 64)', 4)") == ("ResNet-50 (batch size 64)", 4)
    assert parse_job_key(format_job_key("LM (batch size 5)", 2)) == ("LM (batch size 5)", 2)
    with pytest.raises(ProblemError):
        parse_job_key("ResNet-50, 4")


@pytest.mark.parametrize(
    "data,message",
    [
        ({}, "non-empty object"),
        ({"v100": []}, "v100: expected an object"),
        ({"v100": {"('A', 1)": {}}}, "'null' entry"),
        ({"v100": {"('A', 1)": {"null": -1}}}, "finite number >= 0"),
        ({"v100": {"('A', 1)": {"null": float("nan")}}}, "finite number >= 0"),
        ({"v100": {"('A', 1)": {"null": 1, "('B', 2)": [1, 1]}}}, "one scale factor"),
        ({"v100": {"('A', 1)": {"null": 1, "('B', 1)": [1]}}}, "[own, partner]"),
        ({"v100": {"A": {"null": 1}}}, "is not a job key"),
    ],
)
def test_malformed_tables_are_refused(data: dict, message: str) -> None:
    with pytest.raises(ProblemError) as caught:
        throughput_table_from_json(data)
    assert message in str(caught.value)


def test_the_table_survives_pickling_for_worker_processes() -> None:
    import pickle

    table = gavel_table()
    again = pickle.loads(pickle.dumps(table))
    assert again.isolated_steps_per_s == table.isolated_steps_per_s
    assert again.pair_steps_per_s == table.pair_steps_per_s
    assert again.isolated("ResNet-50 (batch size 64)", 1, "v100") == table.isolated("ResNet-50 (batch size 64)", 1, "v100")
