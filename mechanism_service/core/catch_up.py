"""Which jobs have fallen behind their allocation far enough that the migration-aware rounds
stop holding them back (docs/mechanism.md, "What a move costs": jobs that fall behind).

The move charge and the holds trade a job's place in the greedy pass for fewer restores, and
the priorities forget what that cost it: a job's priority on a type is its share over what it
received since the last reset, and the default preset resets at every arrival and completion,
so time a job lost to a hold or a charge survives only in the deficits, which break ties. A
short job that waits a few rounds behind a hold or runs them on a type the allocation gives it
nothing (its one allocated pair partner held elsewhere) finishes far later than its share
would have it (issue 23, item 6: the worst finish-time-fairness ratio 1.31 -> 1.52).

A job is *behind* when the finish-time-fairness ratio it is on course for, if it waits this
round, exceeds ``settings.catch_up_ratio``:

    1 + (owed_steps + round_s x allocated_steps_per_s) / total_steps

``owed_steps``: over the job's entries (its single and every pair it is in) and types, the time
each is owed there (the folded deficit, plus its share of the time since the reset, less what
it received since: what the holds' overshoot test reads) times the job's rate there; time run
where the allocation gives it nothing counts against it, as work done. ``allocated_steps_per_s``:
the job's throughput under the allocation. Owed steps over total steps is the share of its
work the job is late by, which is what its ratio will exceed 1 by if it never catches up; the
round it may wait is counted in advance, so a job so short that one round of waiting would put
it past the bound is behind from the start.

Pure: reads a MechanismState.
"""

from __future__ import annotations

import numpy as np

from mechanism_service.core.model import MechanismState
from mechanism_service.core.settings import MechanismSettings


def behind_jobs(state: MechanismState, now_s: float, settings: MechanismSettings) -> frozenset[int]:
    """The indices of the jobs behind (the module docstring); empty when the setting is off."""
    bound = settings.catch_up_ratio
    if bound is None or not state.jobs:
        return frozenset()
    excess, jobs = bound - 1.0, state.jobs
    if len(state.entries.row_of) == len(jobs):  # no pairs (a job has one single): one row a job
        return _behind_singles(state, now_s, settings, excess)
    job_indices, late = steps_late_columns(state, now_s, settings)
    # each job's own bound is read only for those late by more than the smallest job's
    candidates = job_indices[late > excess * min(job.total_steps for job in jobs.values())].tolist()
    late_of = dict(zip(job_indices.tolist(), late.tolist()))
    return frozenset(j for j in candidates if j in jobs and late_of[j] > excess * jobs[j].total_steps)


def _behind_singles(state: MechanismState, now_s: float, settings: MechanismSettings, excess: float) -> frozenset[int]:
    """``behind_jobs`` when every entry is a single: a job is behind where its row's steps late
    exceed ``excess`` x its steps (the test behind_jobs makes; its first cut, against the
    smallest job's, only spares it reading the others). steps_late_columns' arithmetic on the
    live rows, in arrays laid out as its own, so the einsum sums each row alike; what only a
    change of the ledgers moves (the rows, their deficits, shares and rates, the jobs' bounds)
    is gathered once and kept in the ledgers' ``derived``, and a round reads its time received."""
    indices, late, bounds = late_singles(state, now_s, settings, excess)
    behind = (late > bounds).nonzero()[0]
    return frozenset(indices[behind].tolist()) if len(behind) else frozenset()


def late_singles(
    state: MechanismState, now_s: float, settings: MechanismSettings, excess: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(job indices, steps late, ``excess`` x their steps) of the live rows, every entry a single."""
    ledgers = state.entries
    allocation = ledgers.allocation_matrix(state.allocation)  # (first: a new allocation empties derived)
    kept = ledgers.derived.get("catch_up")
    if kept is None or kept[0] != excess:  # type: ignore[index]
        rows = np.flatnonzero(ledgers.live[: ledgers.rows])
        indices = ledgers.members[rows, 0]
        steps = np.fromiter((state.jobs[j].total_steps for j in indices.tolist()), float, len(rows))
        # the live rows' received time is read each round: a slice where they are the first rows
        # (no holes: a view, not a gather; the same floats)
        received = slice(0, len(rows)) if len(rows) == ledgers.rows else rows
        kept = ledgers.derived["catch_up"] = (
            excess, received, indices, ledgers.deficit_s[rows], allocation[rows], ledgers.throughputs[rows][:, :, 0],
            excess * steps,
        )
    _, received, indices, deficit_s, shares, rates, bounds = kept  # type: ignore[misc]
    owed_s = deficit_s + shares * (now_s - state.last_reset_s + settings.round_s)
    owed_s -= ledgers.received_s[received] - settings.seed_s
    return indices, _einsum("rt,rt->r", owed_s, rates), bounds


# np.einsum without its dispatch and keyword handling (~2 us a call on a few rows): with no
# ``optimize`` it calls this same C function with the same operands
_einsum = getattr(np._core.multiarray, "c_einsum", np.einsum)


def steps_late(state: MechanismState, now_s: float, settings: MechanismSettings) -> dict[int, float]:
    """Job index -> the steps it will be owed at the end of this round if it waits: over its
    entries and types, (owed time + its share of the round) x its rate there."""
    job_indices, late = steps_late_columns(state, now_s, settings)
    return dict(zip(job_indices.tolist(), late.tolist()))


def steps_late_columns(state: MechanismState, now_s: float, settings: MechanismSettings) -> tuple[np.ndarray, np.ndarray]:
    """``steps_late`` as two arrays, (job indices, steps late): a few numpy passes over
    the ledgers' columns, the sums per job by the rows' members (model.Ledgers.members)."""
    ledgers = state.entries
    rows = ledgers.rows
    allocation = ledgers.allocation_matrix(state.allocation)  # rows x types
    # owed time, plus the share of the round it may wait
    owed_s = ledgers.deficit_s[:rows] + allocation * (now_s - state.last_reset_s + settings.round_s)
    owed_s -= ledgers.received_s[:rows] - settings.seed_s
    rates = ledgers.throughputs[:rows]  # rows x types x 2: each member's steps/s (a single's twice)
    live = ledgers.live[:rows]
    members = ledgers.members[:rows]
    first = np.einsum("rt,rt->r", owed_s, rates[:, :, 0])
    if len(ledgers.row_of) == len(state.jobs):  # no pairs (a job has one single): one row a job
        return members[live, 0], first[live]
    second = np.einsum("rt,rt->r", owed_s, rates[:, :, 1])
    pair = live & (members[:, 0] != members[:, 1])  # a single's second member is its first again
    indices = np.concatenate((members[live, 0], members[pair, 1]))
    # each job's sum in input order, as np.unique's inverse positions would bin it (the same
    # additions in the same order), without the sort: binned by job index, the present kept
    weights = np.concatenate((first[live], second[pair]))
    job_indices = np.flatnonzero(np.bincount(indices))
    return job_indices, np.bincount(indices, weights=weights)[job_indices]
