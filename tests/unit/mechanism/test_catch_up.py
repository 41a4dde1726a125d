"""Jobs that fall behind (core/catch_up.py, docs/mechanism.md "What a move costs"): which jobs
are behind, and that the move charge and the holds then leave them be, in every form the
planner runs (rows, numpy columns, lists) and in a whole round."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from common.errors import ConfigError
from mechanism_service.core.catch_up import behind_jobs, late_singles, steps_late
from mechanism_service.core.migration import charge_moves, fit_held
from mechanism_service.core.model import MechanismState, Placement
from mechanism_service.core.planning.holds import fit_held_columns
from mechanism_service.core.planning.ledger_reads import ledger_lists
from mechanism_service.core.planning.priority import charge_move_columns, priority_columns, priority_rows, queue_lists
from mechanism_service.core.rounds import open_round
from mechanism_service.core.settings import MechanismSettings
from tests.unit.mechanism.builders import DEFAULT, GAVEL, no_shuffle, state
from tests.unit.mechanism.test_planning_fast import as_rows
from tests.unit.mechanism.test_planning_lists import varied

# test_planning_lists's random states, all 200 in both tiers (not its `make test` subset): ~0.4 s in
# all, and a job behind taking a held GPU is rare (with 50 seeds it happened once)
SEEDS = range(200)

OFF = replace(DEFAULT, catch_up_ratio=None)



def owed_state(steps: int) -> MechanismState:
    """Type a: 1 step/s on k80, 4 on v100. One reset at 0; job 0 is owed 300 s on v100 from
    before it; job 1 ran a whole round on k80 since."""
    return (
        state(k80=1, v100=1)
        .jobs(2, steps=steps)
        .allocate((0,), k80=0.5, v100=0.5)
        .allocate((1,), k80=0.5, v100=0.5)
        .deficit((0,), v100=300.0)
        .received((1,), k80=180.0 + 360.0)
        .reset_at(0.0)
        .build()
    )


def test_the_steps_a_job_is_late_by_count_what_it_is_owed_and_the_round_it_may_wait():
    # at 360 s, job 0: k80 (0.5 x 360 + 180) x 1 = 360 steps, v100 (300 + 180 + 180) x 4 = 2,640;
    # job 1 ran where the allocation gives it half: k80 (180 - 360 + 180) x 1 = 0, v100 360 x 4
    assert steps_late(owed_state(10_000), 360.0, DEFAULT) == {0: 3000.0, 1: 1440.0}


@pytest.mark.parametrize(("steps", "behind"), [(9_999, True), (10_001, False)])
def test_a_job_is_behind_when_its_late_steps_pass_the_bound_share_of_its_work(steps, behind):
    """1.3: late by more than 30% of its steps (job 0: 3,000 steps late)."""
    assert behind_jobs(owed_state(steps), 360.0, DEFAULT) == ({0} if behind else set())


def test_no_bound_no_job_behind_and_gavels_mechanism_has_none():
    assert behind_jobs(owed_state(1), 360.0, OFF) == frozenset()
    assert GAVEL.catch_up_ratio is None
    assert DEFAULT.catch_up_ratio == 1.3


def test_a_pair_is_owed_to_each_member_at_its_own_rate_in_the_pair():
    """Pair (a, a) on k80 runs its members at 0.5 and 0.25 steps/s; the singles are owed nothing."""
    s = (
        state(k80=1)
        .packing()
        .jobs(2, steps=1000)
        .allocate((0, 1), k80=1.0)
        .received((0, 1), k80=180.0)
        .reset_at(0.0)
        .build()
    )

    # (360 s owed + the 360 s round) x 0.5 and x 0.25
    assert steps_late(s, 360.0, DEFAULT) == {0: 360.0, 1: 180.0}
    assert behind_jobs(s, 360.0, DEFAULT) == {0}  # 360 > 30% of 1,000; 180 is not


def test_time_run_where_the_allocation_gives_nothing_counts_as_work_done():
    s = state(k80=1, p100=1, v100=1).job(steps=10_000).allocate((0,), k80=0.5, v100=0.5).reset_at(0.0).build()
    before = steps_late(s, 360.0, DEFAULT)[0]
    s.entries[(0,)].received_s["p100"] = 180.0 + 360.0  # a round on p100 (2 steps/s), allocated nothing

    assert steps_late(s, 360.0, DEFAULT)[0] == pytest.approx(before - 720.0)


def plain_steps_late(s: MechanismState, now_s: float, settings: MechanismSettings) -> dict[int, float]:
    """The definition, an entry, a type and a member at a time."""
    late: dict[int, float] = {}
    for entry, ledger in s.entries.items():
        shares = s.allocation.get(entry, {})
        for w in s.entries.types:
            share = shares.get(w, 0.0)
            owed_s = ledger.deficit_s[w] + share * (now_s - s.last_reset_s) - (ledger.received_s[w] - settings.seed_s)
            for member, rate in zip(entry, ledger.throughputs[w]):
                late[member] = late.get(member, 0.0) + (owed_s + share * settings.round_s) * rate
    return late


def test_steps_late_are_the_plain_definition_on_random_states():
    for seed in SEEDS:
        s, settings = varied(seed)
        now_s = s.last_reset_s + random.Random(seed).uniform(0.0, 3600.0)
        expected = plain_steps_late(s, now_s, settings)
        assert steps_late(s, now_s, settings) == pytest.approx(expected, rel=1e-9, abs=1e-6), seed


def test_with_singles_only_the_kept_columns_give_the_columns_floats_and_their_bound():
    """catch_up._behind_singles (every entry a single: the simulator's rounds unless it packs),
    its rows, shares, deficits and rates kept in the ledgers between rounds, against
    steps_late_columns on all rows, to the bit; each seed's ratio splits its jobs in two."""
    split = 0
    for seed in SEEDS:
        s, settings = varied(seed)
        for entry in [e for e in s.entries if len(e) == 2]:
            del s.entries[entry]  # (the pairs' rows become holes)
        rng = random.Random(seed)
        now_s = s.last_reset_s + rng.uniform(0.0, 3600.0)
        expected = steps_late(s, now_s, settings)
        ratio = 1.0 + max(1e-6, sorted(late / s.jobs[j].total_steps for j, late in expected.items())[len(expected) // 2])
        settings = replace(settings, catch_up_ratio=ratio)
        behind = behind_jobs(s, now_s, settings)  # (the first call keeps the columns; the second reads them)
        for _ in range(2):
            indices, late, _ = late_singles(s, now_s, settings, ratio - 1.0)
            assert dict(zip(indices.tolist(), late.tolist())) == expected, seed
        assert behind == {j for j, late in expected.items() if late > (ratio - 1.0) * s.jobs[j].total_steps}, seed
        split += 0 < len(behind) < len(s.jobs)
    assert split > 50


def random_behind(s: MechanismState, seed: int, share: float = 0.3) -> frozenset[int]:
    rng = random.Random(seed + 99)
    return frozenset(j for j in s.jobs if rng.random() < share)


def test_an_entry_with_a_member_behind_is_charged_nothing_on_rows_columns_and_lists():
    spared = 0
    for seed in SEEDS:
        s, settings = varied(seed)
        settings = replace(settings, charge_moves=True)
        behind = random_behind(s, seed)
        plain = priority_rows(s)
        charged = charge_moves(s, plain, settings)
        rows = charge_moves(s, plain, settings, behind)
        for w, queue in rows.items():
            for row, uncharged, charged_row in zip(queue, plain[w], charged[w]):
                if behind.isdisjoint(row[0]):
                    assert row == charged_row, seed
                else:
                    assert row == uncharged, seed
                    spared += charged_row != uncharged
        assert as_rows(s, charge_move_columns(s, priority_columns(s), settings, behind)) == rows, seed
        lists = queue_lists(s, settings, ledger_lists(s), behind)  # type: ignore[arg-type]
        for k, w in enumerate(s.entries.types):
            keys = lists.column(k).sort_keys
            by_entry = {row[0]: row[1:3] for row in rows[w]}
            for r, key in enumerate(keys):
                if key is not None:
                    assert key[:2] == by_entry[s.entries.keys[r]], (seed, w)  # type: ignore[index]
    assert spared > 20  # the charge would have lowered these priorities


def test_holds_leave_room_for_a_job_behind_that_no_held_entry_runs():
    s = state(k80=2, v100=1).jobs(4).allocate((3,), k80=0.5).build()
    for job in s.jobs.values():
        job.first_run_s = 0.0  # every job ran: no newcomer
    held = [((0,), "k80"), ((1,), "k80"), ((2,), "v100")]

    assert fit_held(s, held, []) == held
    assert fit_held(s, held, [], frozenset({3})) == [((0,), "k80"), ((2,), "v100")]  # a k80 left for job 3
    assert fit_held(s, held, [], frozenset({0})) == held  # job 0 behind, and held: it runs anyway


def test_holds_fitted_around_jobs_behind_alike_on_rows_columns_and_lists():
    fitted = 0
    for seed in SEEDS:
        s, _ = varied(seed)
        rng = random.Random(seed)
        s.gpus = {w: rng.choice((1, 2, 4)) for w in s.gpus}
        held = [(e, w) for e, w in ((e, rng.choice(list(s.gpus))) for e in s.entries) if rng.random() < 0.2]
        behind = random_behind(s, seed, 0.5)
        expected = fit_held(s, held, [], behind)
        assert fit_held_columns(s, held, [], ledger_lists(s), behind) == expected, seed
        assert fit_held_columns(s, held, [], None, behind) == expected, seed
        fitted += len(fit_held(s, held, [])) - len(expected)
    assert fitted > 5  # jobs behind took GPUs from holds


def waiting_state(received_s: float, stretch_rounds: int) -> MechanismState:
    """One k80. Job 0 ran on it last round (received 540 of the type's 720 s); job 1 ran before
    and waits, owed 2,000 s (a 5,000-step job: behind at 1.3)."""
    s = (
        state(k80=1)
        .job(steps=10**6)
        .job(steps=5000)
        .allocate((0,), k80=0.5)
        .allocate((1,), k80=0.5)
        .type_time(k80=720.0)
        .received((0,), k80=540.0)
        .received((1,), k80=received_s)
        .deficit((1,), k80=2000.0)
        .reset_at(0.0)
        .settled()
        .ran((0,), "k80", 0)
        .done(0, 0, first_run_s=0.0)
        .done(1, 0, first_run_s=0.0)
        .build()
    )
    s.stretch_rounds = {(0,): stretch_rounds}
    return s


@pytest.mark.parametrize(
    ("received_s", "stretch_rounds"),
    [
        # job 0 moved last round (held); job 1's priority 0.5 / (180 / 720) = 2 beats job 0's 2/3
        pytest.param(180.0, 1, id="held"),
        # job 0's stretch has paid (6 rounds); job 1's priority 0.8, charged 6 restores (120 of
        # 360 s): 0.53, below job 0's 2/3
        pytest.param(450.0, 6, id="charged"),
    ],
)
def test_a_job_behind_is_neither_kept_waiting_by_a_hold_nor_outranked_by_its_moves_charge(received_s, stretch_rounds):
    assert behind_jobs(waiting_state(received_s, stretch_rounds), 360.0, DEFAULT) == {1}

    kept = open_round(waiting_state(received_s, stretch_rounds), 360.0, OFF, no_shuffle)
    caught_up = open_round(waiting_state(received_s, stretch_rounds), 360.0, DEFAULT, no_shuffle)

    assert kept.assignment == {(0,): Placement("k80", (0,))}
    assert caught_up.assignment == {(1,): Placement("k80", (0,))}


@pytest.mark.parametrize("ratio", [1.0, 0.5])
def test_a_bound_at_or_below_one_is_refused(ratio):
    with pytest.raises(ConfigError, match="catch_up_ratio"):
        MechanismSettings(catch_up_ratio=ratio)
