"""An answer that holds only so long (AllocationComputed.valid_for_s, Tiresias' threshold
crossings): the mechanism solves again then, though no job arrived or left; a snapshot written
before the field loads without it."""

from __future__ import annotations

import pickle

from mechanism_service.core.memory import Memory, upgraded
from mechanism_service.core.reducers import apply_allocation
from mechanism_service.core.rounds import begin_reset
from tests.unit.mechanism.builders import DEFAULT, state


def test_the_allocation_is_solved_again_once_the_policy_said_it_may_have_changed():
    s = state(k80=1).job("a").reset_at(100.0, 1).build()
    apply_allocation(s, {("j0",): {"k80": 1.0}}, {}, DEFAULT, valid_for_s=250.0)
    assert (s.needs_allocation, s.resolve_at_s) == (False, 350.0)  # the solve at 100 s + 250 s

    assert begin_reset(s, 349.0, DEFAULT) is False  # nothing changed yet
    assert begin_reset(s, 350.0, DEFAULT) is True and s.resolve_at_s is None and s.last_reset_s == 350.0

    apply_allocation(s, {("j0",): {"k80": 1.0}}, {}, DEFAULT)  # an answer with no such limit
    assert s.resolve_at_s is None and begin_reset(s, 1e9, DEFAULT) is False


def test_a_snapshot_without_the_new_fields_loads_with_their_defaults():
    s = state(k80=1).job("a").build()
    memory = pickle.loads(pickle.dumps(Memory(state=s)))
    for name in ("resolve_at_s", "run_started_s"):  # as a snapshot written before them
        delattr(memory.state, name)
    memory = upgraded(memory)
    assert memory.state.resolve_at_s is None and memory.state.run_started_s == {}
