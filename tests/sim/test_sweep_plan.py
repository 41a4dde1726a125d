"""The sweep's rates (sim/sweep_plan.py): Gavel's -a/-b/-n interval, its cutoff file, and its
automatic search for saturation (-u), on hand-checked cases."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from sim.sweep_plan import (
    Figures,
    RangeError,
    SweepPlan,
    evenly_spaced_rates,
    parse_cutoffs,
    saturation_next,
)

GAVEL_CLUSTER = {"v100": 2, "p100": 2, "k80": 2}


def read_cluster(key: str) -> dict[str, int]:
    """Enough of parse_cluster for these keys: Gavel's V:P:K or ours."""
    if "=" in key:
        return {k: int(v) for k, v in (part.split("=") for part in key.split(","))}
    v, p, k = (int(x) for x in key.split(":"))
    return {w: n for w, n in (("v100", v), ("p100", p), ("k80", k)) if n}


def test_an_interval_is_numpy_linspace_without_a_leading_zero_as_gavel():
    assert evenly_spaced_rates(0, 10, 5) == (2.5, 5.0, 7.5, 10.0)  # 0 dropped: no arrivals at all
    assert evenly_spaced_rates(1, 3, 3) == (1.0, 2.0, 3.0)
    assert evenly_spaced_rates(2, 2, 1) == (2.0,)
    assert evenly_spaced_rates(0.5, 7.5, 20) == tuple(float(r) for r in np.linspace(0.5, 7.5, 20))


@pytest.mark.parametrize(
    ("start", "stop", "count", "flag"),
    [(-1, 3, 3, "--rate-start"), (1, 0, 3, "--rate-stop"), (1, 3, 0, "--rate-count"), (3, 1, 4, "--rate-stop"),
     (0, 1, 1, "--rate-count")],
)
def test_an_interval_that_cannot_be_met_names_its_flag(start, stop, count, flag):
    with pytest.raises(RangeError) as e:
        evenly_spaced_rates(start, stop, count)
    assert e.value.flag == flag


def test_cutoffs_are_gavels_file_for_this_cluster_in_either_form():
    text = json.dumps({"2:2:2": {"fifo": 4, "max_min_fairness_perf": 9.5}, "4:4:4": {"fifo": 1}})
    assert parse_cutoffs(text, GAVEL_CLUSTER, read_cluster) == {"fifo": 4.0, "max_min_fairness_perf": 9.5}
    ours = json.dumps({"v100=2,p100=2,k80=2": {"fifo": 3}})
    assert parse_cutoffs(ours, GAVEL_CLUSTER, read_cluster) == {"fifo": 3.0}
    assert parse_cutoffs(json.dumps({"1:1:1": {"fifo": 3}}), GAVEL_CLUSTER, read_cluster) == {}


@pytest.mark.parametrize(
    ("text", "said"),
    [("{", "not JSON"), ("[1]", "expected an object"), ('{"2:2:2": 4}', "expected an object of policy"),
     ('{"2:2:2": {"fifo": -1}}', "expected a rate > 0"), ('{"2:2:2": {"fifo": true}}', "expected a rate > 0"),
     ('{"2:x:2": {"fifo": 1}}', "cluster '2:x:2'")],
)
def test_a_bad_cutoff_file_says_what_is_wrong(text, said):
    with pytest.raises(RangeError) as e:
        parse_cutoffs(text, GAVEL_CLUSTER, read_cluster)
    assert e.value.flag == "--cutoffs" and said in e.value.reason


def test_a_fixed_plan_asks_every_cell_below_its_policys_cutoff_and_not_what_is_known():
    plan = SweepPlan(("fifo", "las"), (0, 1), rates=(2.0, 4.0, 8.0), cutoffs={"fifo": 4.0})
    assert plan.cut() == (("fifo", 4.0), ("fifo", 8.0))
    assert plan.needed({}) == (
        ("fifo", 2.0, 0, ""), ("las", 2.0, 0, ""), ("las", 4.0, 0, ""), ("las", 8.0, 0, ""),
        ("fifo", 2.0, 1, ""), ("las", 2.0, 1, ""), ("las", 4.0, 1, ""), ("las", 8.0, 1, ""),
    )
    known = {("las", 4.0, 0, ""): Figures(3600.0, 0.5), ("fifo", 2.0, 1, ""): Figures(None, None, failed=True)}
    assert ("las", 4.0, 0, "") not in plan.needed(known) and ("fifo", 2.0, 1, "") not in plan.needed(known)
    assert len(plan.needed(known)) == 6


def test_a_plan_with_variants_asks_each_cell_once_per_variant_and_each_variant_its_own_search():
    fixed = SweepPlan(("fifo",), (0,), rates=(2.0, 4.0), cutoffs={"fifo": 4.0}, options=("a", "b"))
    assert fixed.needed({}) == (("fifo", 2.0, 0, "a"), ("fifo", 2.0, 0, "b"))  # the cutoff holds for each
    assert fixed.needed({("fifo", 2.0, 0, "a"): Figures(3600.0, 0.5)}) == (("fifo", 2.0, 0, "b"),)
    search = SweepPlan(("fifo",), (0,), until_utilization=0.9, options=("a", "b"))
    first = 3600 / 32768
    known = {("fifo", first, 0, "a"): Figures(3600.0, 0.2)}  # only a's first cell is known
    assert search.needed(known) == (("fifo", first * 2, 0, "a"), ("fifo", first, 0, "b"))


def walk(threshold, utilization, jct_h, cutoff=None, fail_at=None):
    """Run the search against a model of the cluster: the rates it asks for, in order."""
    results: dict[float, Figures] = {}
    asked = []
    while (rate := saturation_next(results.get, threshold, cutoff)) is not None:
        assert rate not in results and len(asked) < 100
        asked.append(rate)
        jct = jct_h(rate)
        results[rate] = Figures(None if jct is None else jct * 3600, utilization(rate), failed=rate == fail_at)
    return asked


def test_the_search_doubles_finds_the_knee_and_goes_past_it_until_the_jct_spreads_tenfold():
    # utilisation = rate (saturated at 0.5 jobs/h and above); JCT 1 h below 0.5 jobs/h, 100 h above
    asked = walk(0.5, lambda r: min(r, 1.0), lambda r: 1.0 if r < 0.5 else 100.0)
    # (1) one job every 32768 s, halved until saturated: 16384, 8192, 4096 (0.88 jobs/h)
    doubling = [3600 / 32768, 3600 / 16384, 3600 / 8192, 3600 / 4096]
    # (2) between 8192 s and 4096 s in 9 steps of 455.1 s: 7736.9 (0.465), 7281.8 (0.494), 6826.7 (0.527: the knee)
    knee_s = 8192 - 3 * 4096 / 9
    knee = [3600 / (8192 - 4096 / 9), 3600 / (8192 - 2 * 4096 / 9), 3600 / knee_s]
    # (3) 5% shorter than the knee: the JCTs seen span 1 h to 100 h, the search is over
    assert asked == pytest.approx([*doubling, *knee, 3600 / (knee_s * 0.95)], rel=1e-12)


def test_the_search_goes_19_steps_past_the_knee_at_most_where_gavel_would_loop_forever():
    asked = walk(0.5, lambda r: min(r, 1.0), lambda r: 1.0)  # the JCT never spreads
    # 4 doublings, 3 knee points, 19 steps past the knee of which the 8th (0.6 x 6826.7 s = 4096 s)
    # is the saturated doubling's cell: its result is read, not run again
    assert len(asked) == 4 + 3 + 19 - 1
    assert 3600 / ((8192 - 3 * 4096 / 9) * (1 - 8 * 0.05)) == 3600 / 4096
    assert asked[-1] == pytest.approx(3600 / ((8192 - 3 * 4096 / 9) * (1 - 19 * 0.05)))


def test_the_search_ends_at_a_cluster_that_never_saturates_a_cutoff_or_a_failed_cell():
    never = walk(0.98, lambda r: 0.1, lambda r: 1.0)
    assert len(never) == 25 and never[-1] == pytest.approx(3600 / 32768 * 2**24)
    assert walk(0.5, lambda r: min(r, 1.0), lambda r: 1.0, cutoff=0.3) == pytest.approx([3600 / 32768, 3600 / 16384])
    assert walk(0.5, lambda r: min(r, 1.0), lambda r: 1.0, fail_at=3600 / 16384) == pytest.approx([3600 / 32768, 3600 / 16384])


def test_a_cell_where_no_job_completed_counts_as_an_infinite_jct():
    # saturated at once: the knee search runs from 65536 s down to 32768 s and its first point
    # saturates too; the first step past that knee completes nothing either: spread infinite
    asked = walk(0.5, lambda r: 1.0, lambda r: None)
    knee_s = 65536 - 32768 / 9
    assert asked == pytest.approx([3600 / 32768, 3600 / knee_s, 3600 / (knee_s * 0.95)], rel=1e-12)


def test_a_saturated_cell_goes_on_with_the_search_as_gavels_timed_out_run_does():
    """A cell whose window never finished (SweepCellFinished.saturated) is, as Gavel's sweep
    records a run its timeout stopped, an infinite JCT at utilisation 1.0: saturated in step 1
    and the knee, and an infinite spread past it, where a failed cell would end the search."""
    def figures(rate):
        return Figures(math.inf, 1.0) if rate >= 0.5 else Figures(3600.0, min(rate, 1.0))

    results: dict[float, Figures] = {}
    asked = []
    while (rate := saturation_next(results.get, 0.5)) is not None:
        asked.append(rate)
        results[rate] = figures(rate)
    assert asked == pytest.approx(walk(0.5, lambda r: 1.0 if r >= 0.5 else min(r, 1.0), lambda r: None if r >= 0.5 else 1.0))
    assert len(asked) == 4 + 3 + 1 and results[asked[-1]].avg_jct_s == math.inf


def test_a_search_plan_asks_the_next_cell_of_each_policy_and_seed():
    plan = SweepPlan(("fifo", "las"), (0, 1), until_utilization=0.9)
    first = 3600 / 32768
    assert plan.needed({}) == (("fifo", first, 0, ""), ("las", first, 0, ""), ("fifo", first, 1, ""), ("las", first, 1, ""))
    known = {("fifo", first, 0, ""): Figures(3600.0, 0.2)}
    assert plan.needed(known)[0] == ("fifo", 3600 / 16384, 0, "")
