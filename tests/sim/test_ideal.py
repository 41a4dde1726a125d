"""`gavel simulate --ideal`, the fluid run (sim/ideal.py; issue 26, item 4).

What is asserted, and why (docs/simulator.md, "The fluid bound"):
- a hand-checked case: two jobs on one V100 under max-min fairness and FIFO, the completion times
  worked out by hand for processor sharing and for first come, first served;
- the bound: on a trace with continuous arrivals, every real run (three policies, both presets)
  has an average JCT at or above the fluid run of the same policy and preset. The real run
  realises the same policy's allocation late and lossily: an arrival waits for the next round
  boundary, a job that ends mid-round leaves its GPUs idle until the boundary, a moved job pays
  its restore, whole GPUs cannot realise 0.37 of one. Only the average is claimed: per job the
  real run finishes some jobs sooner (time slicing finishes a job a round ahead of processor
  sharing; the mechanism fills GPUs a max-min allocation leaves idle), asserted below too;
- where it is no bound: a static trace (every job at t = 0, many sharing each GPU) under max-min
  fairness, where those gains outweigh the losses. Asserted, so the docs' account stays true.
"""

from __future__ import annotations

import dataclasses

import pytest

from sim.ideal import simulate_ideal
from sim.metrics import summarize
from sim.scenario import Scenario, generated_trace, load_context, run_policy
from sim.traces import TraceJob, read_trace
from tests.support.data import REFERENCE

CONTEXT = load_context(None)
JOB_TYPE = "ResNet-50 (batch size 64)"
HOUR_S = 3600.0


def one_hour_job(job_id: str, arrival_s: float) -> TraceJob:
    steps_per_s = CONTEXT.table.isolated_steps_per_s[(JOB_TYPE, 1, "v100")]
    return TraceJob(job_id, JOB_TYPE, total_steps=round(steps_per_s * HOUR_S), scale_factor=1, arrival_time_s=arrival_s)


def jcts_h(result) -> dict[str, float]:
    return {j.job_id: j.jct_s / HOUR_S for j in result.jobs}


@pytest.mark.parametrize(
    ("policy", "expected_h"),
    [
        # A alone for 0.5 h (half its work), then each at half speed: A's last half takes 1 h (t = 1.5 h),
        # by then B has half its work done and finishes alone at full speed at t = 2 h
        ("max_min_fairness_perf", {"A": 1.5, "B": 1.5}),
        ("fifo_perf", {"A": 1.0, "B": 1.5}),  # A to the end at t = 1 h, then B for its hour
    ],
)
def test_two_jobs_on_one_gpu_progress_as_worked_out_by_hand(policy, expected_h):
    trace = (one_hour_job("A", 0.0), one_hour_job("B", 0.5 * HOUR_S))
    scenario = Scenario(trace, {"v100": 1})
    result = simulate_ideal(trace, scenario.config(policy), CONTEXT)
    steps = trace[0].total_steps
    assert jcts_h(result) == pytest.approx(expected_h, rel=1e-4)  # steps are whole: the hour is to 1e-4
    assert result.makespan_s / HOUR_S == pytest.approx(2.0, rel=1e-4)
    summary = summarize(result, CONTEXT.prices_per_hour)
    assert summary.cluster_utilization == pytest.approx(1.0)  # the GPU is never idle in the fluid run
    assert all(j.steps_done == steps for j in result.jobs)


def test_an_idle_cluster_waits_for_the_next_arrival():
    trace = (one_hour_job("A", 0.0), one_hour_job("B", 5 * HOUR_S))  # idle from 1 h to 5 h
    result = simulate_ideal(trace, Scenario(trace, {"v100": 1}).config("max_min_fairness_perf"), CONTEXT)
    assert jcts_h(result) == pytest.approx({"A": 1.0, "B": 1.0}, rel=1e-4)
    assert result.makespan_s / HOUR_S == pytest.approx(6.0, rel=1e-4)
    assert summarize(result, CONTEXT.prices_per_hour).cluster_utilization == pytest.approx(2 / 6, rel=1e-4)
    assert result.resets == 2  # a solve per arrival; none while the cluster is empty


def test_an_answer_that_expires_is_solved_again_when_it_does():
    """Tiresias (thresholds of 3,600 GPU-s): A (2 h of work) alone from t = 0, B (1 h) from 0.5 h.
    Both in the first queue, A first (FIFO) until it has 3,600 GPU-s at t = 1 h, which its answer
    says (valid_for_s): solved again then, A drops a queue and B runs its hour to t = 2 h, then A its
    last hour to t = 3 h. No arrival or completion happens at t = 1 h: only the expiry re-solves."""
    a, b = one_hour_job("A", 0.0), one_hour_job("B", 0.5 * HOUR_S)
    a = dataclasses.replace(a, total_steps=2 * a.total_steps)
    result = simulate_ideal((a, b), Scenario((a, b), {"v100": 1}).config("tiresias_perf"), CONTEXT)
    assert jcts_h(result) == pytest.approx({"A": 3.0, "B": 1.5}, rel=1e-4)


def runs(trace, policy: str, preset: str):
    scenario = Scenario(trace, {"v100": 4, "p100": 4, "k80": 4}, preset)
    real, real_summary = run_policy(policy, scenario, CONTEXT)
    ideal, ideal_summary = run_policy(policy, Scenario(trace, scenario.cluster, preset, engine="ideal"), CONTEXT)
    return real, real_summary, ideal, ideal_summary


@pytest.mark.slow
def test_every_real_run_of_a_continuous_trace_stays_above_the_fluid_run_on_average():
    """12 runs of 80 jobs (6 real, 6 fluid): about 15 s."""
    trace = generated_trace(80, 3.0, False, 0, CONTEXT.table)
    faster_in_real = {}
    for policy in ("max_min_fairness_perf", "finish_time_fairness_perf", "fifo_perf"):
        for preset in ("default", "gavel"):
            real, real_summary, ideal, ideal_summary = runs(trace, policy, preset)
            assert real_summary.jobs_completed == ideal_summary.jobs_completed == len(trace)
            assert real_summary.avg_jct_s > ideal_summary.avg_jct_s, (policy, preset)
            ideal_jct = {j.job_id: j.jct_s for j in ideal.jobs}
            faster_in_real[policy, preset] = sum(j.jct_s < ideal_jct[j.job_id] for j in real.jobs)
    # not a per-job bound: under max-min fairness some jobs finish sooner in rounds than fluid
    assert faster_in_real["max_min_fairness_perf", "default"] > 0
    assert faster_in_real["max_min_fairness_perf", "gavel"] > 0


def test_a_static_trace_under_max_min_fairness_is_where_rounds_beat_the_fluid_run():
    """Gavel's 32-job static trace on 4:4:4 (every job at t = 0): 2 runs, about 1 s."""
    trace = read_trace(REFERENCE / "static_n32_seed0.trace")
    _, real_summary, _, ideal_summary = runs(trace, "max_min_fairness_perf", "default")
    assert real_summary.avg_jct_s < ideal_summary.avg_jct_s
    # the mechanism fills GPUs the max-min allocation leaves idle: more work done per hour
    assert real_summary.cluster_utilization > ideal_summary.cluster_utilization


def test_simulate_ideal_refuses_what_the_fluid_run_has_not(capsys):
    from services.cli import main

    base = ["simulate", "--jobs", "5", "--static", "--cluster", "4:4:4", "--policy", "fifo_perf", "--ideal", "--no-plots"]
    assert main([*base, "--engine", "services"]) == 2
    assert "--ideal: cannot go with --engine" in capsys.readouterr().err
    assert main([*base, "--estimator", "learned"]) == 2
    assert "--ideal: cannot go with --estimator" in capsys.readouterr().err
    # nor a seam: the fluid run admits every job and places none (it would run without them)
    for flags in (["--admission", "load"], ["--placement", "spread"], ["--launch-param", "k=v"]):
        assert main([*base, *flags]) == 2
        assert f"--ideal: cannot go with {flags[0].removesuffix('-param')}" in capsys.readouterr().err
    # nor how the rounds charge a job's moves: it has no rounds (the ratio was taken and ignored)
    assert main([*base, "--catch-up-ratio", "2"]) == 2
    assert "--ideal: cannot go with --catch-up-ratio" in capsys.readouterr().err
    # nor the rounds' length or skipping, nor servers: it has no rounds and places no job
    for flags in (["--round-s", "60"], ["--no-skip-quiet-rounds"], ["--gpus-per-server", "4"]):
        assert main([*base, *flags]) == 2
        assert f"--ideal: cannot go with {flags[0]}" in capsys.readouterr().err
