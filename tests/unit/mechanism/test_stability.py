"""Steady allocations (core/stability.py): the policy's answer re-laid over the types so each job
runs on the type the last allocation gave it, every job keeping its throughput."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from common.errors import ConfigError
from mechanism_service.core.reducers import apply_allocation
from mechanism_service.core.settings import MechanismSettings
from mechanism_service.core.stability import steady_allocation
from tests.unit.mechanism.builders import DEFAULT, state

TYPES = ("k80", "p100", "v100")


def test_two_interchangeable_jobs_split_alike_are_each_kept_on_the_type_they_had():
    # Type a: 1 step/s on k80, 4 on v100. The answer splits both jobs alike (the simulator's
    # classes): 0.2 of each type, 1.0 step/s each. Job 0 had v100 last time, job 1 k80.
    s = state(k80=1, v100=1).job("a").job("a").allocate((0,), v100=0.3).allocate((1,), k80=0.9).build()
    answer = {(0,): {"k80": 0.2, "v100": 0.2}, (1,): {"k80": 0.2, "v100": 0.2}}

    steady = steady_allocation(s, answer, 1e-4)

    assert steady[(0,)] == {"v100": pytest.approx(0.25, rel=1e-3)}  # 4 steps/s x 0.25 = 1.0
    assert steady[(1,)] == {"k80": pytest.approx(1.0, rel=1e-3)}  # 1 step/s x 1.0 = 1.0
    assert answer[(0,)] == {"k80": 0.2, "v100": 0.2}  # the answer itself is not changed


def test_an_answer_splitting_more_jobs_than_the_bound_is_installed_as_given():
    # The same two split jobs as above: re-laid under a bound of 2, left alone under a bound of 1
    # (the re-lay's LP is paid inside the boundary; at cluster scale it would dominate it).
    s = state(k80=1, v100=1).job("a").job("a").allocate((0,), v100=0.3).allocate((1,), k80=0.9).build()
    answer = {(0,): {"k80": 0.2, "v100": 0.2}, (1,): {"k80": 0.2, "v100": 0.2}}

    assert steady_allocation(s, answer, 1e-4, max_split_jobs=2) != answer
    assert steady_allocation(s, answer, 1e-4, max_split_jobs=1) == answer
    with pytest.raises(ConfigError, match="steady_max_split_jobs"):
        MechanismSettings(steady_max_split_jobs=-1)


def test_a_job_is_never_given_a_type_the_answer_did_not_give_it():
    # Job 0 had k80 last time, but the answer gives it v100 only now: it stays on v100.
    s = state(k80=1, v100=1).job("a").job("a").allocate((0,), k80=0.5).allocate((1,), k80=0.5).build()
    answer = {(0,): {"v100": 0.2}, (1,): {"k80": 0.2, "v100": 0.2}}

    steady = steady_allocation(s, answer, 1e-4)

    assert set(steady[(0,)]) == {"v100"}
    assert _level(s, steady, (0,)) >= 0.8 * (1 - 1e-4) - 1e-9


def test_packed_pairs_are_kept_and_their_time_is_not_offered_again():
    s = state(k80=1, v100=1).packing().job("a").job("a").job("a").build()
    s.allocation = {(0,): {"k80": 0.5}, (1,): {"v100": 0.5}, (2,): {"v100": 0.5}}
    answer = {(0, 1): {"k80": 0.5, "v100": 0.5}, (0,): {"k80": 0.25, "v100": 0.25}, (2,): {"k80": 0.25, "v100": 0.25}}

    steady = steady_allocation(s, answer, 1e-4)

    assert steady[(0, 1)] == answer[(0, 1)]
    # Job 0 has half its time left after its pair, and each type half its GPU.
    assert sum(steady[(0,)].values()) <= 0.5 + 1e-9
    for w in ("k80", "v100"):
        assert steady[(0,)].get(w, 0.0) + steady[(2,)].get(w, 0.0) <= 0.5 + 1e-9
    for entry in ((0,), (2,)):
        assert _level(s, steady, entry) >= _level(s, answer, entry) * (1 - 1e-4) - 1e-9


@pytest.mark.parametrize("seed", range(20))
def test_every_job_keeps_its_throughput_within_the_budgets_and_more_of_it_on_its_home_type(seed):
    rng = np.random.default_rng(seed)
    counts = {w: int(rng.integers(1, 5)) for w in TYPES}
    builder = state(**counts)
    n = int(rng.integers(2, 12))
    for _ in range(n):
        builder.job(str(rng.choice(["a", "b", "nok80"])), scale_factor=int(rng.choice([1, 1, 2])))
    s = builder.build()
    rates = np.array([[s.entries[(j,)].throughputs[w][0] for w in TYPES] for j in range(n)])
    scale = np.array([s.jobs[j].scale_factor for j in range(n)], dtype=float)
    # A feasible answer: random shares where the job runs, within each job's time and each
    # type's GPUs.
    shares = rng.random((n, 3)) * (rng.random((n, 3)) < 0.7) * (rates > 0)
    shares /= np.maximum(1.0, shares.sum(axis=1, keepdims=True))
    shares *= min(1.0, *(counts[w] / max(1e-9, (scale * shares[:, k]).sum()) for k, w in enumerate(TYPES)))
    answer = {(j,): {w: float(shares[j, k]) for k, w in enumerate(TYPES) if shares[j, k] > 0} for j in range(n)}
    s.allocation = {(j,): {str(rng.choice(TYPES)): 0.5} for j in range(n)}
    tolerance = float(rng.choice([0.0, 1e-4, 1e-2]))

    steady = steady_allocation(s, answer, tolerance)

    x = np.array([[steady[(j,)].get(w, 0.0) for w in TYPES] for j in range(n)])
    assert (x >= 0).all()
    assert (x[shares <= 1e-6] == 0).all()  # only the types the answer gives
    assert (x.sum(axis=1) <= 1 + 1e-7).all()
    assert ((scale[:, None] * x).sum(axis=0) <= np.array([counts[w] for w in TYPES]) + 1e-7).all()
    levels, answer_levels = (rates * x).sum(axis=1), (rates * shares).sum(axis=1)
    assert (levels >= answer_levels * (1 - tolerance) - 1e-7).all()
    assert (levels <= answer_levels + 1e-7).all()  # no job gains at the others' expense
    # More of each job's work on its home type than the answer gave, in sum (the LP's objective).
    home = np.array([TYPES.index(next(iter(s.allocation[(j,)]))) for j in range(n)])
    home = np.where(shares[np.arange(n), home] > 1e-6, home, shares.argmax(axis=1))
    live = answer_levels > 0
    on_home = lambda v: (rates[np.arange(n), home] * v[np.arange(n), home])[live] / answer_levels[live]  # noqa: E731
    assert on_home(x).sum() >= on_home(shares).sum() - 1e-6


def test_installing_an_answer_re_lays_it_only_when_the_setting_asks():
    answer = {("j0",): {"k80": 0.2, "v100": 0.2}, ("j1",): {"k80": 0.2, "v100": 0.2}}
    off = replace(DEFAULT, steady_types_tolerance=None)
    on = replace(DEFAULT, steady_types_tolerance=1e-4)
    s = state(k80=1, v100=1).job("a").job("a").allocate((0,), v100=0.3).allocate((1,), k80=0.9).build()
    apply_allocation(s, answer, {}, off)
    assert s.allocation == {(0,): {"k80": 0.2, "v100": 0.2}, (1,): {"k80": 0.2, "v100": 0.2}}

    s = state(k80=1, v100=1).job("a").job("a").allocate((0,), v100=0.3).allocate((1,), k80=0.9).build()
    apply_allocation(s, answer, {}, on)
    assert set(s.allocation[(0,)]) == {"v100"} and set(s.allocation[(1,)]) == {"k80"}


@pytest.mark.parametrize("tolerance", [-0.1, 1.0])
def test_a_tolerance_outside_0_1_is_refused(tolerance):
    with pytest.raises(ConfigError, match="steady_types_tolerance"):
        MechanismSettings(steady_types_tolerance=tolerance)


def _level(s, allocation, entry) -> float:  # noqa: ANN001
    return sum(s.entries[entry].throughputs[w][0] * v for w, v in allocation[entry].items())
