"""The allocation in force, as a request gives it back (AllocationEntry: a job or a packed pair,
fractions per type), into the arrays the policies read (Problem.previous). build_problem's
(validation.py), in a module of its own for its two paths: plain job rows added as they come
(what a mechanism sends), else the general loop that checks every value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from common.errors import ProblemError
from common.job_checks import check_number
from policy_service.core.problem import AllocationEntry, PreviousAllocation, _readonly


def previous_allocation(
    entries: Sequence[AllocationEntry] | None, index: Mapping[str, int], worker_types: tuple[str, ...]
) -> PreviousAllocation | None:
    """The allocation in force as the policies read it (PreviousAllocation: each job's row, the
    packed pairs), from the entries a request carries; a job that has finished since is left
    out, a value is checked as the job fields are (ProblemError naming it)."""
    if entries is None:
        return None
    num_types = len(worker_types)
    type_index = {name: k for k, name in enumerate(worker_types)}
    singles = _previous_singles(entries, index, type_index)
    if singles is not None:
        return PreviousAllocation(
            job_fractions=_readonly(np.asarray(singles, dtype=float).reshape(len(index), num_types)),
            pair_jobs=_readonly(np.zeros((0, 2), dtype=np.int64)),
            pair_fractions=_readonly(np.zeros((0, num_types), dtype=float)),
        )
    # Python floats, not numpy rows: the same additions in the same order, without a small
    # array per entry (an entry per job, hundreds of problems a simulation).
    singles = [[0.0] * num_types for _ in range(len(index))]
    pair_jobs: list[tuple[int, int]] = []
    pair_fractions: list[list[float]] = []
    for e, entry in enumerate(entries):
        path = f"previous_allocation[{e}]"
        if len(entry.job_ids) not in (1, 2):
            raise ProblemError(f"{path}.jobs: expected one or two job ids")
        if not all(job_id in index for job_id in entry.job_ids):
            continue  # a job that finished since: nothing to remember
        fractions = [0.0] * num_types
        for name, value in entry.fractions.items():
            k = type_index.get(name) if isinstance(name, str) else None
            if k is None:
                raise ProblemError(f"{path}.fractions.{name}: not a worker type of this cluster")
            fractions[k] = float(check_number(value, f"{path}.fractions.{name}"))
        if len(entry.job_ids) == 1:
            row = singles[index[entry.job_ids[0]]]
            for k in range(num_types):
                row[k] += fractions[k]
        else:
            pair_jobs.append((index[entry.job_ids[0]], index[entry.job_ids[1]]))
            pair_fractions.append(fractions)
    return PreviousAllocation(
        job_fractions=_readonly(np.asarray(singles, dtype=float).reshape(len(index), num_types)),
        pair_jobs=_readonly(np.asarray(pair_jobs, dtype=np.int64).reshape(-1, 2)),
        pair_fractions=_readonly(np.asarray(pair_fractions, dtype=float).reshape(-1, num_types)),
    )


def _previous_singles(
    entries: Sequence[AllocationEntry], index: Mapping[str, int], type_index: Mapping[str, int]
) -> list[list[float]] | None:
    """previous_allocation's job rows when every entry is one job's with plain finite floats
    >= 0 on known types (what a mechanism sends back), added in the same order; None for
    anything else (a pair, a value to check), which the general loop then reads and checks."""
    singles = [[0.0] * len(type_index) for _ in range(len(index))]
    for entry in entries:
        job_ids = entry.job_ids
        if len(job_ids) != 1:
            return None
        j = index.get(job_ids[0])
        if j is None:
            continue  # a job that finished since
        row = singles[j]
        for name, value in entry.fractions.items():
            k = type_index.get(name)
            if k is None or type(value) is not float or not 0.0 <= value < math.inf:
                return None
            row[k] += value
    return singles
