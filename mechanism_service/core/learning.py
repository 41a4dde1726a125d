"""What a new estimate does to the mechanism's state (pure, both shells call it).

    take_estimate(state, book, message, rates, ended) -> bool   (True: solve the allocation again)

The book takes the message in (estimates.EstimateBook.apply). Then every entry whose throughputs
it moved (a job's row, or the fractions of its pair of classes) is compared with its ledger: an
entry that moved materially (estimates.material) takes the new throughputs at once, and the
allocation is due again; smaller moves wait for the next solve, which refreshes every entry
(rounds.begin_reset). Re-solving on every report would reset the fairness ledgers for noise.
"""

from __future__ import annotations

from collections.abc import Iterable

from common.messages import ThroughputEstimated
from mechanism_service.core.estimates import EstimateBook, material
from mechanism_service.core.model import Entry, MechanismState
from mechanism_service.core.profiling import new_request
from mechanism_service.core.rates import EstimatedRates
from mechanism_service.core.reducers import entry_throughputs


def take_estimate(
    state: MechanismState | None, book: EstimateBook, message: ThroughputEstimated, rates: EstimatedRates,
    ended: Iterable[str] = (),
) -> bool:
    changes = book.apply(message, ended)
    if state is None:
        return False
    for job_id in changes.requests:
        new_request(state, job_id)
    if not (changes.jobs or changes.pairs):
        return False
    moved = _moved_entries(state, changes.jobs, changes.pairs, rates)
    solve_again = False
    for entry in moved:
        ledger = state.entries[entry]
        now = {w: entry_throughputs(state, entry, w, rates) for w in state.gpus}
        if material(ledger.throughputs, now):
            ledger.throughputs.update(now)
            solve_again = True
    if solve_again:
        state.needs_allocation = True
    return solve_again


def _moved_entries(
    state: MechanismState, job_ids: set[str], pairs: set[tuple[str, str]], rates: EstimatedRates
) -> list[Entry]:
    indices = {i for i, job in state.jobs.items() if job.job_id in job_ids}
    class_of = {i: rates.class_of(job) for i, job in state.jobs.items()} if pairs else {}
    moved = []
    for entry in state.entries:
        if not indices.isdisjoint(entry):
            moved.append(entry)
        elif len(entry) == 2 and pairs:
            a, b = class_of[entry[0]], class_of[entry[1]]
            if (min(a, b), max(a, b)) in pairs:
                moved.append(entry)
    return moved
