"""The re-lay's shares handed to the install (stability.steady_allocation(with_shares=True)) are
the ones gathered again from the re-laid allocation (reducers.allocation_columns), float for
float; and LeaseResult's written-out __init__ is the dataclass's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mechanism_service.core.model import Placement
from mechanism_service.core.reducers import LeaseResult, allocation_columns
from mechanism_service.core.stability import steady_allocation
from tests.unit.mechanism.test_stability import _random_case


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("drop_type", [False, True])
def test_the_re_lays_shares_are_the_re_laid_allocations_columns(seed, drop_type):
    s, answer, tolerance = _random_case(seed)
    if drop_type:  # a ledger type the state no longer offers: named by no re-laid row
        s.gpus = dict(list(s.gpus.items())[1:])
    columns = allocation_columns(s, answer)

    relaid, shares = steady_allocation(s, answer, tolerance, columns=(columns[0], columns[1].copy()), with_shares=True)

    assert relaid == steady_allocation(s, answer, tolerance)
    if shares is None:
        assert relaid is answer
        return
    rows, gathered = allocation_columns(s, relaid)
    assert np.array_equal(rows, columns[0])
    assert shares.shape == gathered.shape
    assert np.array_equal(shares, gathered)
    assert (np.signbit(shares) == np.signbit(gathered)).all()


def test_lease_results_init_is_the_dataclasses():
    @dataclasses.dataclass(frozen=True, slots=True)
    class Generated:
        entry: tuple[int, ...]
        placement: Placement
        steps: tuple[int, ...]
        finish_s: float
        ended: str = ""

    placement = Placement("v100", (3,))
    for args, kwargs in (
        (((1,), placement, (5,), 1.5), {}),
        (((1, 2), placement, (5, 6), 2.5, "lost"), {}),
        (((1,),), {"placement": placement, "steps": (5,), "finish_s": 1.0, "ended": "crashed"}),
    ):
        ours, theirs = LeaseResult(*args, **kwargs), Generated(*args, **kwargs)
        assert dataclasses.astuple(ours) == dataclasses.astuple(theirs)
        assert repr(ours).removeprefix("LeaseResult") == repr(theirs).removeprefix(
            "test_lease_results_init_is_the_dataclasses.<locals>.Generated")
        assert ours == LeaseResult(*args, **kwargs) and hash(ours) == hash(LeaseResult(*args, **kwargs))
    assert [f.name for f in dataclasses.fields(LeaseResult)] == ["entry", "placement", "steps", "finish_s", "ended"]
    result = LeaseResult((1,), placement, (5,), 1.5)
    assert result.ended == ""
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.finish_s = 2.0  # type: ignore[misc]
    assert not hasattr(result, "__dict__")
    with pytest.raises(TypeError):
        LeaseResult((1,), placement, (5,))  # type: ignore[call-arg]
