"""Allocation resets (section 4: when to solve again, folding the ledgers into deficits) and
installing a new allocation. Section numbers refer to docs/gavel-semantics.md."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping

import numpy as np

from common.allocation_columns import AnswerColumns
from mechanism_service.core.model import Entry, FrozenAllocation, MechanismState, share_matrix
from mechanism_service.core.settings import MechanismSettings
from mechanism_service.core.stability import steady_allocation


def reset_due(state: MechanismState, now_s: float, settings: MechanismSettings, *, force: bool = False) -> bool:
    """Section 4: re-solve only after a change, and not more often than the minimum interval
    (with Gavel's quirk that a reset at t = 0 counts as "never reset"). ``force``: a change that
    cannot wait for the interval (a worker was lost: the allocation gives its GPUs away)."""
    if not state.needs_allocation:
        return False
    if force:
        return True
    if settings.reset_quirk_at_zero and state.last_reset_s == 0:
        return True
    return state.resets == 0 or now_s - state.last_reset_s >= settings.min_reset_interval_s


def reset_ledgers(state: MechanismState, now_s: float, settings: MechanismSettings) -> None:
    """Section 4: fold the time received under the old allocation into the deficits, then
    re-seed every entry (and each type's total) for the new allocation."""
    elapsed_s = now_s - state.last_reset_s
    seed = settings.seed_s
    ledgers = state.entries
    rows = ledgers.rows  # removed entries' rows too: nothing reads them
    # per cell, as the plain loop did: deficit += allocation x elapsed - (received - seed)
    target_s = ledgers.allocation_matrix(state.allocation) * elapsed_s
    ledgers.deficit_s[:rows] += target_s - (ledgers.received_s[:rows] - seed)
    ledgers.received_s[:rows] = seed
    ledgers.changed()  # the deficits moved: what the planner derived from them is stale
    total = _seeds_summed(seed, len(ledgers))
    for w in state.accelerator_types:
        state.type_time_s[w] = total
    state.last_reset_s = now_s
    state.resets += 1


def _seeds_summed(seed_s: float, count: int) -> float:
    """``seed_s`` added ``count`` times from 0.0, one addition after another (as the ledgers'
    reset always summed them: the same float, not ``seed_s * count``)."""
    if count == 0:
        return 0.0
    return float(np.add.accumulate(np.full(count, seed_s))[-1])


def apply_allocation(
    state: MechanismState,
    fractions: Mapping[tuple[str, ...], Mapping[str, float]] | AnswerColumns,
    isolated_throughputs: Mapping[str, float],
    settings: MechanismSettings,
    policy_state: str = "",
    valid_for_s: float | None = None,
) -> None:
    """Install a new allocation (job-id tuples -> type -> fraction) and remember the isolated
    baseline it came with (see policy_input.advance_isolated_time). ``valid_for_s``: the policy
    said its answer may change that long after this solve (at ``last_reset_s``) though no job
    arrives or leaves; begin_reset solves again then. ``fractions`` as AnswerColumns (a policy
    in this process): the same allocation from its arrays (_column_entries)."""
    jobs = state.jobs
    given = _column_entries(state, fractions) if isinstance(fractions, AnswerColumns) else None
    if given is not None:
        allocation, columns = given
    else:
        if isinstance(fractions, AnswerColumns):
            fractions = fractions.fractions()
        allocation = _answer_entries(fractions, jobs.index_of)  # (a state's jobs are always a JobTable)
        columns = allocation_columns(state, allocation)  # read by the re-lay and the install alike
    # (as many entries as the ledgers, each with a ledger: every entry is named, none missing)
    named_all = len(allocation) == len(state.entries) and bool((columns[0] >= 0).all())
    if settings.zero_fill_allocation and not named_all:
        # An LP policy returns a row for every entry it was given, zeros included.
        row_of = state.entries.row_of
        missing = row_of.keys() - allocation.keys()
        if missing:
            allocation = dict(allocation)  # _answer_entries may have made it frozen already
            # in the ledgers' order, each with nothing: rows of 0.0 after the answer's own
            added = list(filter(missing.__contains__, row_of))
            allocation.update(zip(added, map(dict, itertools.repeat(()))))
            rows, shares = columns
            columns = (
                np.concatenate([rows, np.fromiter(map(row_of.__getitem__, added), np.intp, len(added))]),
                np.concatenate([shares, np.zeros((len(added), shares.shape[1]))]),
            )
    if settings.steady_types_tolerance is not None:  # each job kept on its type (core/stability.py)
        relaid, relaid_shares = steady_allocation(
            state, allocation, settings.steady_types_tolerance, settings.steady_max_split_jobs, columns=columns,
            with_shares=True,
        )
        if relaid_shares is not None:  # the same entries in the same order: the same rows
            allocation, columns = relaid, (columns[0], relaid_shares)
    state.allocation = _install(state, allocation, columns)
    state.policy_state = policy_state
    state.needs_allocation = False
    state.resolve_at_s = None if valid_for_s is None else state.last_reset_s + valid_for_s
    if isolated_throughputs:
        for job, baseline in zip(jobs.values(), map(isolated_throughputs.get, map(_JOB_ID, jobs.values()))):
            job.isolated_throughput_at_last_solve = baseline
    else:  # no baselines (every policy but finish-time fairness): only a job that has one changes
        with_baseline = map(operator.is_not, map(_BASELINE, jobs.values()), itertools.repeat(None))
        for job in itertools.compress(list(jobs.values()), list(with_baseline)):
            job.isolated_throughput_at_last_solve = None


_JOB_ID = operator.attrgetter("job_id")
_BASELINE = operator.attrgetter("isolated_throughput_at_last_solve")
_FIRST = operator.itemgetter(0)


def _answer_entries(
    fractions: Mapping[tuple[str, ...], Mapping[str, float]], index_of: Mapping[str, int]
) -> dict[Entry, dict[str, float]]:
    """The answer's entries as job-index tuples (a pair's sorted), each with a copy of its
    shares; entries naming a job that has left are dropped. An answer of single jobs only, all
    still here (a policy that does not pack), is mapped in C: one look-up pass, the same dict
    in the same order as the loop."""
    if len(fractions) and set(map(len, fractions)) == {1}:
        indices = list(map(index_of.get, map(_FIRST, fractions)))
        if None not in indices:
            values = fractions.values()
            copy = dict.copy if set(map(type, values)) == {dict} else dict  # the same dicts, faster
            # Made frozen at once: _install keeps it as it is (a 20,000-entry dict copied is ~2 ms)
            return FrozenAllocation(zip(zip(indices), map(copy, values)))
    allocation: dict[Entry, dict[str, float]] = {}
    for job_ids, by_type in fractions.items():
        if len(job_ids) == 1:
            index = index_of.get(job_ids[0])
            if index is not None:
                allocation[(index,)] = dict(by_type)
        elif all(job_id in index_of for job_id in job_ids):
            allocation[tuple(sorted(index_of[j] for j in job_ids))] = dict(by_type)
    return allocation


def _column_entries(
    state: MechanismState, answer: AnswerColumns
) -> tuple[dict[Entry, dict[str, float]], tuple[np.ndarray, np.ndarray]] | None:
    """_answer_entries and allocation_columns of ``answer.fractions()``, from its arrays: the
    entries as job-index tuples (a pair's sorted) with their shares as dicts, in the answer's
    order, and the ledger rows and shares x the ledgers' types read from the arrays they came
    from (the same floats). None when the answer names a job that has left or the same entry
    twice (the general loop then decides, as for a reply)."""
    index_of = state.jobs.index_of
    count = len(answer.job_ids)
    index = np.fromiter(map(index_of.get, answer.job_ids, itertools.repeat(-1)), np.int64, count)
    if count and index.min() < 0:
        return None
    pairs = np.sort(index[answer.pair_members], axis=1) if len(answer.pair_members) else np.zeros((0, 2), np.int64)
    entries: list[Entry] = list(zip(index.tolist()))
    entries += zip(pairs[:, 0].tolist(), pairs[:, 1].tolist())
    if len(set(entries)) != len(entries):
        return None
    types = answer.types
    values = np.concatenate([answer.job_fractions, answer.pair_fractions]) if len(pairs) else answer.job_fractions
    allocation = dict(zip(entries, map(dict, map(zip, itertools.repeat(types), values.tolist()))))
    ledger_types = state.entries.types
    shares = np.zeros((len(entries), len(ledger_types)))
    column_of = {w: k for k, w in enumerate(types)}
    for k, w in enumerate(ledger_types):  # a type the answer does not name: 0.0 (share_matrix's)
        if w in column_of:
            shares[:, k] = values[:, column_of[w]]
    rows = np.fromiter(map(state.entries.row_of.get, entries, itertools.repeat(-1)), np.intp, len(entries))
    return allocation, (rows, shares)


def allocation_columns(state: MechanismState, allocation: Mapping[Entry, Mapping[str, float]]) -> tuple[np.ndarray, np.ndarray]:
    """The allocation's entries' ledger rows (-1: no ledger, its job left since the request) and
    their shares as rows x the ledgers' types (model.share_matrix), in the allocation's order."""
    count = len(allocation)
    rows = np.fromiter(map(state.entries.row_of.get, allocation, itertools.repeat(-1)), np.intp, count)
    return rows, share_matrix(list(allocation.values()), state.entries.types)


def _install(
    state: MechanismState, allocation: dict[Entry, dict[str, float]], columns: tuple[np.ndarray, np.ndarray]
) -> FrozenAllocation:
    """The allocation as the state keeps it (never changed in place), with its columnar copy in
    the ledgers for the planner's passes (``columns``: allocation_columns of it)."""
    installed = allocation if type(allocation) is FrozenAllocation else FrozenAllocation(allocation)
    rows, shares = columns
    kept = rows >= 0
    if not kept.all():  # entries of jobs gone since the request: no ledger to copy to
        rows, shares = rows[kept], shares[kept]
    state.entries.set_allocation(installed, rows, shares)
    return installed
