"""The presets and what a policy's name switches (docs/gavel-semantics.md sections 1.6, 4, 5, 6.1)."""

from __future__ import annotations

import pytest

from mechanism_service.core.settings import MechanismSettings, default_preset, gavel_preset, preset


@pytest.mark.parametrize(
    ("policy", "packing", "only_allocated_run", "shuffle_type_order"),
    [
        ("fifo", False, True, True),
        ("fifo_perf", False, True, False),
        ("fifo_packed", True, True, False),
        ("isolated", False, False, True),
        ("max_min_fairness", False, False, True),
        ("max_min_fairness_perf", False, False, False),
        ("max_min_fairness_packed", True, False, False),
        ("finish_time_fairness", False, False, True),
        ("min_total_duration", False, False, True),
        ("min_total_duration_packed", True, False, False),
        ("max_sum_throughput_perf", False, False, False),
        ("gandiva", True, False, False),  # Gandiva_Packing
        ("allox", False, False, False),  # AlloX_Perf
        ("srtf", False, False, True),  # not Gavel's: agnostic, as its agnostic policies
        ("srtf_perf", False, False, False),
        ("tiresias", False, False, True),
        ("tiresias_perf", False, False, False),
        ("themis", False, False, True),
        ("themis_perf", False, False, False),
        ("optimus", False, False, True),
        ("optimus_perf", False, False, False),
        ("gandiva_ts", True, False, False),
    ],
)
def test_the_policy_name_sets_packing_fifos_rule_and_the_shuffle(
    policy, packing, only_allocated_run, shuffle_type_order
):
    settings = gavel_preset(policy)

    assert (settings.packing, settings.only_allocated_run, settings.shuffle_type_order) == (
        packing,
        only_allocated_run,
        shuffle_type_order,
    )


def test_the_gavel_preset_is_gavels_mechanism():
    assert gavel_preset("max_min_fairness_perf") == MechanismSettings(
        preset="gavel",
        round_s=360.0,
        min_reset_interval_s=1920.0,
        reset_quirk_at_zero=True,
        seed_received_s=None,  # half a round: 180 s
        run_unallocated=False,
        restore_s=0.0,
        max_gang_failures=5,
        round_start_from_previous_end=True,
        finishing_gang_fails=True,
        zero_fill_allocation=True,
        type_order=("v100", "p100", "k80"),
    )


def test_the_default_preset_resolves_at_once_runs_what_it_picks_and_charges_a_restore_it_avoids():
    assert default_preset("max_min_fairness_perf", gpus_per_server=2) == MechanismSettings(
        preset="default",
        gpus_per_server=2,
        min_reset_interval_s=0.0,
        reset_quirk_at_zero=False,
        run_unallocated=True,
        restore_s=20.0,
        round_start_from_previous_end=False,
        extensions_first=True,
        charge_moves=True,
        move_charge_restores=6.0,
        move_overhead_share=0.01,
        move_overshoot_moves=10.0,
        allocated_first=True,
        steady_types_tolerance=1e-4,
        catch_up_ratio=1.3,
    )


def test_the_default_preset_keeps_packed_and_agnostic_answers_as_the_policy_gives_them():
    for policy in ("max_min_fairness_packed", "max_min_fairness", "fifo"):
        assert default_preset(policy).steady_types_tolerance is None, policy
        assert default_preset(policy).allocated_first, policy
    assert default_preset("finish_time_fairness_perf").steady_types_tolerance == 1e-4


def test_gavel_seeds_half_a_round_whatever_the_round_length():
    """Sections 3 and 4: a new job and every entry at a reset get R/2 (time_per_iteration / 2);
    180 s only because the reference runs use R = 360 s. Gavel's driver defaults to R = 1920 s."""
    assert gavel_preset("max_min_fairness_perf", round_s=1920.0).seed_s == 960.0


def test_an_unknown_preset_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown preset 'fast' \(known: default, gavel\)"):
        preset("fast", "fifo")
