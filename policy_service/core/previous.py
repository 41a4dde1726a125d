"""The allocation in force, as a request gives it back (AllocationEntry: a job or a packed pair,
fractions per type), into the arrays the policies read (Problem.previous). build_problem's
(validation.py), in a module of its own for its two paths: plain job rows added as they come
(what a mechanism sends), else the general loop that checks every value; and the same arrays
from PreviousColumns, the allocation in force as an admitting caller in this process hands it
over (the simulator's mechanism: its own entries, as arrays, nothing to check).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

import numpy as np

from common.allocation_columns import PreviousColumns
from common.errors import ProblemError
from common.job_checks import check_number
from policy_service.core.problem import AllocationEntry, PreviousAllocation, _readonly


def previous_allocation(
    entries: Sequence[AllocationEntry] | PreviousColumns | None, index: Mapping[str, int], worker_types: tuple[str, ...]
) -> PreviousAllocation | None:
    """The allocation in force as the policies read it (PreviousAllocation: each job's row, the
    packed pairs), from the entries a request carries; a job that has finished since is left
    out, a value is checked as the job fields are (ProblemError naming it). PreviousColumns:
    the same arrays, from its columns (previous_from_columns)."""
    if entries is None:
        return None
    if isinstance(entries, PreviousColumns):
        return previous_from_columns(entries, index, worker_types)
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


def previous_from_columns(
    columns: PreviousColumns, index: Mapping[str, int], worker_types: tuple[str, ...]
) -> PreviousAllocation:
    """previous_allocation's arrays from PreviousColumns, the same floats: a job's row is 0.0
    plus its entries' shares in their order (np.add.at adds in order, unbuffered), a pair's row
    its shares as given; entries naming a job not in ``index`` are left out, the pairs kept in
    the entries' order. A type the problem does not have is refused, as an entry naming it is."""
    num_types = len(worker_types)
    type_index = {name: k for k, name in enumerate(worker_types)}
    unknown = [name for name in columns.types if name not in type_index]
    if unknown:
        raise ProblemError(f"previous_allocation: fractions.{unknown[0]}: not a worker type of this cluster")
    position = np.fromiter(map(index.get, columns.job_ids, itertools.repeat(-1)), np.int64, len(columns.job_ids))
    members = position[np.asarray(columns.members, dtype=np.int64).reshape(-1, 2)]
    kept = (members >= 0).all(axis=1)
    fractions = np.zeros((len(members), num_types))
    fractions[:, [type_index[name] for name in columns.types]] = columns.fractions
    single = np.asarray(columns.single, dtype=bool)
    job_fractions = np.zeros((len(index), num_types))
    alone = kept & single
    np.add.at(job_fractions, members[alone, 0], fractions[alone])
    packed = kept & ~single
    return PreviousAllocation(
        job_fractions=_readonly(job_fractions),
        pair_jobs=_readonly(np.ascontiguousarray(members[packed]).reshape(-1, 2)),
        pair_fractions=_readonly(np.ascontiguousarray(fractions[packed]).reshape(-1, num_types)),
    )
