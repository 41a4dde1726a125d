"""How a round reads the ledgers' columns: as numpy arrays, or, below SMALL_ROWS rows, once as
flat Python lists that every step's list forms then walk (the holds, their fit, the queues).
One knob for every step: the steps read ``ledger_reads.SMALL_ROWS`` when they run, so a test
that sets it here moves every form to the same side."""

from __future__ import annotations

from typing import NamedTuple

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
    """The ledgers' columns as lists, or None above SMALL_ROWS rows (there numpy pays)."""
    ledgers = state.entries
    rows = ledgers.rows
    if rows > SMALL_ROWS:
        return None
    return LedgerLists(
        len(ledgers.types),
        ledgers.allocation_matrix(state.allocation).ravel().tolist(),
        ledgers.received_s[:rows].ravel().tolist(),
        ledgers.deficit_s[:rows].ravel().tolist(),
        ledgers.throughputs[:rows].ravel().tolist(),
    )
