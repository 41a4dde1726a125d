"""Packing from class colocations (an estimator's model): each job brings its own isolated row
and a colocation class; per pair of classes and worker type, the fraction of its steps/s alone
that each member keeps. Built from Gavel's table (fractions = pair / isolated), it must solve
exactly as the table path does; with rows that differ job by job, exactly as the same pairs
listed job by job."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from common.errors import ProblemError
from common.throughputs import ThroughputTable, format_job_key
from policy_service.core import (
    ClassPairSpec,
    JobSpec,
    PairSpec,
    Problem,
    build_problem,
    make_policy,
    problem_from_json,
    problem_to_json,
)
from policy_service.core.colocation import MAX_COLOCATION_FRACTION
from policy_service.core.evaluate import job_throughputs
from policy_service.core.formulation import SolveOptions, build_space
from policy_service.service import shipped_context
from tests.unit.policy.builders import TYPES, assert_feasible

COUNTS = dict.fromkeys(TYPES, 2)
JOB_TYPES = ("ResNet-50 (batch size 64)", "LM (batch size 20)", "Transformer (batch size 128)", "CycleGAN")
PACKED_POLICIES = ("max_min_fairness_packed", "finish_time_fairness_packed", "min_total_duration_packed")


@pytest.fixture(scope="module")
def shipped() -> ThroughputTable:
    return shipped_context().table


def _jobs(table: ThroughputTable, *, row_factors: np.ndarray | None = None, explicit: bool = True) -> list[JobSpec]:
    """12 jobs, 3 of each of 4 job types, with their table rows (times ``row_factors``, (12, K))
    and their class when ``explicit``; otherwise job types only, for the table path."""
    jobs = []
    for i in range(12):
        job_type = JOB_TYPES[i % 4]
        row = np.array([table.isolated(job_type, 1, k) for k in TYPES])
        if row_factors is not None:
            row = row * row_factors[i]
        jobs.append(
            JobSpec(
                id=f"j{i}",
                job_type=job_type,
                steps_remaining=float(1000 * (i + 1)),
                time_since_arrival_s=float(100 * (i % 5)),
                throughputs_steps_per_s=dict(zip(TYPES, row.tolist(), strict=True)) if explicit else None,
                colocation_class=format_job_key(job_type, 1) if explicit else "",
            )
        )
    return jobs


def _table_colocations(table: ThroughputTable, seed: int = 0) -> list[ClassPairSpec]:
    """Every pair of the 4 classes (self pairs too) the table lists, as fractions pair / alone,
    in a shuffled order and orientation (the reading must not depend on either)."""
    rng = np.random.default_rng(seed)
    result = []
    for a in range(4):
        for b in range(a, 4):
            first, second = (JOB_TYPES[a], JOB_TYPES[b]) if rng.random() < 0.5 else (JOB_TYPES[b], JOB_TYPES[a])
            fractions = {}
            for k in TYPES:
                packed = table.pair(first, second, 1, k)
                if packed is None:
                    continue
                alone = (table.isolated(first, 1, k), table.isolated(second, 1, k))
                assert all(p == 0 or s > 0 for p, s in zip(packed, alone, strict=True))  # representable
                fractions[k] = tuple(p / s if s > 0 else 0.0 for p, s in zip(packed, alone, strict=True))
            if fractions:
                result.append(ClassPairSpec((format_job_key(first, 1), format_job_key(second, 1)), fractions))
    order = rng.permutation(len(result))
    return [result[i] for i in order]


def _from_classes(table: ThroughputTable, row_factors: np.ndarray | None = None) -> Problem:
    return build_problem(
        COUNTS, _jobs(table, row_factors=row_factors), colocations=_table_colocations(table), table=table
    )


def _relative_gap(a: float, b: float) -> float:
    return abs(a - b) / max(1.0, abs(a), abs(b))


def _assert_same_solution(problem_a: Problem, problem_b: Problem, policy: str, **params: object) -> None:
    a = make_policy(policy, **params).allocate(problem_a)
    b = make_policy(policy, **params).allocate(problem_b)
    assert a.status == "optimal" and b.status == "optimal", (a.reason, b.reason)
    assert _relative_gap(a.objective, b.objective) < 1e-6, (a.objective, b.objective)
    np.testing.assert_allclose(job_throughputs(problem_a, a), job_throughputs(problem_b, b), rtol=1e-6, atol=1e-9)
    assert_feasible(problem_a, a)
    assert_feasible(problem_b, b)


# ----------------------------------------------------------------------------- (a) the table


def test_fractions_from_the_table_rebuild_the_table_colocation(shipped) -> None:
    by_table = build_problem(COUNTS, _jobs(shipped, explicit=False), table=shipped)
    by_classes = _from_classes(shipped)
    assert by_table.colocation_source == "table" and by_classes.colocation_source == "classes"
    np.testing.assert_array_equal(by_classes.throughputs_steps_per_s, by_table.throughputs_steps_per_s)
    np.testing.assert_array_equal(by_classes.colocation.key_of_job, by_table.colocation.key_of_job)
    np.testing.assert_array_equal(by_classes.colocation.key_pairs, by_table.colocation.key_pairs)
    np.testing.assert_allclose(
        by_classes.colocation.throughputs_steps_per_s, by_table.colocation.throughputs_steps_per_s, rtol=1e-12
    )


@pytest.mark.parametrize("policy", PACKED_POLICIES)
def test_packed_policies_solve_as_from_the_table(shipped, policy) -> None:
    by_table = build_problem(COUNTS, _jobs(shipped, explicit=False), table=shipped)
    _assert_same_solution(_from_classes(shipped), by_table, policy)


# ------------------------------------------------------------------- (b) keys, rows, job pairs


def test_jobs_with_equal_rows_share_a_key_and_a_class(shipped) -> None:
    problem = _from_classes(shipped)
    keys = problem.colocation.key_of_job
    assert keys.tolist() == [0, 1, 2, 3] * 3  # one key per class, numbered by first job
    space = build_space(problem, packing=True, options=SolveOptions(), columns=[problem.priority_weights])
    assert space.classes.num_classes == 4


def _job_by_job_pairs(problem: Problem) -> list[PairSpec]:
    """The same packing written out pair by pair: T_i * f_i, T_j * f_j (self pairs symmetrised)."""
    fractions = {}
    for entry in problem.class_colocations:
        a, b = entry.classes
        values = {k: np.asarray(v, float) for k, v in entry.fractions.items()}
        if a == b:
            values = {k: np.full(2, v.mean()) for k, v in values.items()}
        fractions[(a, b)] = values
        fractions[(b, a)] = {k: v[::-1] for k, v in values.items()}
    pairs = []
    rows = problem.throughputs_steps_per_s
    for i in range(problem.num_jobs):
        for j in range(i + 1, problem.num_jobs):
            found = fractions.get((problem.colocation_classes[i], problem.colocation_classes[j]))
            if found is None or problem.scale_factors[i] != problem.scale_factors[j]:
                continue
            per_type = {
                k: (rows[i, TYPES.index(k)] * f[0], rows[j, TYPES.index(k)] * f[1]) for k, f in found.items()
            }
            pairs.append(PairSpec((problem.job_ids[i], problem.job_ids[j]), per_type))
    return pairs


@pytest.mark.parametrize("policy", PACKED_POLICIES)
def test_rows_that_differ_get_keys_of_their_own_and_solve_as_job_pairs(shipped, policy) -> None:
    factors = np.random.default_rng(7).uniform(0.9, 1.1, size=(12, len(TYPES)))
    by_classes = _from_classes(shipped, row_factors=factors)
    assert by_classes.colocation.key_of_job.tolist() == list(range(12))
    by_pairs = build_problem(COUNTS, _jobs(shipped, row_factors=factors), pairs=_job_by_job_pairs(by_classes))
    np.testing.assert_array_equal(by_classes.colocation.key_pairs, by_pairs.colocation.key_pairs)
    np.testing.assert_allclose(
        by_classes.colocation.throughputs_steps_per_s, by_pairs.colocation.throughputs_steps_per_s, rtol=1e-12
    )
    # One program for both, so the same (possibly non-unique) optimum is compared job by job;
    # the faster forms reach the same objective (test_pair_columns.py).
    _assert_same_solution(by_classes, by_pairs, policy, pair_variables="class_pairs")


def test_two_rows_per_class_give_two_keys_that_still_pack_together(shipped) -> None:
    # Jobs 0..5 as measured, 6..11 at 0.95: two keys per class, and key pairs across the two.
    factors = np.where(np.arange(12) < 6, 1.0, 0.95)[:, None] * np.ones((12, len(TYPES)))
    problem = _from_classes(shipped, row_factors=factors)
    keys = problem.colocation.key_of_job
    assert len(np.unique(keys)) == 8
    # j0 and j8 are both ResNet-50 jobs, of different rows: they pack as a (c, c) self pair.
    index, packed = problem.colocation.job_pair_throughputs(np.array([0]), np.array([8]))
    assert index[0] >= 0
    resnet = format_job_key(JOB_TYPES[0], 1)
    (entry,) = [e for e in problem.class_colocations if e.classes == (resnet, resnet)]
    mean = np.array([np.mean(entry.fractions[k]) if k in entry.fractions else 0.0 for k in TYPES])
    np.testing.assert_allclose(packed[0, :, 0], problem.throughputs_steps_per_s[0] * mean)
    np.testing.assert_allclose(packed[0, :, 1], problem.throughputs_steps_per_s[8] * mean)
    by_pairs = build_problem(COUNTS, _jobs(shipped, row_factors=factors), pairs=_job_by_job_pairs(problem))
    _assert_same_solution(problem, by_pairs, "max_min_fairness_packed")


def test_who_packs_with_whom() -> None:
    def job(i: int, cls: str, sf: int = 1) -> JobSpec:
        return JobSpec(id=str(i), steps_remaining=10.0, scale_factor=sf, colocation_class=cls,
                       throughputs_steps_per_s={"v100": 2.0 + i, "k80": 1.0})

    jobs = [job(0, "a"), job(1, "b"), job(2, "a", sf=2), job(3, "b", sf=2), job(4, ""), job(5, "c"), job(6, "a")]
    colocations = [ClassPairSpec(("b", "a"), {"v100": (0.5, 0.25)}), ClassPairSpec(("c", "c"), {"v100": (0.6, 0.8)})]
    problem = build_problem({"v100": 4, "k80": 4}, jobs, colocations=colocations)
    c = problem.colocation
    assert c.key_of_job[4] == -1  # no class: never packed
    # Listed and one gang size: (0, 1), (2, 3), (1, 6); a lone job of "c" has nobody to pack with.
    a, b = np.triu_indices(7, 1)
    allowed = {(int(i), int(j)) for i, j, p in zip(a, b, c.find(c.key_of_job[a], c.key_of_job[b])) if p >= 0}
    assert allowed == {(0, 1), (2, 3), (1, 6)}
    _, packed = c.job_pair_throughputs(np.array([0, 1]), np.array([1, 0]))
    np.testing.assert_allclose(packed[0], [[2.0 * 0.25, 3.0 * 0.5], [0.0, 0.0]])  # k80 not listed: 0
    np.testing.assert_allclose(packed[1], [[3.0 * 0.5, 2.0 * 0.25], [0.0, 0.0]])
    assert problem.colocation_source == "classes"


def test_explicit_pairs_take_precedence_and_an_empty_list_packs_nothing(shipped) -> None:
    jobs = _jobs(shipped)
    colocations = _table_colocations(shipped)
    with_pairs = build_problem(COUNTS, jobs, pairs=[], colocations=colocations)
    assert with_pairs.colocation_source == "pairs" and with_pairs.colocation.num_pairs == 0
    nothing = build_problem(COUNTS, jobs, colocations=[], table=shipped)
    assert nothing.colocation_source == "classes" and nothing.colocation.num_pairs == 0
    assert (nothing.colocation.key_of_job == -1).all()


# ------------------------------------------------------------- (c) a job type the table lacks


def test_a_job_type_unknown_to_the_table_is_accepted_with_its_own_throughputs(shipped) -> None:
    own = JobSpec(id="mine", job_type="my_script.py", scale_factor=1, steps_remaining=500.0,
                  throughputs_steps_per_s={"v100": 3.0, "p100": 2.0, "k80": 1.0}, colocation_class="mine")
    odd_gang = JobSpec(id="odd", job_type="A3C", scale_factor=2, steps_remaining=500.0,
                       throughputs_steps_per_s={"v100": 3.0, "p100": 2.0, "k80": 1.0})  # A3C has no 2-GPU row
    resnet = format_job_key(JOB_TYPES[0], 1)
    colocations = [*_table_colocations(shipped), ClassPairSpec(("mine", resnet), {"v100": (0.7, 0.6)})]
    problem = build_problem(COUNTS, [*_jobs(shipped), own, odd_gang], colocations=colocations, table=shipped)
    assert problem.throughputs_steps_per_s[12].tolist() == [3.0, 2.0, 1.0]
    index, packed = problem.colocation.job_pair_throughputs(np.array([12]), np.array([0]))
    assert index[0] >= 0
    np.testing.assert_allclose(packed[0, 0], [3.0 * 0.7, problem.throughputs_steps_per_s[0, 0] * 0.6])
    allocation = make_policy("max_min_fairness_packed").allocate(problem)
    assert allocation.status == "optimal"
    assert_feasible(problem, allocation)
    # The table path too: the job is simply not in the table's pairs.
    by_table = build_problem(COUNTS, [*_jobs(shipped, explicit=False), own], table=shipped)
    assert by_table.colocation_source == "table"


def test_without_its_own_throughputs_an_unknown_job_type_is_still_refused(shipped) -> None:
    job = JobSpec(id="x", job_type="my_script.py", steps_remaining=1.0)
    with pytest.raises(ProblemError, match=r"^jobs\[0\]\.job_type: unknown job type 'my_script.py'"):
        build_problem(COUNTS, [job], table=shipped)


# ------------------------------------------------------------------------- (d) validation


def _pair(classes: object, fractions: object) -> ClassPairSpec:
    return ClassPairSpec(classes, fractions)  # type: ignore[arg-type]


GOOD = _pair(("a", "b"), {"v100": (0.5, 0.5)})


@pytest.mark.parametrize(
    ("colocations", "message"),
    [
        ([_pair(("a", "b", "c"), {})], r"^colocations\[0\]\.classes: expected exactly two class names, got 3"),
        ([_pair(("a",), {})], r"^colocations\[0\]\.classes: expected exactly two class names, got 1"),
        ([GOOD, _pair(("a", ""), {})], r"^colocations\[1\]\.classes\[1\]: expected a non-empty class name"),
        ([_pair(("a", 7), {})], r"^colocations\[0\]\.classes\[1\]: expected a non-empty class name, got 7"),
        ([GOOD, _pair(("b", "a"), {})],
         r"^colocations\[1\]\.classes: duplicate class pair 'b', 'a' \(also colocations\[0\]\)"),
        ([_pair(("a", "a"), {}), _pair(("a", "a"), {})], r"^colocations\[1\]\.classes: duplicate class pair 'a', 'a'"),
        ([_pair(("a", "b"), {"a100": (0.5, 0.5)})], r"^colocations\[0\]\.fractions\.a100: not a worker type"),
        ([_pair(("a", "b"), {"v100": (0.5,)})], r"^colocations\[0\]\.fractions\.v100: expected \[first class's"),
        ([_pair(("a", "b"), {"v100": (float("nan"), 0.5)})], r"^colocations\[0\]\.fractions\.v100\[0\]: NaN"),
        ([_pair(("a", "b"), {"v100": (0.5, float("inf"))})],
         r"^colocations\[0\]\.fractions\.v100\[1\]: must be finite"),
        ([_pair(("a", "b"), {"v100": (-0.1, 0.5)})], r"^colocations\[0\]\.fractions\.v100\[0\]: must be >= 0"),
        ([_pair(("a", "b"), {"v100": (0.5, 3.1)})], r"^colocations\[0\]\.fractions\.v100\[1\]: must be <= 1"),
        ([_pair(("a", "b"), [0.5, 0.5])], r"^colocations\[0\]\.fractions: expected an object"),
    ],
)
def test_each_bad_colocation_names_its_path(colocations, message) -> None:
    jobs = [JobSpec(id="0", steps_remaining=1.0, throughputs_steps_per_s={"v100": 1.0, "k80": 1.0})]
    with pytest.raises(ProblemError, match=message):
        build_problem({"v100": 1, "k80": 1}, jobs, colocations=colocations)


def test_fractions_just_over_one_are_rounding_and_kept() -> None:
    jobs = [JobSpec(id=str(i), steps_remaining=1.0, colocation_class="a", throughputs_steps_per_s={"v100": 2.0})
            for i in range(2)]
    just_over = 1.0 + (MAX_COLOCATION_FRACTION - 1.0) / 2  # halfway to the limit
    problem = build_problem({"v100": 1}, jobs, colocations=[_pair(("a", "a"), {"v100": (just_over, 0.5)})])
    assert problem.class_colocations[0].fractions["v100"] == (just_over, 0.5)
    assert problem.colocation.throughputs_steps_per_s[0, 0].tolist() == [2.0 * (just_over + 0.5) / 2] * 2


def test_a_classed_job_without_throughputs_is_refused_when_colocations_are_given(shipped) -> None:
    jobs = [*_jobs(shipped)[:2], JobSpec(id="t", job_type=JOB_TYPES[0], steps_remaining=1.0, colocation_class="x")]
    with pytest.raises(ProblemError, match=r"^jobs\[2\]\.throughputs: required for a job with a colocation class") as e:
        build_problem(COUNTS, jobs, colocations=[GOOD], table=shipped)
    assert e.value.job_ids == ("t",)  # one job's fault: the caller can set it aside
    # Without colocations the class is inert and the table fills the row.
    assert build_problem(COUNTS, jobs, table=shipped).colocation_source == "table"


def test_a_class_that_is_not_a_string_is_refused() -> None:
    job = JobSpec(id="0", steps_remaining=1.0, throughputs_steps_per_s={"v100": 1.0})
    job = replace(job, colocation_class=None)  # type: ignore[arg-type]
    with pytest.raises(ProblemError, match=r"^jobs\[0\]\.colocation_class: expected a string"):
        build_problem({"v100": 1}, [job], colocations=[])


# ---------------------------------------------------------------------------- (e) JSON


def test_the_json_form_round_trips(shipped) -> None:
    factors = np.random.default_rng(3).uniform(0.9, 1.1, size=(12, len(TYPES)))
    problem = _from_classes(shipped, row_factors=factors)
    data = json.loads(json.dumps(problem_to_json(problem)))
    assert data["jobs"][0]["colocation_class"] == format_job_key(JOB_TYPES[0], 1)
    assert {tuple(entry["classes"]) for entry in data["colocations"]} == {
        e.classes for e in problem.class_colocations
    }
    assert problem_from_json(data) == problem
    assert problem_from_json(data, shipped) == problem


def test_the_documented_json_example_parses() -> None:
    data = {
        "worker_types": {"v100": 2, "k80": 2},
        "jobs": [
            {"id": "7", "job_type": "my_script.py", "throughputs": {"v100": 4.0, "k80": 1.0},
             "steps_remaining": 100, "colocation_class": "mine"},
            {"id": "9", "job_type": "LM (batch size 20)", "throughputs": {"v100": 7.5, "k80": 2.1},
             "steps_remaining": 100, "colocation_class": "('LM (batch size 20)', 1)"},
        ],
        "colocations": [{"classes": ["mine", "('LM (batch size 20)', 1)"], "fractions": {"v100": [0.6, 0.7]}}],
    }
    problem = problem_from_json(data)
    assert problem.colocation_source == "classes"
    _, packed = problem.colocation.job_pair_throughputs(np.array([0]), np.array([1]))
    np.testing.assert_allclose(packed[0], [[4.0 * 0.6, 7.5 * 0.7], [0.0, 0.0]])
    assert problem_from_json(json.loads(json.dumps(problem_to_json(problem)))) == problem
    # A problem without classes writes neither field (the format stays as it was).
    plain = replace(problem, colocation_classes=(), class_colocations=None)
    assert "colocations" not in problem_to_json(plain) and "colocation_class" not in problem_to_json(plain)["jobs"][0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"colocations": [{"classes": ["a"], "fractions": {}}]}, r"^colocations\[0\]\.classes: expected exactly two"),
        ({"colocations": [{"classes": ["a", "b"], "fractions": {"v100": [0.5]}}]},
         r"^colocations\[0\]\.fractions\.v100: expected \[first class's"),
        ({"colocations": [{"classes": ["a", "b"], "fractions": {"v100": ["x", 0.5]}}]},
         r"^colocations\[0\]\.fractions\.v100\[0\]: expected a number"),
        ({"colocations": [{"classes": ["a", "b"], "fraction": {}}]}, r"^colocations\[0\]\.fraction: unknown field"),
        ({"colocations": {"classes": ["a", "b"]}}, r"^colocations: expected a list"),
    ],
)
def test_bad_json_names_its_path(change, message) -> None:
    data = {"worker_types": {"v100": 1}, "jobs": [{"id": "0", "throughputs": {"v100": 1.0}, "steps_remaining": 1}]}
    with pytest.raises(ProblemError, match=message):
        problem_from_json({**data, **change})


def test_a_job_class_in_json_must_be_a_string() -> None:
    data = {"worker_types": {"v100": 1},
            "jobs": [{"id": "0", "throughputs": {"v100": 1.0}, "steps_remaining": 1, "colocation_class": 3}]}
    with pytest.raises(ProblemError, match=r"^jobs\[0\]\.colocation_class: expected a string"):
        problem_from_json(data)


# ------------------------------------------------------------------------------ the wire


def test_the_wire_problem_passes_classes_and_colocations_through(shipped) -> None:
    from common.messages import ClassColocation, PolicyJob, PolicyProblem
    from policy_service.answer import SolveContext, problem_from_message

    core = _from_classes(shipped)
    jobs = tuple(
        PolicyJob(job.id, job.job_type, 1, 1.0, int(job.steps_remaining), job.time_since_arrival_s,
                  throughputs_steps_per_s=job.throughputs_steps_per_s, colocation_class=job.colocation_class)
        for job in _jobs(shipped)
    )
    wire = PolicyProblem(
        COUNTS, jobs,
        colocations=tuple(ClassColocation(e.classes, e.fractions) for e in _table_colocations(shipped)),
    )
    problem = problem_from_message(wire, SolveContext(table=shipped))
    assert problem.colocation_source == "classes"
    assert problem.colocation_classes == core.colocation_classes
    np.testing.assert_array_equal(problem.colocation.key_pairs, core.colocation.key_pairs)
    np.testing.assert_array_equal(problem.colocation.throughputs_steps_per_s, core.colocation.throughputs_steps_per_s)
