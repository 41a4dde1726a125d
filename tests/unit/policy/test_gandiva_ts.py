"""Gandiva's time-slicing with introspective packing (gandiva_ts), checked by hand on two v100s
and five single-GPU jobs that run 1 step/s alone."""

from __future__ import annotations

import pytest

from common.errors import PolicyParameterError
from policy_service.core import (
    AllocationEntry,
    JobSpec,
    PairSpec,
    build_problem,
    make_policy,
)
from policy_service.core.gandiva_ts import pair_gains
from tests.unit.policy.builders import assert_feasible

# Packed steps/s of each listed pair (each alone: 1 step/s), so its gain (packed over alone,
# summed over the two): A-C 1.6, A-B 1.5, B-D 1.2, C-D 0.9 (worse than taking turns). E packs
# with nobody.
PAIRS = [
    PairSpec(("A", "C"), {"v100": (0.8, 0.8)}),
    PairSpec(("A", "B"), {"v100": (0.8, 0.7)}),
    PairSpec(("B", "D"), {"v100": (0.6, 0.6)}),
    PairSpec(("C", "D"), {"v100": (0.45, 0.45)}),
]


def _problem(names="ABCDE", gpus=2, previous=None):
    jobs = [JobSpec(id=name, steps_remaining=100, throughputs_steps_per_s={"v100": 1.0}) for name in names]
    pairs = [p for p in PAIRS if set(p.job_ids) <= set(names)]
    return build_problem({"v100": gpus}, jobs, pairs=pairs, previous=previous)


def _time(allocation, problem):
    """job id -> its time (alone or packed); pair (a, b) -> its time."""
    alone = dict(zip(problem.job_ids, allocation.job_fractions[:, 0].tolist()))
    pairs = {
        (problem.job_ids[a], problem.job_ids[b]): float(t)
        for (a, b), t in zip(allocation.pairs.group_pairs.tolist(), allocation.pairs.pair_time[:, 0])
    }
    return alone, pairs


def test_pair_gains_by_hand() -> None:
    candidates, gain, _ = pair_gains(_problem())
    got = {(int(a), int(b)): round(float(g), 6) for (a, b), g in zip(candidates, gain)}
    assert got == {(0, 1): 1.5, (0, 2): 1.6, (1, 3): 1.2, (2, 3): 0.9}


def test_oversubscribed_the_best_paying_pairs_pack_and_the_rest_take_turns() -> None:
    # Five jobs on two GPUs: 3 too many. A-C (1.6) packs: 2 too many; A-B is out (A is packed);
    # B-D (1.2) packs: 1 too many; C-D would not pay. Three occupants (A+C, B+D, E) take turns
    # on two GPUs: 2/3 of the time each.
    problem = _problem()
    allocation = make_policy("gandiva_ts").allocate(problem)
    alone, pairs = _time(allocation, problem)
    assert alone == pytest.approx({"A": 0, "B": 0, "C": 0, "D": 0, "E": 2 / 3})
    assert pairs == pytest.approx({("A", "C"): 2 / 3, ("B", "D"): 2 / 3})
    assert_feasible(problem, allocation)


def test_a_measured_pair_that_still_pays_is_kept_one_that_does_not_is_unpacked() -> None:
    # A-B ran packed and still pays (1.5): kept before the better A-C. Then B-D and A-C are out
    # (B, A packed) and C-D does not pay: A+B, C, D, E take turns, 1/2 of the time each.
    kept = _problem(previous=[AllocationEntry(("A", "B"), {"v100": 0.5})])
    alone, pairs = _time(make_policy("gandiva_ts").allocate(kept), kept)
    assert alone == pytest.approx({"A": 0, "B": 0, "C": 0.5, "D": 0.5, "E": 0.5})
    assert pairs == pytest.approx({("A", "B"): 0.5})
    # C-D ran packed but slows them (0.9): unpacked, the best pairs as above.
    unpacked = _problem(previous=[AllocationEntry(("C", "D"), {"v100": 0.5})])
    _, pairs = _time(make_policy("gandiva_ts").allocate(unpacked), unpacked)
    assert pairs == pytest.approx({("A", "C"): 2 / 3, ("B", "D"): 2 / 3})


def test_no_more_pairs_than_the_oversubscription_needs() -> None:
    # Four jobs on three GPUs: one too many; A-C alone ends it. B and D run alone, all the time.
    problem = _problem("ABCD", gpus=3)
    alone, pairs = _time(make_policy("gandiva_ts").allocate(problem), problem)
    assert alone == pytest.approx({"A": 0, "B": 1, "C": 0, "D": 1})
    assert pairs == pytest.approx({("A", "C"): 1.0})
    # Not oversubscribed: no packing, every job all its time.
    problem = _problem("AB", gpus=2)
    alone, pairs = _time(make_policy("gandiva_ts").allocate(problem), problem)
    assert alone == {"A": 1.0, "B": 1.0} and pairs == {}


def test_the_threshold_is_checked() -> None:
    with pytest.raises(PolicyParameterError, match="pack_above"):
        make_policy("gandiva_ts", pack_above=-1.0)
