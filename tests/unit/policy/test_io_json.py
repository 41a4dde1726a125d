"""The JSON formats: round trips, and every bad input refused with one line naming the field."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest

from common.errors import ProblemError
from policy_service.core import (
    allocation_from_json,
    allocation_to_json,
    make_policy,
    prices_from_json,
    problem_from_json,
    problem_to_json,
)
from policy_service.core.allocation import NOISE_FRACTION
from tests.unit.policy.builders import DATA, assert_feasible, gavel_table, random_problem

EXAMPLE = {
    "worker_types": {"v100": 4, "p100": 4, "k80": 4},
    "jobs": [
        {"id": "7", "job_type": "ResNet-50 (batch size 64)", "scale_factor": 1, "priority_weight": 1.0,
         "throughputs": {"v100": 4.4, "p100": 2.6, "k80": 0.62}, "steps_remaining": 100000,
         "time_since_arrival_s": 3600.0, "slo_s": None, "entity": "teamA"},
        {"id": "9", "job_type": "LM (batch size 20)", "scale_factor": 1, "priority_weight": 2.0,
         "throughputs": {"v100": 7.5, "p100": 5.0, "k80": 2.1}, "steps_remaining": 5000,
         "time_since_arrival_s": 60.0, "slo_s": 86400.0, "entity": None},
    ],
    "pairs": [{"jobs": ["7", "9"], "throughputs": {"v100": [2.0, 3.1], "p100": [1.5, 2.0]}}],
    "entities": {"teamA": {"weight": 2.0, "policy": "fairness"}},
    "prices_per_hour": {"v100": 2.48, "p100": 1.46, "k80": 0.45},
}


def test_the_issue_example_parses_and_round_trips() -> None:
    problem = problem_from_json(EXAMPLE)
    assert problem.job_ids == ("7", "9")
    assert problem.colocation_source == "pairs"
    assert problem.colocation.job_pair_throughputs(np.array([1]), np.array([0]))[1][0].tolist() == [
        [3.1, 2.0], [2.0, 1.5], [0.0, 0.0]
    ]
    again = problem_from_json(json.loads(json.dumps(problem_to_json(problem))))
    assert again == problem


def test_a_table_fills_throughputs_and_pairs_and_the_round_trip_keeps_them(table) -> None:
    data = {
        "worker_types": {"v100": 2, "k80": 2},
        "jobs": [{"id": str(i), "job_type": t, "steps_remaining": 10} for i, t in
                 enumerate(["ResNet-50 (batch size 64)", "ResNet-50 (batch size 64)", "LM (batch size 20)"])],
    }
    problem = problem_from_json(data, table)
    assert problem.throughputs_steps_per_s[0, 0] == table.isolated("ResNet-50 (batch size 64)", 1, "v100")
    assert problem.colocation_source == "table"
    # Two keys: pairs (0, 0), (0, 1), (1, 1) — every combination with one scale factor.
    assert problem.colocation.key_pairs.tolist() == [[0, 0], [0, 1], [1, 1]]
    assert problem_from_json(json.loads(json.dumps(problem_to_json(problem))), table) == problem


def test_random_problems_round_trip() -> None:
    problem = random_problem(50, 3, with_slos=True, entities=("a", "b"), weights=True)
    assert problem_from_json(json.loads(json.dumps(problem_to_json(problem))), gavel_table()) == problem


def test_previous_allocation_round_trips_and_ignores_finished_jobs() -> None:
    data = copy.deepcopy(EXAMPLE)
    data["previous_allocation"] = [
        {"jobs": ["7"], "fractions": {"v100": 1.0}},
        {"jobs": ["gone"], "fractions": {"v100": 1.0}},
        {"jobs": ["7", "9"], "fractions": {"p100": 0.5}},
    ]
    problem = problem_from_json(data)
    assert problem.previous.job_fractions[0].tolist() == [1.0, 0.0, 0.0]
    assert problem.previous.pair_jobs.tolist() == [[0, 1]]
    assert problem_from_json(json.loads(json.dumps(problem_to_json(problem)))) == problem


@pytest.mark.parametrize("name", ["max_min_fairness_packed", "fifo_packed", "gandiva", "max_min_fairness_perf"])
def test_allocation_json_expands_pairs_and_round_trips(name: str) -> None:
    problem = random_problem(40, 2, gpus_per_type=8)  # crowded: gandiva packs
    allocation = make_policy(name).allocate(problem)
    data = json.loads(json.dumps(allocation_to_json(allocation), allow_nan=False))
    assert data["policy"] == name and data["status"] == "optimal"
    assert {tuple(e["jobs"]) for e in data["allocation"] if len(e["jobs"]) == 1} == {(j,) for j in problem.job_ids}
    back = allocation_from_json(data, problem)
    assert_feasible(problem, back)
    # Fractions below NOISE_FRACTION are written as 0: up to that much per entry may be lost.
    entries = len(data["allocation"])
    assert back.total_time_per_job() == pytest.approx(allocation.total_time_per_job(), abs=entries * NOISE_FRACTION)
    assert back.gpus_used(problem.scale_factors) == pytest.approx(
        allocation.gpus_used(problem.scale_factors), abs=8 * entries * NOISE_FRACTION
    )


def test_an_infeasible_allocation_has_a_null_objective_and_a_reason() -> None:
    data = copy.deepcopy(EXAMPLE)
    data["jobs"][1]["slo_s"] = 61.0  # 1 s left for 5000 steps
    allocation = make_policy("max_sum_throughput_normalized_by_cost_perf_SLOs").allocate(problem_from_json(data))
    out = allocation_to_json(allocation)
    assert out["status"] == "infeasible" and out["objective"] is None and "'9'" in out["reason"]


def test_shipped_prices_parse() -> None:
    prices = prices_from_json(json.loads((DATA / "prices.json").read_text()))
    assert prices == {"v100": 2.48, "p100": 1.46, "k80": 0.45}


def _set(path: str, value: object):
    def mutate(data: dict) -> None:
        target = data
        keys = path.split("/")
        for key in keys[:-1]:
            target = target[int(key)] if isinstance(target, list) else target[key]
        last = keys[-1]
        if value is _DELETE:
            del target[last]
        elif isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
    return mutate


_DELETE = object()

BAD_INPUTS = [
    ("nan throughput", _set("jobs/0/throughputs/v100", math.nan), "jobs[0].throughputs.v100: NaN"),
    ("infinite throughput", _set("jobs/0/throughputs/p100", math.inf), "jobs[0].throughputs.p100: must be finite"),
    ("negative throughput", _set("jobs/1/throughputs/k80", -1.0), "jobs[1].throughputs.k80: must be >= 0"),
    ("string throughput", _set("jobs/1/throughputs/k80", "fast"), "jobs[1].throughputs.k80: expected a number"),
    ("missing type", _set("jobs/0/throughputs/k80", _DELETE), "jobs[0].throughputs: missing worker type 'k80'"),
    ("extra type", _set("jobs/0/throughputs/a100", 9.0), "jobs[0].throughputs.a100: not a worker type"),
    ("all zero", _set("jobs/0/throughputs", {"v100": 0, "p100": 0, "k80": 0}),
     "jobs[0].throughputs: job '7' has zero throughput"),
    ("gang too big", _set("jobs/0/scale_factor", 8), "jobs[0].scale_factor: 8 GPUs is more than any worker type has"),
    ("scale factor text", _set("jobs/0/scale_factor", "4"), "jobs[0].scale_factor: expected an integer"),
    ("scale factor zero", _set("jobs/0/scale_factor", 0), "jobs[0].scale_factor: must be >= 1"),
    ("duplicate id", _set("jobs/1/id", "7"), "jobs[1].id: duplicate job id '7'"),
    ("numeric id", _set("jobs/0/id", 7), "jobs[0].id: expected a string"),
    ("empty id", _set("jobs/0/id", ""), "jobs[0].id: must not be empty"),
    ("missing steps", _set("jobs/0/steps_remaining", _DELETE), "jobs[0].steps_remaining: required"),
    ("bool steps", _set("jobs/0/steps_remaining", True), "jobs[0].steps_remaining: expected a number"),
    ("negative wait", _set("jobs/0/time_since_arrival_s", -5), "jobs[0].time_since_arrival_s: must be >= 0"),
    ("zero weight", _set("jobs/0/priority_weight", 0), "jobs[0].priority_weight: must be >= 0.001, got 0"),
    ("zero slo", _set("jobs/1/slo_s", 0), "jobs[1].slo_s: must be > 0"),
    ("unknown entity", _set("jobs/1/entity", "teamB"), "jobs[1].entity: unknown entity 'teamB'"),
    ("unknown job field", _set("jobs/0/scale_facter", 2), "jobs[0].scale_facter: unknown field"),
    ("unknown top field", _set("workers", {}), "workers: unknown field"),
    ("jobs not a list", _set("jobs", {"7": {}}), "jobs: expected a list"),
    ("job not an object", _set("jobs/0", "7"), "jobs[0]: expected an object"),
    ("worker types missing", _set("worker_types", _DELETE), "worker_types: required"),
    ("negative count", _set("worker_types/k80", -1), "worker_types.k80: must be >= 0"),
    ("fractional count", _set("worker_types/k80", 1.5), "worker_types.k80: expected an integer"),
    ("no gpus", _set("worker_types", {"v100": 0, "p100": 0, "k80": 0}), "worker_types: the cluster has no GPUs"),
    ("pair unknown job", _set("pairs/0/jobs", ["7", "8"]), "pairs[0].jobs: unknown job id '8'"),
    ("pair with itself", _set("pairs/0/jobs", ["7", "7"]), "pairs[0].jobs: a job cannot be packed with itself"),
    ("pair of three", _set("pairs/0/jobs", ["7", "9", "7"]), "pairs[0].jobs: expected exactly two job ids"),
    ("pair bad numbers", _set("pairs/0/throughputs/v100", [2.0]), "pairs[0].throughputs.v100: expected [first job's"),
    ("pair nan", _set("pairs/0/throughputs/v100", [2.0, math.nan]), "pairs[0].throughputs.v100[1]: NaN"),
    ("entity weight", _set("entities/teamA/weight", -2), "entities.teamA.weight: must be > 0"),
    ("entity policy", _set("entities/teamA/policy", "lottery"), "entities.teamA.policy: must be one of fairness, fifo"),
    ("price negative", _set("prices_per_hour/k80", -0.45), "prices_per_hour.k80: must be > 0"),
    ("price missing", _set("prices_per_hour", {"v100": 1.0}), "prices_per_hour: missing worker type 'p100'"),
    ("previous bad type", _set("previous_allocation", [{"jobs": ["7"], "fractions": {"v100": "all"}}]),
     "previous_allocation[0].fractions.v100: expected a number"),
]


@pytest.mark.parametrize("label,mutate,message", BAD_INPUTS, ids=[case[0] for case in BAD_INPUTS])
def test_bad_input_is_one_clear_line_naming_the_field(label: str, mutate, message: str) -> None:
    data = copy.deepcopy(EXAMPLE)
    mutate(data)
    with pytest.raises(ProblemError) as caught:
        problem_from_json(data)
    text = str(caught.value)
    assert text.startswith(message), text
    assert "\n" not in text


def test_pairs_of_different_gang_sizes_are_refused() -> None:
    data = copy.deepcopy(EXAMPLE)
    data["jobs"][0]["scale_factor"] = 2
    with pytest.raises(ProblemError, match=r"^pairs\[0\]\.jobs: jobs '7' and '9' have different scale factors"):
        problem_from_json(data)


def test_unknown_job_type_with_a_table(table) -> None:
    data = {"worker_types": {"v100": 1}, "jobs": [{"id": "1", "job_type": "ResNet-5O", "steps_remaining": 1}]}
    with pytest.raises(ProblemError, match=r"^jobs\[0\]\.job_type: unknown job type 'ResNet-5O'"):
        problem_from_json(data, table)


def test_a_job_type_without_that_scale_factor(table) -> None:
    job = {"id": "1", "job_type": "A3C", "scale_factor": 8, "steps_remaining": 1}
    data = {"worker_types": {"v100": 8}, "jobs": [job]}
    with pytest.raises(ProblemError, match=r"^jobs\[0\]\.scale_factor: the throughput table has no 'A3C' with scale f"):
        problem_from_json(data, table)


def test_a_worker_type_missing_from_the_table(table) -> None:
    data = {"worker_types": {"a100": 1}, "jobs": []}
    with pytest.raises(ProblemError, match=r"^worker_types\.a100: not in the throughput table"):
        problem_from_json(data, table)


def test_throughputs_are_required_without_a_table() -> None:
    data = {"worker_types": {"v100": 1}, "jobs": [{"id": "1", "steps_remaining": 1}]}
    with pytest.raises(ProblemError, match=r"^jobs\[0\]\.throughputs: required"):
        problem_from_json(data)
