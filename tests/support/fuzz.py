"""A seeded corpus of hostile message bodies: random bytes, mutated valid messages, well-formed
msgpack of the wrong shape, ext types, non-finite floats, oversize strings and arrays."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import msgpack
import numpy as np

from common.codec import DEFAULT_CODEC
from common.errors import DecodeError
from tests.support.messages import submitted


def _valid_bodies() -> list[bytes]:
    from common.messages import AllocationComputed, AllocationEntry, JobProgress, RunJobs, SolveStatus

    samples = [
        submitted(3),
        submitted(4, slo_s=3600.0, entity="teamA"),
        RunJobs("w1", 2, "lease-9", 4, ("1", "2"), (0, 1), 360.0, (10, 20)),
        JobProgress("7", "w1", "lease-9", 2, 500, 120.5, 4.4, False),
        AllocationComputed(
            "r", "max_min_fairness_perf", SolveStatus.OPTIMAL, 0.5, 0.01,
            (AllocationEntry(("1",), {"v100": 0.5, "k80": 0.25}), AllocationEntry(("1", "2"), {"p100": 0.1})),
        ),
    ]
    return [DEFAULT_CODEC.encode(m, source="fuzz", sent_at_s=1.0) for m in samples]


def _mutate(body: bytes, rng: np.random.Generator) -> bytes:
    b = bytearray(body)
    for _ in range(int(rng.integers(1, 4))):
        op = int(rng.integers(0, 6))
        if not b:
            b = bytearray(rng.bytes(4))
        i = int(rng.integers(0, len(b)))
        if op == 0:  # flip a bit
            b[i] ^= 1 << int(rng.integers(0, 8))
        elif op == 1:  # replace a byte
            b[i] = int(rng.integers(0, 256))
        elif op == 2:  # truncate
            b = b[:i]
        elif op == 3:  # insert random bytes
            b[i:i] = rng.bytes(int(rng.integers(1, 8)))
        elif op == 4:  # delete a run
            del b[i : i + int(rng.integers(1, 8))]
        else:  # duplicate a run
            b[i:i] = b[i : i + int(rng.integers(1, 16))]
    return bytes(b)


def _wrong_shape(rng: np.random.Generator) -> bytes:
    """Well-formed msgpack that is not a valid message (the decoder's schema checks must catch it)."""
    envelope = {"schema": "JobSubmitted", "ver": 1, "id": "x", "cid": None, "src": "fuzz", "at": 1.0}
    spec = {"job_id": "1", "job_type": "ResNet-50 (batch size 64)", "total_steps": 100}
    choice = int(rng.integers(0, 12))
    if choice == 0:
        return msgpack.packb({**envelope, "body": {"spec": {**spec, "total_steps": float("nan")}}})
    if choice == 1:
        return msgpack.packb({**envelope, "body": {"spec": {**spec, "priority_weight": float("inf")}}})
    if choice == 2:
        return msgpack.packb({**envelope, "body": {"spec": {**spec, "total_steps": "many"}}})
    if choice == 3:
        return msgpack.packb({**envelope, "body": {"spec": {k: v for k, v in spec.items() if k != "job_id"}}})
    if choice == 4:
        return msgpack.packb({**envelope, "schema": "NoSuchMessage", "body": {}})
    if choice == 5:
        return msgpack.packb({**envelope, "body": msgpack.ExtType(int(rng.integers(0, 127)), rng.bytes(8))})
    if choice == 6:
        return msgpack.packb({**envelope, "body": {"spec": {**spec, 1: 2}}}, strict_types=False)
    if choice == 7:
        return msgpack.packb({**envelope, "at": msgpack.Timestamp(1, 2), "body": {"spec": spec}}, datetime=False)
    if choice == 8:
        return msgpack.packb({**envelope, "body": {"spec": {**spec, "job_id": "x" * 70_000}}})
    if choice == 9:
        return msgpack.packb({**envelope, "body": {"spec": {**spec, "job_id": ["nested"] * 3}}})
    if choice == 10:
        return msgpack.packb([[[[[[[[1]]]]]]]] * int(rng.integers(1, 4)))
    return msgpack.packb({**envelope, "ver": int(rng.integers(-5, 1)), "body": {"spec": spec}})


def hostile_bodies(n: int, seed: int = 0) -> Iterator[bytes]:
    """``n`` bodies: about a third each of random bytes, mutated valid messages, wrong shapes."""
    rng = np.random.default_rng(seed)
    valid = _valid_bodies()
    for i in range(n):
        kind = i % 3
        if kind == 0:
            yield rng.bytes(int(rng.integers(0, 200)))
        elif kind == 1:
            yield _mutate(valid[int(rng.integers(0, len(valid)))], rng)
        else:
            yield _wrong_shape(rng)


def poison_for(key: str, bodies: Iterable[bytes]) -> list[bytes]:
    """The bodies no consumer of ``key`` may act on: undecodable, or a message of another key
    (a well-formed message of the key itself is input, not poison)."""
    out = []
    for body in bodies:
        try:
            message = DEFAULT_CODEC.decode(body).message
        except DecodeError:
            out.append(body)
            continue
        if message.routing_key() != key:
            out.append(body)
    return out
