"""compiled.py writes the max-min LP's constraint matrix straight in CSC form; these are the
arrays scipy builds from the program's (row, column, value) triplets, so CLARABEL gets the same
input, entry for entry, and answers the same."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import scipy.sparse as sp

from policy_service.core import compiled
from policy_service.core.compiled import _constraint_matrix, solve_max_min


def triplet_matrix(tt: np.ndarray, gpus_per_class: np.ndarray) -> sp.csc_matrix:
    """The definition: every block of the program as triplets, converted by scipy."""
    num_classes, num_types = tt.shape
    n_x = num_classes * num_types
    cell = np.arange(n_x)
    row_of_cell = np.repeat(np.arange(num_classes), num_types)
    type_of_cell = np.tile(np.arange(num_types), num_classes)
    capacity, budget = num_classes, num_classes + num_types
    upper = budget + num_classes
    lower = upper + n_x
    rows = np.concatenate(
        [row_of_cell, np.arange(num_classes), capacity + type_of_cell, budget + row_of_cell, upper + cell, lower + cell]
    )
    cols = np.concatenate([cell, np.full(num_classes, n_x), cell, cell, cell, cell])
    values = np.concatenate(
        [-tt.reshape(-1), np.ones(num_classes), np.repeat(gpus_per_class, num_types), np.ones(n_x), np.ones(n_x), -np.ones(n_x)]
    )
    return sp.csc_matrix((values, (rows, cols)), shape=(lower + n_x, n_x + 1))


@pytest.mark.parametrize("shape", [(1, 1), (1, 3), (4, 3), (17, 2), (30, 5)])
def test_the_direct_csc_arrays_are_scipys_from_the_triplets(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(sum(shape))
    tt = rng.uniform(0.0, 3.0, shape)
    tt[rng.random(shape) < 0.3] = 0.0  # zeros stay explicit entries in both
    gpus = rng.integers(1, 9, shape[0]).astype(float)
    direct, num_rows = _constraint_matrix(tt, gpus)
    expected = triplet_matrix(tt, gpus)
    assert direct.shape == expected.shape and num_rows == expected.shape[0]
    assert np.array_equal(direct.indptr, expected.indptr)
    assert np.array_equal(direct.indices, expected.indices)
    assert np.array_equal(direct.data, expected.data)
    assert np.array_equal(np.signbit(direct.data), np.signbit(expected.data))  # -0.0 where TT is 0


def test_the_program_is_the_max_min_lp() -> None:
    # Two classes, two types: class 0 runs only on type 0, class 1 twice as fast on type 1.
    tt = np.array([[1.0, 0.0], [1.0, 2.0]])
    x, level, status = solve_max_min(tt, np.array([1.0, 1.0]), np.array([1.0, 1.0]), tt > 0)
    assert status == "optimal"
    assert level == pytest.approx(1.0, abs=1e-6)  # class 0 alone on type 0, class 1 half of type 1
    assert x[0, 0] == pytest.approx(1.0, abs=1e-6) and x[1, 1] >= 0.5 - 1e-6


def test_a_program_solved_again_is_answered_from_the_last_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """compiled._SOLVED: the same arrays to the bit get the kept answer (CLARABEL would give the
    same floats), other arrays a solve of their own."""
    solves = []
    solve = compiled._solve_max_min
    monkeypatch.setattr(compiled, "_SOLVED", {})
    monkeypatch.setattr(compiled, "_solve_max_min", lambda *args: solves.append(1) or solve(*args))
    tt = np.array([[2.0, 1.0], [1.0, 3.0]])
    program = (tt, np.array([1.0, 2.0]), np.array([2.0, 2.0]), np.ones((2, 2), dtype=bool))
    first = compiled.solve_max_min(*program)
    again = compiled.solve_max_min(*(np.array(a) for a in program))  # equal copies
    assert len(solves) == 1 and again[0] is first[0] and again[1:] == first[1:]
    assert not first[0].flags.writeable
    fresh = solve(*program)
    assert fresh[0].tobytes() == first[0].tobytes() and fresh[1] == first[1]
    compiled.solve_max_min(tt * 1.5, *program[1:])
    assert len(solves) == 2


def test_the_kept_programs_stay_bounded_under_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Answers may run in threads (answer.py): the kept programs are at most _KEPT_SOLUTIONS,
    and no thread sees the dict change under it."""
    monkeypatch.setattr(compiled, "_SOLVED", {})
    errors: list[BaseException] = []

    def solve_many(offset: int) -> None:
        try:
            for i in range(60):
                tt = np.array([[1.0 + offset + i, 1.0], [1.0, 2.0]])
                compiled.solve_max_min(tt, np.array([1.0, 1.0]), np.array([2.0, 2.0]), np.ones((2, 2), dtype=bool))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=solve_many, args=(100 * t,)) for t in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(compiled._SOLVED) == compiled._KEPT_SOLUTIONS
