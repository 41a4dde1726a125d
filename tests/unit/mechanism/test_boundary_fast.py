"""A boundary's fast forms against their plain definitions on random states (docs/mechanism.md,
"A boundary at cluster scale"): settling (reducers.settle_round), installing an answer
(reducers.apply_allocation), fitting the holds (planning/holds.fit_held_columns against
migration.fit_held), the extensions kept, and model.share_matrix. The schedule must not change
by a bit, so every comparison is exact."""

from __future__ import annotations

import copy
import random
import types
from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import pytest

from mechanism_service.core.migration import fit_held, held_entries
from mechanism_service.core.model import Entry, FrozenAllocation, JobState, MechanismState, Placement, share_matrix
from mechanism_service.core.planning.holds import fit_held_columns
from mechanism_service.core.planning.placement import count_extensions, kept_entries
from mechanism_service.core.reducers import LeaseResult, apply_allocation, remove_job, settle_round
from mechanism_service.core.settings import MechanismSettings
from mechanism_service.core.stability import steady_allocation
from tests.support.seeds import sweep
from tests.unit.mechanism.builders import DEFAULT, GAVEL, GAVEL_PACKED, state
from tests.unit.mechanism.test_planning_fast import columnar_state

# 50 random states under `make test`, all 200 under `make test-deep` (tests/support/seeds.py)
SEEDS = sweep(200, 50)
pytestmark = pytest.mark.deep


# -- the plain definitions (the code as it was before it was made fast) -----------------------


def reference_settle_round(
    state: MechanismState, results: list[LeaseResult], round_start_s: float, settings: MechanismSettings
) -> list[JobState]:
    done: list[JobState] = []
    for result in sorted(results, key=lambda r: r.finish_s, reverse=True):
        members = [(i, steps) for i, steps in zip(result.entry, result.steps, strict=True) if i in state.jobs]
        if not members:
            continue
        for i, _ in members:
            state.jobs[i].last_finish_s = result.finish_s
        exec_s = result.finish_s - round_start_s
        scale_factor = state.jobs[members[0][0]].scale_factor
        if result.ended:
            if state.previous_assignment.get(result.entry) == result.placement:
                del state.previous_assignment[result.entry]
            _reference_credit(state, result, members, max(exec_s, 0.0), done)
            continue
        if any(steps < scale_factor for _, steps in members) or exec_s <= 0:
            state.needs_allocation = True
            # steps done and not credited: relaunched next round, not extended past them
            if any(steps for _, steps in members) and state.previous_assignment.get(result.entry) == result.placement:
                del state.previous_assignment[result.entry]
            if len(result.entry) == 1:
                job = state.jobs[members[0][0]]
                job.failures += 1
                if job.failures >= settings.max_gang_failures:
                    done.append(remove_job(state, job.index, dropped=True))
            continue
        for i, _ in members:
            state.jobs[i].failures = 0
        _reference_credit(state, result, members, exec_s, done)
    return done


def _reference_credit(state: MechanismState, result: LeaseResult, members: list[tuple[int, int]], exec_s: float,
                      done: list[JobState]) -> None:
    w = result.placement.accelerator_type
    share_s = exec_s * len(result.placement.worker_ids) / len(result.entry)
    for i, steps in members:
        job = state.jobs[i]
        job.steps_done += steps
        job.gpu_seconds_by_type[w] = job.gpu_seconds_by_type.get(w, 0.0) + share_s
    ledgers = state.entries
    row = ledgers.row_of.get(result.entry)
    if row is not None:
        ledgers.received_s[row, ledgers.column_of[w]] += exec_s
        state.type_time_s[w] += exec_s
    for i, _ in members:
        if state.jobs[i].steps_remaining <= 0:
            done.append(remove_job(state, i))


def reference_apply_allocation(
    state: MechanismState, fractions: Mapping[tuple[str, ...], Mapping[str, float]],
    isolated_throughputs: Mapping[str, float], settings: MechanismSettings,
) -> None:
    index_of = {job.job_id: index for index, job in state.jobs.items()}
    allocation: dict[Entry, dict[str, float]] = {}
    for job_ids, by_type in fractions.items():
        if len(job_ids) == 1:
            index = index_of.get(job_ids[0])
            if index is not None:
                allocation[(index,)] = dict(by_type)
        elif all(job_id in index_of for job_id in job_ids):
            allocation[tuple(sorted(index_of[j] for j in job_ids))] = dict(by_type)
    if settings.zero_fill_allocation:
        missing = state.entries.row_of.keys() - allocation.keys()
        for entry in state.entries if missing else ():
            if entry in missing:
                allocation[entry] = {}
    if settings.steady_types_tolerance is not None:
        allocation = steady_allocation(state, allocation, settings.steady_types_tolerance, settings.steady_max_split_jobs)
    installed = FrozenAllocation(allocation)
    view = state.entries.allocation[: state.entries.rows]
    view[:] = 0.0
    for entry, shares in allocation.items():  # row by row, type by type
        row = state.entries.row_of.get(entry)
        if row is not None:
            for w, share in shares.items():
                view[row, state.entries.column_of[w]] = share
    state.entries.allocation_of = installed
    state.allocation = installed
    state.needs_allocation = False
    for job in state.jobs.values():
        job.isolated_throughput_at_last_solve = isolated_throughputs.get(job.job_id)


# -- settling -----------------------------------------------------------------------------------


def random_results(s: MechanismState, rng: random.Random) -> list[LeaseResult]:
    """A lease for some entries (singles and pairs): steps some short of the gang, some that
    finish a job, some for a job that has left; finish times some before the round start; some
    leases crashed, lost or unreported."""
    results = []
    for entry in list(s.entries) + [(10**6,)]:  # the last: a job that has left
        if rng.random() < 0.4:
            continue
        w = rng.choice(list(s.gpus))
        members = [s.jobs.get(i) for i in entry]
        steps = tuple(
            rng.choice((0, 1, rng.randint(0, 500), job.steps_remaining if job else 5)) for job in members
        )
        placement = s.previous_assignment.get(entry) if rng.random() < 0.5 else None
        placement = placement or Placement(w, tuple(range(rng.choice((1, 2)))))
        ended = rng.choice(("", "", "", "crashed", "lost", "unreported"))
        results.append(LeaseResult(entry, placement, steps, rng.choice((900.0, 1000.0, rng.uniform(1000.0, 1400.0))), ended))
    return results


def settled(s: MechanismState) -> tuple[object, ...]:
    live = np.flatnonzero(s.entries.live[: s.entries.rows])
    return (
        s.jobs, s.completed, dict(s.type_time_s), s.previous_assignment, s.needs_allocation,
        [s.entries.keys[r] for r in live], s.entries.received_s[live].tolist(),
    )


def test_settling_is_the_plain_definition():
    """The leases' time added through the ledgers' memoryview (settle._ReceivedTime), rows
    looked up again after each removal."""
    removed = finished = 0
    for seed in SEEDS:
        rng = random.Random(seed)
        s = columnar_state(seed)
        for job in s.jobs.values():
            job.failures = rng.choice((0, 0, 1, 2))
        results = random_results(s, rng)
        settings = replace(GAVEL, max_gang_failures=rng.choice((1, 3)))
        plain = copy.deepcopy(s)
        done = settle_round(s, results, 1000.0, settings)
        assert done == reference_settle_round(plain, results, 1000.0, settings), seed
        assert settled(s) == settled(plain), seed
        removed += len(s.entries) < len(plain.entries) or len(done) > 0
        finished += any(j.last_finish_s is not None and j.steps_remaining <= 0 for j in done)
    # jobs completed and were dropped, rows moved (20 and 5 of 200 seeds, as many a seed in a subset)
    assert removed > len(SEEDS) // 10 and finished > len(SEEDS) // 40


def test_settling_while_removals_close_the_ledgers_holes():
    """Enough rows for a removal to compact the ledgers (their rows move) in mid-settle."""
    s = state(k80=200, v100=200).jobs(150, steps=100).type_time(k80=360.0, v100=360.0).settled().build()
    rng = random.Random(7)
    results = [
        LeaseResult((i,), Placement(rng.choice(("k80", "v100")), (i,)), (rng.choice((100, 100, 50)),), rng.uniform(1100.0, 1360.0))
        for i in range(150)
    ]
    plain = copy.deepcopy(s)
    done = settle_round(s, results, 1000.0, GAVEL)
    assert done == reference_settle_round(plain, results, 1000.0, GAVEL)
    assert settled(s) == settled(plain)
    assert 80 < len(done) < 140 and s.entries.rows < 150  # compacted on the way


# -- installing an answer -----------------------------------------------------------------------


def random_answer(s: MechanismState, rng: random.Random) -> dict[tuple[str, ...], Mapping[str, float]]:
    """The state's allocation as a policy would answer it: some entries left out, some naming a
    job that left, some mappings that are not dicts; for some seeds singles only."""
    answer: dict[tuple[str, ...], Mapping[str, float]] = {}
    singles_only = rng.random() < 0.5
    for entry in s.entries:
        if singles_only and len(entry) == 2:
            continue
        if rng.random() < 0.15:
            continue
        shares = {w: rng.choice((0.0, rng.random())) for w in s.gpus if rng.random() < 0.9}
        ids = s.job_ids_of(entry)
        answer[ids[::-1] if len(ids) == 2 and rng.random() < 0.5 else ids] = (
            types.MappingProxyType(shares) if rng.random() < 0.1 else shares
        )
    if rng.random() < 0.2:
        answer[("gone",)] = {w: 0.5 for w in s.gpus}
    return answer


def test_an_answer_is_installed_as_the_plain_definition_installs_it():
    for seed in SEEDS:
        rng = random.Random(seed)
        s = columnar_state(seed)
        for job in s.jobs.values():
            job.isolated_throughput_at_last_solve = rng.choice((None, 2.0))
        answer = random_answer(s, rng)
        baselines = {} if rng.random() < 0.5 else {s.jobs[i].job_id: rng.random() for i in s.jobs if rng.random() < 0.7}
        settings = rng.choice((DEFAULT, GAVEL_PACKED, replace(DEFAULT, zero_fill_allocation=False)))
        plain = copy.deepcopy(s)
        apply_allocation(s, answer, baselines, settings)
        reference_apply_allocation(plain, answer, baselines, settings)
        assert type(s.allocation) is FrozenAllocation, seed
        assert list(s.allocation.items()) == list(plain.allocation.items()), seed
        assert all(type(shares) is dict for shares in s.allocation.values()), seed
        assert allocation_rows(s) == allocation_rows(plain), seed  # (a copy's ledgers have no holes)
        assert s.jobs == plain.jobs, seed


def allocation_rows(s: MechanismState) -> dict[Entry, list[float]]:
    return {entry: s.entries.allocation[row].tolist() for entry, row in s.entries.row_of.items()}


def test_the_installed_shares_are_copies():
    s = columnar_state(3)
    answer = {s.job_ids_of(e): {w: 0.25 for w in s.gpus} for e in s.entries if len(e) == 1}
    apply_allocation(s, answer, {}, replace(GAVEL, zero_fill_allocation=False))
    for shares in answer.values():
        shares.clear()
    assert all(shares for shares in s.allocation.values())


def test_the_share_matrix_is_the_row_by_row_copy():
    rng = random.Random(0)
    kinds = ("k80", "p100", "v100")
    for _ in range(50):
        rows = [{w: rng.random() for w in kinds if rng.random() < 0.8} for _ in range(rng.randint(0, 6))]
        expected = [[shares.get(w, 0.0) for w in kinds] for shares in rows]
        assert share_matrix(rows, kinds).tolist() == expected


# -- holds and extensions -----------------------------------------------------------------------


def test_holds_fit_on_columns_as_the_plain_form_fits_them():
    fitted = refused = 0
    for seed in SEEDS:
        rng = random.Random(seed)
        s = columnar_state(seed)
        for job in s.jobs.values():
            job.first_run_s = rng.choice((None, 0.0, 360.0))
        s.gpus = {w: rng.choice((0, 1, 2, 4)) for w in s.gpus}
        held = held_entries(s, s.last_reset_s + 360.0, DEFAULT)
        reserved = [(e, w) for e, w in held if rng.random() < 0.2]
        assert fit_held_columns(s, held, reserved) == fit_held(s, held, reserved), seed
        fitting = fit_held(s, held, reserved)
        fitted += len(fitting)
        refused += len(held) - len(reserved) - len(fitting)
    assert fitted > len(SEEDS) // 40 and refused > len(SEEDS) // 40  # holds that fit and holds that did not (5 of 200)


def test_kept_entries_are_those_placed_where_they_ran():
    s = columnar_state(1)
    entries = list(s.entries)
    s.previous_assignment = {entries[0]: Placement("k80", (0,)), entries[1]: Placement("v100", (1,))}
    assignment = {
        entries[0]: s.previous_assignment[entries[0]],  # the same object
        entries[1]: Placement("v100", (1,)),  # an equal one
        entries[2]: Placement("k80", (2,)),
    }
    assert kept_entries(s, assignment) == frozenset(entries[:2])
    assert count_extensions(s, assignment)[0] == 2
