"""The allocation in force as arrays, as a mechanism hands it to a policy in the same process
(the simulator's fast path: mechanism_service/core/policy_input.py previous_columns ->
policy_service/core/previous.py previous_from_columns) instead of an AllocationEntry an entry.
In common/ because both services read it; it never goes over the bus (a request carries
AllocationEntry tuples, validated by the policy service)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from common.messages import AllocationEntry


@dataclass(frozen=True, eq=False)
class PreviousColumns:
    """The entries of an allocation in force as arrays, in its order: what the AllocationEntry
    tuple of the same entries says, from a caller in this process that made them itself (the
    simulator's mechanism: mechanism_service/core/policy_input.py previous_columns), so a few
    hundred pairs and thousands of jobs cost numpy passes, not an entry object and a checked
    value each (~30 ms a packed re-solve at 120:120:120).

    job_ids (J,): the jobs the entries name; members (E, 2): positions in job_ids (a single
    job's twice); single (E,): an entry of one job (else a pair, members in the entry's
    order); types (T,) and fractions (E, T): the shares, finite floats >= 0 (0.0 for a type an
    entry does not name). Its length is the number of entries (none: falsy, as an empty tuple)."""

    job_ids: tuple[str, ...]
    members: np.ndarray
    single: np.ndarray
    types: tuple[str, ...]
    fractions: np.ndarray

    def __len__(self) -> int:
        return len(self.members)

    def entries(self) -> tuple[AllocationEntry, ...]:
        """The same entries one object each (what a request would carry; for tests and tools)."""
        ids = self.job_ids
        return tuple(
            AllocationEntry((ids[a],) if one else (ids[a], ids[b]), dict(zip(self.types, row)))
            for (a, b), one, row in zip(self.members.tolist(), self.single.tolist(), self.fractions.tolist())
        )


@dataclass(frozen=True, eq=False)
class AnswerColumns:
    """A policy's answer as arrays, as a policy in the same process hands it to the mechanism
    (policy_service/answer.py answer_admitted -> mechanism_service/core/allocation.py
    apply_allocation): the reply's entries (one per job, then one per concrete packed pair)
    without a job-id tuple and a dict each made only to be looked up again.

    job_ids (n,), types (T,); job_fractions (n, T) and pair_fractions (Q, T): the shares as the
    reply writes them (solver noise already written as 0); pair_members (Q, 2): positions in
    job_ids, in the reply's order."""

    job_ids: tuple[str, ...]
    types: tuple[str, ...]
    job_fractions: np.ndarray
    pair_members: np.ndarray
    pair_fractions: np.ndarray

    def entries(self) -> list[tuple[tuple[str, ...], dict[str, float]]]:
        """(job ids, type -> fraction) of each job, then of each packed pair: the reply's entries."""
        ids, types = self.job_ids, self.types
        # ((job id,), {type: fraction}) a job, built in C
        out = list(zip(zip(ids), map(dict, map(zip, itertools.repeat(types), self.job_fractions.tolist()))))
        out += [((ids[a], ids[b]), dict(zip(types, row))) for (a, b), row in zip(self.pair_members.tolist(), self.pair_fractions.tolist())]
        return out

    def fractions(self) -> dict[tuple[str, ...], dict[str, float]]:
        """job ids -> type -> fraction: the reply's entries as one dict (a later entry of the
        same job ids keeps the first one's place and takes its value, as dict() of them does)."""
        return dict(self.entries())
