"""The codec: every message round-trips; every malformed body is one DecodeError with a reason."""

from __future__ import annotations

import math

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.codec import DEFAULT_CODEC, Codec, CodecLimits
from common.errors import DecodeError, EncodeError
from common.messages import (
    AllocationComputed,
    AllocationEntry,
    JobSpec,
    JobSubmitted,
    JobThroughput,
    Provenance,
    RunJobs,
    SolveStatus,
    ThroughputEstimated,
)
from common.topics import MESSAGE_TYPES, binding_pattern, registry, topic_matches
from tests.support.fuzz import hostile_bodies
from tests.support.messages import submitted
from tests.support.strategies import messages


def envelope(schema: str = "JobSubmitted", **body: object) -> dict[str, object]:
    return {"schema": schema, "ver": 1, "id": "m1", "cid": None, "src": "test", "at": 1.0, "body": body}


SPEC = {"job_id": "1", "job_type": "ResNet-50 (batch size 64)", "total_steps": 100}


@pytest.mark.slow  # ~5-11 s: 300 hypothesis examples of every message type
@settings(max_examples=300, deadline=None)
@given(messages(MESSAGE_TYPES), st.text(max_size=10), st.floats(allow_nan=False, allow_infinity=False))
def test_every_message_type_round_trips(message, source, sent_at_s):
    data = DEFAULT_CODEC.encode(message, source=source, sent_at_s=sent_at_s, correlation_id="c1")
    decoded = DEFAULT_CODEC.decode(data)
    assert decoded.message == message
    assert type(decoded.message) is type(message)
    assert decoded.envelope.schema == type(message).SCHEMA
    assert decoded.envelope.source == source and decoded.envelope.sent_at_s == sent_at_s
    assert decoded.envelope.correlation_id == "c1"


def test_every_message_type_has_a_routing_key_and_a_unique_schema():
    table = registry()
    assert len(table) == len(MESSAGE_TYPES)
    for cls in MESSAGE_TYPES:
        assert topic_matches(binding_pattern(cls), cls.ROUTING_KEY.replace("{worker_id}", "w1"))


def test_worker_commands_route_to_their_worker():
    run = RunJobs("w7", 1, "l1", 1, ("j",), (0,), 360.0)
    assert run.routing_key() == "worker.cmd.w7.run"
    assert binding_pattern(RunJobs) == "worker.cmd.*.run"


def test_unknown_fields_are_ignored_and_defaults_fill_missing_optional_fields():
    data = msgpack.packb(envelope(spec={**SPEC, "new_field_from_the_future": [1, 2]}, extra=3))
    message = DEFAULT_CODEC.decode(data).message
    assert message == JobSubmitted(JobSpec("1", "ResNet-50 (batch size 64)", 100))


def test_integers_are_accepted_for_float_fields():
    data = msgpack.packb(envelope(spec={**SPEC, "priority_weight": 2}))
    assert DEFAULT_CODEC.decode(data).message.spec.priority_weight == 2.0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        (envelope(spec={**SPEC, "total_steps": "9"}), "JobSubmitted.spec.total_steps: expected int, got str"),
        (envelope(spec={**SPEC, "total_steps": True}), "JobSubmitted.spec.total_steps: expected int, got bool"),
        (envelope(spec={**SPEC, "priority_weight": math.nan}), "JobSubmitted.spec.priority_weight: not a finite number"),
        (envelope(spec={**SPEC, "slo_s": -math.inf}), "JobSubmitted.spec.slo_s: not a finite number"),
        (envelope(spec={"job_id": "1", "total_steps": 5}), "JobSubmitted.spec.job_type: missing field"),
        (envelope(), "JobSubmitted.spec: missing field"),
        (envelope("Nope"), "envelope: unknown schema 'Nope'"),
        ({**envelope(spec=SPEC), "at": math.nan}, "envelope: 'at' must be a finite number"),
        ({**envelope(spec=SPEC), "ver": 0}, "envelope: version must be >= 1"),
        ({k: v for k, v in envelope(spec=SPEC).items() if k != "id"}, "envelope: missing field 'id'"),
        ([1, 2], "envelope: expected map, got list"),
        (
            envelope("AllocationComputed", request_id="r", policy="p", status="great", objective=1, solve_time_s=0, entries=[]),
            "AllocationComputed.status: expected one of optimal | optimal_inaccurate | infeasible | failed",
        ),
        (
            envelope(
                "ThroughputEstimated",
                colocations=[{"classes": ["a", "b"], "fractions": {"v100": [1.0, "x"]}, "provenance": {}, "confidence": {}}],
            ),
            "ThroughputEstimated.colocations[0].fractions['v100'][1]: expected float, got str",
        ),
    ],
)
def test_malformed_messages_name_the_field(wire, reason):
    with pytest.raises(DecodeError) as info:
        DEFAULT_CODEC.decode(msgpack.packb(wire))
    assert info.value.reason.startswith(reason)


def test_size_limit_is_checked_before_unpacking():
    codec = Codec(limits=CodecLimits(max_body_bytes=64))
    with pytest.raises(DecodeError, match="body too large: 65 bytes > limit 64"):
        codec.decode(b"\x00" * 65)
    with pytest.raises(EncodeError, match="exceeds the limit of 64"):
        codec.encode(submitted(1, job_type="x" * 100), source="t", sent_at_s=0)


@pytest.mark.parametrize(
    "data",
    [
        msgpack.packb(msgpack.ExtType(5, b"abc")),
        msgpack.packb(envelope(spec={**SPEC, "job_id": msgpack.ExtType(1, b"x")})),
        msgpack.packb({**envelope(spec=SPEC), "at": msgpack.Timestamp(5, 0)}, datetime=False),
    ],
)
def test_ext_types_and_timestamps_are_refused(data):
    with pytest.raises(DecodeError, match="ext types"):
        DEFAULT_CODEC.decode(data)


def test_strings_lists_and_map_keys_are_bounded():
    codec = Codec(limits=CodecLimits(max_str_bytes=16, max_items=8))
    with pytest.raises(DecodeError, match="max_str_len"):
        codec.decode(msgpack.packb(envelope(spec={**SPEC, "job_id": "x" * 17})))
    with pytest.raises(DecodeError, match="max_array_len"):
        codec.decode(msgpack.packb(envelope("RunJobs", job_ids=["a"] * 9)))
    with pytest.raises(DecodeError, match="map key"):
        DEFAULT_CODEC.decode(msgpack.packb({1: 2}))


def test_non_bytes_and_empty_bodies_are_decode_errors():
    with pytest.raises(DecodeError, match="not bytes"):
        DEFAULT_CODEC.decode("a string")  # type: ignore[arg-type]
    with pytest.raises(DecodeError, match="empty body"):
        DEFAULT_CODEC.decode(b"")


def test_encode_refuses_what_a_reader_would_refuse():
    bad = AllocationComputed("r", "p", SolveStatus.OPTIMAL, 1.0, 0.1, (AllocationEntry(("1",), {"v100": math.inf}),))
    with pytest.raises(EncodeError, match=r"entries\[0\].fractions\['v100'\]: not a finite number"):
        DEFAULT_CODEC.encode(bad, source="t", sent_at_s=0)
    with pytest.raises(EncodeError, match="not a registered message type"):
        DEFAULT_CODEC.encode(JobSpec("1", "t", 1), source="t", sent_at_s=0)  # type: ignore[arg-type]
    with pytest.raises(EncodeError, match=r"provenance\[.v100.\]: expected one of"):
        row = JobThroughput("1", {"v100": 1.0}, {"v100": "guess"}, {"v100": 0.5})  # type: ignore[dict-item]
        DEFAULT_CODEC.encode(ThroughputEstimated(jobs=(row,)), source="t", sent_at_s=0)


def test_numpy_numbers_encode_as_plain_numbers():
    import numpy as np

    row = JobThroughput("1", {"v100": np.float64(2.5)}, {"v100": Provenance.ORACLE}, {"v100": np.float64(1.0)})
    msg = ThroughputEstimated(jobs=(row,))
    spec = submitted(1, total_steps=np.int64(7))
    assert DEFAULT_CODEC.decode(DEFAULT_CODEC.encode(msg, source="t", sent_at_s=0)).message == msg
    assert DEFAULT_CODEC.decode(DEFAULT_CODEC.encode(spec, source="t", sent_at_s=0)).message.spec.total_steps == 7  # type: ignore[attr-defined]


def test_ten_thousand_hostile_bodies_each_decode_or_raise_decode_error():
    decoded = refused = 0
    for body in hostile_bodies(12_000, seed=1):
        try:
            result = DEFAULT_CODEC.decode(body)
        except DecodeError as e:
            assert e.reason
            refused += 1
            continue
        # A mutation that still decodes must be a whole, valid message that re-encodes.
        again = DEFAULT_CODEC.encode(result.message, source="fuzz", sent_at_s=0)
        assert DEFAULT_CODEC.decode(again).message == result.message
        decoded += 1
    assert decoded + refused == 12_000
    assert refused > 10_000


@pytest.mark.slow  # ~3-7 s: 2,000 hypothesis examples
@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_never_escape_as_another_error(data):
    try:
        DEFAULT_CODEC.decode(data)
    except DecodeError as e:
        assert e.reason


_msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@pytest.mark.slow  # ~6-15 s: 1,000 hypothesis examples
@settings(max_examples=1000, deadline=None)
@given(st.sampled_from([cls.SCHEMA for cls in MESSAGE_TYPES]), _msgpack_values)
def test_well_formed_msgpack_of_the_wrong_shape_is_a_decode_error(schema, body):
    data = msgpack.packb({**envelope(schema), "body": body})
    try:
        DEFAULT_CODEC.decode(data)
    except DecodeError as e:
        assert e.reason.startswith(schema) or e.reason.startswith("envelope")
