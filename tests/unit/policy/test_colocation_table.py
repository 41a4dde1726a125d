"""colocation_from_table (Gavel's packing candidates by job type) with the table's look-ups kept
across calls is the loop it replaced, array for array, whatever keys came before."""

from __future__ import annotations

import numpy as np
import pytest

from common.throughputs import ThroughputTable
from policy_service.core.colocation import colocation_from_table
from policy_service.core.problem import Colocation
from tests.unit.policy.builders import gavel_table


def _loop(job_types: tuple[str | None, ...], scale_factors: np.ndarray, worker_types: tuple[str, ...], table: ThroughputTable) -> Colocation:
    """The loop as it was: a look-up per key pair and type at every call."""
    keys: dict[tuple[str, int], int] = {}
    key_of_job = np.full(len(job_types), -1, dtype=np.int64)
    for i, (job_type, sf) in enumerate(zip(job_types, scale_factors.tolist())):
        key_of_job[i] = keys.setdefault((job_type, sf), len(keys))  # type: ignore[arg-type]
    by_key = list(keys)
    pair_keys, values = [], []
    for a, (type_a, sf_a) in enumerate(by_key):
        for b in range(a, len(by_key)):
            type_b, sf_b = by_key[b]
            if sf_a != sf_b:
                continue
            row = np.zeros((len(worker_types), 2))
            listed = False
            for k, name in enumerate(worker_types):
                entry = table.pair(type_a, type_b, sf_a, name)
                if entry is not None:
                    row[k] = entry
                    listed = True
            if not listed:
                continue
            if a == b:
                row[:] = row.mean(axis=1, keepdims=True)
            pair_keys.append((a, b))
            values.append(row)
    return Colocation(
        key_of_job, np.asarray(pair_keys, dtype=np.int64).reshape(-1, 2),
        np.asarray(values, dtype=float).reshape(-1, len(worker_types), 2),
    )


@pytest.mark.parametrize("worker_types", [("v100", "p100", "k80"), ("k80", "v100"), ("k80", "v100", "a100")])
def test_the_kept_lookups_make_the_loops_arrays(worker_types: tuple[str, ...]) -> None:
    table = gavel_table()
    types = sorted({key[0] for key in table.isolated_steps_per_s}) + ["not-in-the-table"]
    rng = np.random.default_rng(len(worker_types))
    for n in [0, 1, 2, 5, 30, 120, 7, 60]:  # keys seen before and new ones, in other orders
        job_types = tuple(types[i] for i in rng.integers(0, len(types), n))
        scale_factors = rng.choice([1, 2, 4, 8], n)
        got = colocation_from_table(job_types, scale_factors, worker_types, table)
        want = _loop(job_types, scale_factors, worker_types, table)
        for name in ("key_of_job", "key_pairs", "throughputs_steps_per_s"):
            a, b = getattr(got, name), getattr(want, name)
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), (n, name)
            assert np.array_equal(np.signbit(a), np.signbit(b)), (n, name)
