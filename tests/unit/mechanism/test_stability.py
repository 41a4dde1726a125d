"""Steady allocations (core/stability.py): the policy's answer re-laid over the types so each job
runs on the type the last allocation gave it, every job keeping its throughput."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from common.errors import ConfigError
from mechanism_service.core.model import share_matrix
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


# -- the re-lay's fast forms against the plain one --------------------------------------------


def _reference_steady_allocation(s, answer, tolerance):  # noqa: ANN001, ANN202
    """The re-lay as first written (a loop a job, the LP as a HighsLp built field by field), kept
    to check that the columnar form and the array-passing solve give the same floats."""
    import highspy

    types = list(s.gpus)
    singles = [e for e, v in answer.items() if len(e) == 1 and v]
    if not singles:
        return answer
    rates = np.array([[max(0.0, s.entries[e].throughputs[w][0]) if e in s.entries else 0.0 for w in types] for e in singles])
    # column-major, as the re-lay gathers them: numpy's sums over jobs add in another order otherwise
    shares = np.asfortranarray([[answer[e].get(w, 0.0) for w in types] for e in singles])
    support = (shares > 1e-6) & (rates > 0.0)
    if not (support.sum(axis=1) >= 2).any():
        return answer
    laid = support.any(axis=1)
    scale = np.array([s.jobs[e[0]].scale_factor for e in singles], dtype=float)
    budget = np.ones(len(singles))
    capacity = np.array([float(s.gpus[w]) for w in types])
    index = {e[0]: r for r, e in enumerate(singles)}
    for entry, by_type in answer.items():
        if len(entry) == 2 and by_type:
            paired = np.array([by_type.get(w, 0.0) for w in types])
            capacity -= paired * s.jobs[entry[0]].scale_factor
            for j in entry:
                if j in index:
                    budget[index[j]] -= paired.sum()
    used = scale[:, None] * shares
    budget = np.maximum(budget, shares.sum(axis=1))
    capacity = np.maximum(capacity, used.sum(axis=0)) - used[~laid].sum(axis=0)
    home = shares.argmax(axis=1)
    for r, entry in enumerate(singles):
        before = s.allocation.get(entry, {})
        if before:
            w = max(before, key=before.__getitem__)
            if before[w] > 0.0 and w in types:
                home[r] = types.index(w)
    home = np.where(support[np.arange(len(home)), home], home, shares.argmax(axis=1))
    rates, levels = rates[laid], (rates * shares).sum(axis=1)[laid]
    budget, scale, support, home = budget[laid], scale[laid], support[laid], home[laid]
    n, k = rates.shape
    relative = rates / levels[:, None]
    job_of, type_of = np.divmod(np.arange(n * k), k)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n * k, 2 * n + k
    cost = np.zeros(n * k)
    cost[np.arange(n) * k + home] = -relative[np.arange(n), home]
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = cost, np.zeros(n * k), support.reshape(-1).astype(float)
    lp.row_lower_ = np.concatenate([np.full(n, 1.0 - tolerance), np.full(n + k, -highspy.kHighsInf)])
    lp.row_upper_ = np.concatenate([np.ones(n), budget, capacity])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.arange(0, 3 * n * k + 1, 3, dtype=np.int32)
    lp.a_matrix_.index_ = np.stack([job_of, n + job_of, 2 * n + type_of], axis=1).reshape(-1).astype(np.int32)
    lp.a_matrix_.value_ = np.stack([relative.reshape(-1), np.ones(n * k), np.repeat(scale, k)], axis=1).reshape(-1)
    highs = highspy._Highs()
    highs.setOptionValue("output_flag", False)
    highs.setOptionValue("solver", "simplex")
    highs.passModel(lp)
    highs.run()
    assert highs.getModelStatus() == highspy.HighsModelStatus.kOptimal
    x = np.asarray(highs.getSolution().col_value).reshape(n, k)
    x = np.where(x > 1e-9, x, 0.0)
    out = dict(answer)
    for entry, row in zip([e for e, keep in zip(singles, laid) if keep], x.tolist()):
        out[entry] = {w: v for w, v in zip(types, row) if v > 0.0}
    return out


def _random_case(seed: int):  # noqa: ANN202
    """A random state and a feasible answer: class-like splits (members alike), packed pairs,
    installed allocations with ties, the state's types in another order than its ledgers'."""
    rng = np.random.default_rng(seed)
    counts = {w: int(rng.integers(1, 6)) for w in TYPES}
    builder = state(**counts).packing()
    n = int(rng.integers(3, 16))
    kinds = [str(rng.choice(["a", "b", "nok80"])) for _ in range(n)]
    for kind in kinds:
        builder.job(kind, scale_factor=int(rng.choice([1, 1, 2])))
    s = builder.build()
    rates = np.array([[s.entries[(j,)].throughputs[w][0] for w in TYPES] for j in range(n)])
    scale = np.array([s.jobs[j].scale_factor for j in range(n)], dtype=float)
    base = rng.random((4, 3)) * (rng.random((4, 3)) < 0.8)
    shares = base[rng.integers(0, 4, n)] * (rates > 0)  # few distinct rows, as a class LP's answer
    shares /= np.maximum(1.0, 1.5 * shares.sum(axis=1, keepdims=True))
    shares *= min(1.0, *(0.8 * counts[w] / max(1e-9, (scale * shares[:, k]).sum()) for k, w in enumerate(TYPES)))
    answer = {(j,): {w: float(shares[j, k]) for k, w in enumerate(TYPES) if shares[j, k] > 0} for j in range(n)}
    if rng.random() < 0.5 and n >= 2:  # a packed pair, its time within what the singles leave
        lo, hi = sorted(int(j) for j in rng.choice(n, 2, replace=False))
        room = 1.0 - max(sum(answer[(lo,)].values()), sum(answer[(hi,)].values()))
        answer[(lo, hi)] = {str(rng.choice(TYPES)): float(room * rng.random())}
    s.allocation = {}
    for j in range(n):
        if rng.random() < 0.8:
            tie = rng.random() < 0.3
            picks = rng.choice(TYPES, 2, replace=False)
            s.allocation[(j,)] = {str(picks[0]): 0.5, str(picks[1]): 0.5 if tie else 0.25}
    if rng.random() < 0.5:
        s.gpus = dict(reversed(list(s.gpus.items())))  # the answer's types in another order than the ledgers'
    return s, answer, float(rng.choice([0.0, 1e-4, 1e-2]))


@pytest.mark.parametrize("seed", range(40))
def test_the_re_lay_gives_the_same_floats_as_the_plain_one_when_it_solves_the_lp(seed, monkeypatch):
    import mechanism_service.core.stability as stability

    s, answer, tolerance = _random_case(seed)
    monkeypatch.setattr(stability, "_all_on_home", lambda *problem: None)  # always the LP

    assert steady_allocation(s, answer, tolerance) == _reference_steady_allocation(s, answer, tolerance)


@pytest.mark.parametrize("seed", range(40))
def test_the_re_lay_with_its_shortcut_is_the_lps_answer(seed):
    s, answer, tolerance = _random_case(seed)

    steady, reference = steady_allocation(s, answer, tolerance), _reference_steady_allocation(s, answer, tolerance)

    assert steady.keys() == reference.keys()
    for entry, by_type in reference.items():
        assert steady[entry].keys() == by_type.keys()
        assert steady[entry] == pytest.approx(by_type, rel=1e-8, abs=1e-12)


def test_the_shortcut_is_the_lps_only_optimum_when_every_job_fits_at_home():
    from mechanism_service.core.stability import _all_on_home, _solve

    rng = np.random.default_rng(7)
    taken = refused = 0
    for _ in range(300):
        n, k = int(rng.integers(1, 12)), 3
        support = rng.random((n, k)) < 0.7
        support[np.arange(n), rng.integers(0, k, n)] = True
        # positive where the answer gives a job time (the re-lay's support), 0 or not elsewhere
        rates = rng.choice([1.0, 2.0, 4.0, 10.0, 40.0], (n, k)) * (0.5 + rng.random((n, k))) * (support | (rng.random((n, k)) < 0.5))
        levels = (rates * support * rng.random((n, k)) * 0.5).sum(axis=1) + 0.01
        home = np.array([rng.choice(np.flatnonzero(row)) for row in support])
        scale = rng.choice([1.0, 2.0], n)
        budget = np.full(n, 1.0)
        capacity = rng.integers(1, 6, k).astype(float)
        problem = (rates, levels, budget, scale, capacity, support, home)
        fast = _all_on_home(*problem)
        solved = _solve(*problem, 1e-4)
        if fast is None:
            refused += 1
            if solved is not None:  # refused: some job cannot have its whole level at home
                need = levels / rates[np.arange(n), home]
                on_home = np.bincount(home, weights=scale * need, minlength=k)
                assert (need > budget).any() or (on_home > capacity).any()
            continue
        taken += 1
        assert solved is not None
        assert (fast > 0).tolist() == (solved > 0).tolist()  # the same types: home only
        assert fast == pytest.approx(solved, rel=1e-8, abs=1e-12)
    assert taken > 30 and refused > 30  # both sides of the shortcut were exercised


def test_the_solve_passes_highs_its_own_matrix_format_and_sense():
    import highspy

    import mechanism_service.core.stability as stability

    assert stability._COLWISE == int(highspy.MatrixFormat.kColwise)
    assert stability._MINIMIZE == int(highspy.ObjSense.kMinimize)
    start, index, zeros, continuous = stability._structure(2, 3)
    assert start.tolist() == [0, 3, 6, 9, 12, 15, 18]
    assert index[:6].tolist() == [0, 2, 4, 0, 2, 5]  # job 0 on type 0: level 0, budget 0, capacity 0; on type 1
    assert not (start.flags.writeable or index.flags.writeable or zeros.flags.writeable or continuous.flags.writeable)


@pytest.mark.parametrize("seed", range(30))
def test_home_types_read_from_the_ledgers_are_those_of_the_installed_allocation(seed):
    from mechanism_service.core.model import FrozenAllocation
    from mechanism_service.core.stability import _home_types, _home_types_of

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 15))
    s = state(k80=2, p100=2, v100=2).jobs(n, "a").build()
    installed = {}
    for j in range(n):
        if rng.random() < 0.8:  # some jobs are new: no installed allocation
            picks = [str(w) for w in rng.permutation(TYPES)[: int(rng.integers(1, 4))]]
            values = rng.choice([0.0, 0.25, 0.5], len(picks))  # ties and zeros
            installed[(j,)] = dict(zip(picks, values.tolist()))
    s.allocation = FrozenAllocation(installed)
    s.entries.allocation_matrix(s.allocation)  # the columnar copy, as an install leaves it
    if seed % 2:
        s.gpus = dict(reversed(list(s.gpus.items())))
    types = list(s.gpus)
    singles = [(j,) for j in range(n)]
    rows = np.array([s.entries.row_of[e] for e in singles])
    shares = rng.random((n, 3))

    home = _home_types(s, singles, rows, shares.argmax(axis=1), types, [s.entries.column_of[w] for w in types])

    assert home.tolist() == _home_types_of(s.allocation, singles, range(n), types, shares.argmax(axis=1)).tolist()
    if any(len(set(v.values())) < len(v) and max(v.values()) > 0 for v in installed.values()):
        assert s.entries.allocation_of is s.allocation  # ties were met on the columnar path


@pytest.mark.parametrize("seed", range(20))
def test_an_answer_of_single_jobs_only_is_re_laid_as_the_general_path_does(seed):
    # Every entry one job with some time (an unpacked policy's answer): the rows and shares are
    # read as given, not gathered; an F-ordered copy of the shares takes the gathering path.
    s, answer, tolerance = _random_case(seed)
    answer = {entry: by_type for entry, by_type in answer.items() if len(entry) == 1 and by_type}
    rows = np.array([s.entries.row_of[entry] for entry in answer])
    shares = share_matrix(list(answer.values()), s.entries.types)

    whole = steady_allocation(s, answer, tolerance, columns=(rows, shares), with_shares=True)
    gathered = steady_allocation(s, answer, tolerance, columns=(rows, np.asfortranarray(shares)), with_shares=True)

    assert list(whole[0].items()) == list(gathered[0].items())
    if gathered[1] is None:
        assert whole[1] is None
    else:
        assert whole[1].tobytes() == np.ascontiguousarray(gathered[1]).tobytes()
