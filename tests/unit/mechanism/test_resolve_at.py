"""An answer that holds only so long (AllocationComputed.valid_for_s, Tiresias' threshold
crossings): the mechanism solves again then, though no job arrived or left; a snapshot written
before the field loads without it."""

from __future__ import annotations

import pickle

import msgpack

from common.codec import DEFAULT_CODEC
from common.messages import (
    AllocationComputed,
    AllocationRequested,
    PolicyJob,
    PolicyProblem,
    SolveStatus,
)
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


def test_messages_written_before_the_new_fields_decode_with_their_defaults():
    job = PolicyJob("j0", "a", 1, 1.0, 10, 5.0, attained_service_gpu_s=7.0, time_since_last_run_s=2.0, last_run_s=3.0)
    request = AllocationRequested("r", "tiresias_perf", PolicyProblem({"k80": 1}, (job,)), deadline_s=1.0)
    reply = AllocationComputed("r", "tiresias_perf", SolveStatus.OPTIMAL, None, 0.0, (), valid_for_s=60.0)
    for message in (request, reply):
        assert DEFAULT_CODEC.decode(DEFAULT_CODEC.encode(message, source="t", sent_at_s=0.0)).message == message
    # as an older sender wrote them: without the fields
    wire = msgpack.unpackb(DEFAULT_CODEC.encode(request, source="t", sent_at_s=0.0))
    for name in ("attained_service_gpu_s", "time_since_last_run_s", "last_run_s"):
        del wire["body"]["problem"]["jobs"][0][name]
    old_job = DEFAULT_CODEC.decode(msgpack.packb(wire)).message.problem.jobs[0]
    assert (old_job.attained_service_gpu_s, old_job.time_since_last_run_s, old_job.last_run_s) == (0.0, 0.0, 0.0)
    wire = msgpack.unpackb(DEFAULT_CODEC.encode(reply, source="t", sent_at_s=0.0))
    del wire["body"]["valid_for_s"]
    assert DEFAULT_CODEC.decode(msgpack.packb(wire)).message.valid_for_s is None
