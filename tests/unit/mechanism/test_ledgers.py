"""The ledgers as columns (model.Ledgers): the mapping they stand in for (entry -> EntryLedger in
admission order, reads and writes through), holes left by removed jobs and their compaction,
pickling (and a snapshot whose ledgers were a dict), the installed allocation's columnar copy,
and the reset's arithmetic held to the plain per-cell loop."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import random

import pytest

from mechanism_service.core.model import EntryLedger, FrozenAllocation, Ledgers, MechanismState
from mechanism_service.core.reducers import apply_allocation, reset_ledgers, withdraw_job
from tests.unit.mechanism.builders import DEFAULT, GAVEL_PACKED, state
from tests.unit.mechanism.test_planning_fast import random_state

# test_planning_fast's random states, all 200 in both tiers (not its `make test` subset): ~0.3 s
SEEDS = range(200)


def plain(s: MechanismState) -> dict:
    return {e: (dict(ledger.throughputs), dict(ledger.received_s), dict(ledger.deficit_s)) for e, ledger in s.entries.items()}


def test_ledgers_read_and_write_through_in_admission_order():
    s = state(k80=2, v100=2).packing().job("a").job("b").job("a").build()  # (0,) (1,) (0,1) (2,) (0,2) (1,2)
    assert list(s.entries) == [(0,), (1,), (0, 1), (2,), (0, 2), (1, 2)]
    assert s.entries[(0, 1)] == EntryLedger({"k80": (0.5, 2.5), "v100": (2.0, 10.0)}, {"k80": 0.0, "v100": 0.0}, {"k80": 0.0, "v100": 0.0})
    s.entries[(1,)].received_s["v100"] = 7.5
    s.entries[(0, 2)].throughputs["k80"] = (0.0, 3.0)
    k80, v100 = s.entries.column_of["k80"], s.entries.column_of["v100"]
    assert s.entries.received_s[s.entries.row_of[(1,)], v100] == 7.5
    assert s.entries[(0, 2)].throughputs["k80"] == (0.0, 3.0)
    assert s.entries[(1,)].throughputs["k80"] == (10.0,)  # a single's value, once
    assert type(s.entries[(1,)].received_s["v100"]) is float
    assert s.entries.throughputs[s.entries.row_of[(1,)], k80].tolist() == [10.0, 10.0]
    with pytest.raises(KeyError):
        s.entries[(5,)]


def test_a_removed_job_leaves_holes_the_order_of_the_rest_kept_and_compaction_closes_them():
    s = state(k80=2).packing().jobs(4).build()
    before = plain(s)
    withdraw_job(s, 1)
    assert list(s.entries) == [e for e in before if 1 not in e]
    assert s.entries.rows == len(before) and len(s.entries) == len(before) - 4  # (1,) (0,1) (1,2) (1,3)
    assert [s.entries.keys[r] for r in range(s.entries.rows) if s.entries.live[r]] == list(s.entries)
    s.entries.compact()
    assert s.entries.rows == len(s.entries) and s.entries.keys == list(s.entries)
    assert plain(s) == {e: v for e, v in before.items() if 1 not in e}
    assert s.entries.entries_of(2) == [(2,), (0, 2), (2, 3)]


def test_many_removals_compact_by_themselves():
    s = state(k80=4).jobs(200).build()
    for index in range(150):
        withdraw_job(s, index)
    assert s.entries.rows < 200 and list(s.entries) == [(i,) for i in range(150, 200)]
    assert s.entries[(199,)].throughputs == {"k80": (1.0,)}


@pytest.mark.parametrize("seed", range(20))
def test_pickle_and_deepcopy_keep_the_live_rows_and_the_allocation_copy(seed):
    s = random_state(seed)
    apply_allocation(s, {s.job_ids_of(e): shares for e, shares in s.allocation.items()}, {}, DEFAULT)
    withdraw_job(s, next(iter(s.jobs)))
    kept = copy.deepcopy(s)
    loaded = pickle.loads(pickle.dumps(s, protocol=pickle.HIGHEST_PROTOCOL))
    assert kept.entries.allocation_of is kept.allocation  # the copy's matrix is the copy's allocation's
    assert loaded.entries.allocation_of is None  # a snapshot does not carry it: gathered again
    for copied in (kept, loaded):
        assert plain(copied) == plain(s) and list(copied.entries) == list(s.entries)
        assert copied.allocation == s.allocation
        matrix = copied.entries.allocation_matrix(copied.allocation)
        fresh = Ledgers(copied.entries.types)
        for e, ledger in copied.entries.items():
            fresh[e] = ledger
        assert matrix.tolist() == fresh.allocation_matrix(dict(copied.allocation)).tolist()


def test_a_snapshot_whose_ledgers_were_a_dict_loads_into_ledgers():
    s = state(k80=1, v100=1).packing().jobs(2).build()
    before = plain(s)
    values = {name: getattr(s, name) for name in MechanismState.__slots__}
    values["entries"] = {e: EntryLedger(*v) for e, v in before.items()}  # the form written before
    old = MechanismState.__new__(MechanismState)
    old.__setstate__((None, values))
    assert isinstance(old.entries, Ledgers) and plain(old) == before


def test_the_installed_allocation_is_never_changed_in_place():
    s = state(k80=1).jobs(2).build()
    apply_allocation(s, {("j0",): {"k80": 0.5}}, {}, DEFAULT)
    assert isinstance(s.allocation, FrozenAllocation) and s.allocation == {(0,): {"k80": 0.5}, (1,): {}}
    with pytest.raises(TypeError):
        s.allocation[(1,)] = {"k80": 0.5}
    assert pickle.loads(pickle.dumps(s.allocation)) == s.allocation


def reference_reset(s: MechanismState, now_s: float, seed_s: float) -> tuple[dict, dict]:
    """reset_ledgers as the plain loop it was: per type, per entry."""
    elapsed_s = now_s - s.last_reset_s
    deficits, totals = {}, {}
    for w in s.accelerator_types:
        total = 0.0
        for entry, ledger in s.entries.items():
            received = ledger.received_s[w] - seed_s
            target = s.allocation[entry].get(w, 0.0) * elapsed_s if entry in s.allocation else 0.0
            deficits[entry, w] = ledger.deficit_s[w] + (target - received)
            total += seed_s
        totals[w] = total
    return deficits, totals


@pytest.mark.parametrize("settings", [DEFAULT, GAVEL_PACKED])
def test_the_reset_is_the_plain_loop_to_the_bit(settings):
    for seed in SEEDS:
        s = random_state(seed)
        rng = random.Random(seed)
        if seed % 2:
            apply_allocation(s, {s.job_ids_of(e): shares for e, shares in s.allocation.items()}, {}, settings)
        now_s = s.last_reset_s + rng.uniform(0.0, 10**4)
        deficits, totals = reference_reset(s, now_s, settings.seed_s)
        reset_ledgers(s, now_s, settings)
        assert {(e, w): ledger.deficit_s[w] for e, ledger in s.entries.items() for w in s.gpus} == deficits, seed
        assert all(ledger.received_s == dict.fromkeys(s.gpus, settings.seed_s) for ledger in s.entries.values())
        assert s.type_time_s == totals


def test_a_state_pickles_its_jobs_as_columns_and_loads_them_as_they_were():
    s = state(k80=2, v100=1).packing().jobs(3).job("b", scale_factor=2).done(1, 40, failures=1, first_run_s=5.0).build()
    s.jobs[2].gpu_seconds_by_type["v100"] = 12.5
    s.completed.append(withdraw_job(s, 0))
    body = pickle.dumps(s, protocol=pickle.HIGHEST_PROTOCOL)
    assert b"JobColumns" in body and b"JobState" not in body  # no job pickled as an object
    for copied in (pickle.loads(body), copy.deepcopy(s)):
        assert list(copied.jobs.items()) == list(s.jobs.items()) and copied.completed == s.completed
        assert plain(copied) == plain(s)
        copied.jobs[1].steps_done += 1  # its own objects
        assert s.jobs[1].steps_done == 40
    empty = pickle.loads(pickle.dumps(state(k80=1).build()))
    assert (empty.jobs, empty.completed, len(empty.entries)) == ({}, [], 0)


def test_settling_credits_each_ledger_once_per_lease_in_settling_order_and_none_to_a_removed_entry():
    from tests.unit.mechanism.builders import GAVEL, lease
    from mechanism_service.core.reducers import settle_round

    s = state(k80=3).packing().job("a", steps=10**6).job("b", steps=10**6).job("a", steps=100).build()
    results = [
        lease((0,), "k80", (0,), (300,), 1000.1),
        lease((0,), "k80", (0,), (300,), 1000.7),  # the same entry twice (reported twice)
        lease((1, 2), "k80", (1,), (500, 100), 1000.3),  # job 2 finishes: the pair leaves with it
    ]
    settle_round(s, results, 0.0, GAVEL)
    assert s.entries[(0,)].received_s["k80"] == (180.0 + 1000.7) + 1000.1  # latest finish first
    assert (1, 2) not in s.entries and 2 not in s.jobs
    assert s.entries[(1,)].received_s["k80"] == 180.0
    assert s.type_time_s["k80"] == ((0.0 + 1000.7) + 1000.3) + 1000.1


def test_the_allocation_s_columns_are_its_shares_whether_every_row_names_every_type_or_not():
    s = state(k80=1, p100=1, v100=1).jobs(3).build()
    full = {("j0",): {"v100": 0.25, "k80": 0.5, "p100": 0.125}, ("j1",): {"k80": 1 / 3, "p100": 0.0, "v100": 0.1}}
    settings = dataclasses.replace(DEFAULT, steady_types_tolerance=None)  # the answer as given
    for answer in (full, {**full, ("j2",): {"p100": 0.7}}):
        apply_allocation(s, answer, {}, settings)
        matrix = s.entries.allocation_matrix(s.allocation)
        gathered = Ledgers(s.entries.types)
        for e, ledger in s.entries.items():
            gathered[e] = ledger
        assert matrix.tolist() == gathered.allocation_matrix(dict(s.allocation)).tolist()
        assert matrix[s.entries.row_of[(1,)], s.entries.column_of["k80"]] == 1 / 3


def members_of_keys(ledgers: Ledgers) -> list[list[int]]:
    """What ``members`` must hold: each row's first and last member, -1 for a removed row."""
    return [[e[0], e[-1]] if e is not None and ledgers.live[r] else [-1, -1] for r, e in enumerate(ledgers.keys[: ledgers.rows])]


def test_the_rows_members_follow_the_keys_through_growth_removal_compaction_and_snapshots():
    s = state(k80=2).packing().jobs(7).build()  # 28 rows: grown past the first 16
    assert s.entries.members[: s.entries.rows].tolist() == members_of_keys(s.entries)
    withdraw_job(s, 2)
    assert s.entries.members[: s.entries.rows].tolist() == members_of_keys(s.entries)  # holes: -1
    s.entries.compact()
    assert s.entries.members[: s.entries.rows].tolist() == members_of_keys(s.entries)
    assert (s.entries.members[s.entries.rows :] == -1).all()
    for copied in (copy.deepcopy(s), pickle.loads(pickle.dumps(s, protocol=pickle.HIGHEST_PROTOCOL))):
        assert copied.entries.members[: copied.entries.rows].tolist() == members_of_keys(copied.entries)
