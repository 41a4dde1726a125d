"""How a round reads the ledgers' columns: as numpy arrays, or, below SMALL_ROWS rows, once as
flat Python lists that every step's list forms then walk (the holds, their fit, the queues).
One knob for every step: the steps read ``ledger_reads.SMALL_ROWS`` when they run, so a test
that sets it here moves every form to the same side."""

from __future__ import annotations

from collections.abc import Collection
from typing import NamedTuple

import numpy as np

from mechanism_service.core.model import MechanismState

# Below this many ledger rows (live or not) the planner's passes walk Python lists instead of
# calling numpy: a numpy call costs ~1 us whatever its size, a list step ~50 ns, so a cluster of
# tens of GPUs (Gavel's calibration: ~30 entries) plans faster in lists; above it, in numpy.
# Both evaluate the same definition (tests/unit/mechanism/test_planning_fast.py runs both).
SMALL_ROWS = 128


class LedgerLists(NamedTuple):
    """The ledgers' columns as flat Python lists, read once a round for a few rows (below
    SMALL_ROWS): a cell (row, column) is ``row * types + column``, its members' rates ``2 * cell``
    and ``2 * cell + 1``. One ``tolist`` a column for the round's passes (holds, their fit, the
    queues) instead of a handful of numpy calls each."""

    types: int
    allocation: list[float]
    received_s: list[float]
    deficit_s: list[float]
    rates: list[float]


def ledger_lists(state: MechanismState) -> LedgerLists | None:
    """The ledgers' columns as lists, or None above SMALL_ROWS rows (there numpy pays). Only
    the time received is read each round: the allocation, the deficits and the rates change
    only where the ledgers say so (``Ledgers.changed``: a reset, an admission, a removal), and
    their lists are kept in the ledgers' ``derived`` until then. Nothing may change a list."""
    ledgers = state.entries
    rows = ledgers.rows
    if rows > SMALL_ROWS:
        return None
    allocation = ledgers.allocation_matrix(state.allocation)  # (first: a new allocation empties derived)
    kept = ledgers.derived.get("lists")
    if kept is None:
        kept = ledgers.derived["lists"] = (
            allocation.ravel().tolist(), ledgers.deficit_s[:rows].ravel().tolist(), ledgers.throughputs[:rows].ravel().tolist(),
        )
    allocation_list, deficit_s, rates = kept  # type: ignore[misc]
    return LedgerLists(len(ledgers.types), allocation_list, ledgers.received_s[:rows].ravel().tolist(), deficit_s, rates)


def with_member(members: np.ndarray, jobs: Collection[int]) -> np.ndarray:
    """(rows,) True where a row's entry has a member among ``jobs``, from the ledgers' (first,
    last) members of each row (Ledgers.members; False for a removed row, whose members are -1),
    looked up at once in a table of job index + 1 (index 0, a removed row's: never)."""
    if not len(members) or not jobs:
        return np.zeros(len(members), bool)
    among = np.zeros(max(int(members.max()), max(jobs)) + 2, bool)
    among[np.fromiter(jobs, np.int64, len(jobs)) + 1] = True
    found = among[members + 1]
    return found[:, 0] | found[:, 1]
