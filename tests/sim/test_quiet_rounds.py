"""Quiet rounds advanced without planning (sim/quiet.py, sim/quiet_advance.py) change nothing:
every policy under both presets, on traces with long quiet stretches and on busy ones, gives
the same result with the skip on and off, to the bit: every job's outcome, every round's
record, the resets, the makespan and the summary; and `gavel simulate` writes the same
jobs.csv and summary.json byte for byte."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from policy_service.service import shipped_context
from sim.clock import SimulationStalled
from sim.fastpath import RunConfig, simulate
from sim.quiet import QuietRounds
from sim.scenario import Scenario, run_policy
from sim.traces import TraceSpec, TraceStreams, generate_trace, read_trace, write_trace

CONTEXT = shipped_context()
TABLE = CONTEXT.table
assert TABLE is not None
POLICIES = [
    "allox", "fifo", "fifo_packed", "fifo_perf", "finish_time_fairness", "finish_time_fairness_packed",
    "finish_time_fairness_perf", "gandiva", "gandiva_ts", "isolated", "max_min_fairness", "max_min_fairness_packed",
    "max_min_fairness_perf", "max_min_fairness_water_filling", "max_min_fairness_water_filling_packed",
    "max_min_fairness_water_filling_perf", "max_sum_throughput_normalized_by_cost_packed_SLOs",
    "max_sum_throughput_normalized_by_cost_perf", "max_sum_throughput_normalized_by_cost_perf_SLOs",
    "max_sum_throughput_perf", "min_total_duration", "min_total_duration_packed", "min_total_duration_perf", "optimus",
    "optimus_perf", "proportional", "srtf", "srtf_perf", "themis", "themis_perf", "tiresias", "tiresias_perf",
]
# A few jobs at a time (long quiet stretches), then a burst that saturates the cluster (rounds that
# change: gangs, jobs taking turns), in one trace.
_QUIET = generate_trace(TraceSpec(num_jobs=14, jobs_per_hour=0.4, slos=True), TABLE, TraceStreams.gavel(5))
_BUSY = generate_trace(TraceSpec(num_jobs=14, jobs_per_hour=6.0, multi_gpu=True, slos=True), TABLE, TraceStreams.gavel(6))
MIXED = (*_QUIET, *(
    dataclasses.replace(job, job_id=str(len(_QUIET) + k), arrival_time_s=_QUIET[-1].arrival_time_s + 3600.0 + job.arrival_time_s)
    for k, job in enumerate(_BUSY)
))
CLUSTER = {"v100": 2, "p100": 2, "k80": 2}


def test_every_policy_is_one_of_the_catalogs():
    from policy_service.core.catalog import REGISTRY

    assert sorted(POLICIES) == sorted(REGISTRY.names())


def both_ways(scenario: Scenario, policy: str):
    """(result, summary) with the skip on and off, timings left out; a run the policy stalls (AlloX
    refuses gangs) the same stall both ways."""
    runs = []
    for skip in (True, False):
        try:
            result, summary = run_policy(policy, dataclasses.replace(scenario, skip_quiet_rounds=skip), CONTEXT)
        except SimulationStalled as e:
            runs.append((str(e), None))
            continue
        result = dataclasses.replace(result, wall_s=0.0, solve_times_s=())
        summary = {f.name: getattr(summary, f.name) for f in dataclasses.fields(summary) if not f.name.startswith("solve_time")}
        runs.append((result, summary))
    return runs


def advanced_rounds(monkeypatch) -> list[int]:
    """Counts the boundaries each run advanced without planning (to show the test covers some)."""
    counts: list[int] = []
    planned = QuietRounds.planned

    def counting(self, state, plan):
        counts.append(self.advanced)
        planned(self, state, plan)

    monkeypatch.setattr(QuietRounds, "planned", counting)
    return counts


HEADLINE = ["max_min_fairness_perf", "max_min_fairness", "fifo_perf"]


@pytest.mark.parametrize("preset", ["default", "gavel"])
@pytest.mark.parametrize("policy", HEADLINE)
def test_the_headline_policies_give_the_same_results_with_the_skip(policy, preset, monkeypatch):
    counts = advanced_rounds(monkeypatch)
    (with_skip, summary), (without, plain_summary) = both_ways(Scenario(MIXED, CLUSTER, preset), policy)
    assert with_skip == without
    assert summary == plain_summary
    # an agnostic policy's type order is drawn each round: under Gavel's mechanism the draw alone
    # places its jobs (core/quiet.drawn_plans); under ours, charges and holds weigh in: planned
    if policy.endswith("_perf") or preset == "gavel":
        assert max(counts) > 50


@pytest.mark.slow  # ~35 s in all: 29 policies x 2 presets, each run both ways
@pytest.mark.parametrize("preset", ["default", "gavel"])
@pytest.mark.parametrize("policy", [p for p in POLICIES if p not in HEADLINE])  # (those: the test above)
def test_every_other_policy_gives_the_same_results_with_the_skip(policy, preset):
    (with_skip, summary), (without, plain_summary) = both_ways(Scenario(MIXED, CLUSTER, preset), policy)
    assert with_skip == without
    assert summary == plain_summary


@pytest.mark.parametrize("preset", ["default", "gavel"])
def test_a_window_a_lag_and_servers_of_several_gpus(preset):
    """Gavel's steady-state window, a what-if's boundary lag, gangs on 4-GPU servers."""
    trace = generate_trace(TraceSpec(num_jobs=70, jobs_per_hour=0.8, multi_gpu=True), TABLE, TraceStreams.gavel(9))
    for lag_s in (0.0, 7.25):
        for skip in (True, False):
            config = RunConfig(
                "max_min_fairness_perf", {"v100": 8, "p100": 4, "k80": 4}, _settings(preset, gpus_per_server=4),
                seed=3, window=(20, 50), boundary_lag_s=lag_s, skip_quiet_rounds=skip,
            )
            result = dataclasses.replace(simulate(trace, config, CONTEXT), wall_s=0.0, solve_times_s=())
            if skip:
                first = result
        assert first == result


def _settings(preset: str, gpus_per_server: int):
    from mechanism_service.core.settings import preset as make

    return make(preset, "max_min_fairness_perf", gpus_per_server=gpus_per_server)


@pytest.mark.parametrize("preset", ["default", "gavel"])
def test_gavel_simulate_writes_the_same_files_byte_for_byte(preset, tmp_path):
    write_trace(MIXED, tmp_path / "mixed.trace")
    outs = []
    for flag in ([], ["--no-skip-quiet-rounds"]):
        out = tmp_path / f"run{len(outs)}"
        subprocess.run(
            [sys.executable, "-m", "services.cli", "simulate", "--trace", str(tmp_path / "mixed.trace"), "--cluster",
             "4:4:4", "--policy", "max_min_fairness_perf", "--preset", preset, "--no-plots", "--out", str(out), *flag],
            check=True, capture_output=True,
        )
        outs.append(out)
    assert (outs[0] / "jobs.csv").read_bytes() == (outs[1] / "jobs.csv").read_bytes()
    summaries = [json.loads((out / "summary.json").read_text()) for out in outs]
    for summary in summaries:
        for key in [k for k in summary if k.startswith("solve_time") or k in ("wall_s", "out_dir")]:
            del summary[key]
    assert summaries[0] == summaries[1]


def test_the_skip_flag_is_on_by_default_and_said_in_help():
    out = subprocess.run(
        [sys.executable, "-m", "services.cli", "simulate", "--help"], check=True, capture_output=True, text=True,
    ).stdout
    assert "--no-skip-quiet-rounds" in out
    assert RunConfig("fifo", {}, _settings("default", 1)).skip_quiet_rounds
    assert Scenario((), {}).skip_quiet_rounds


def test_advancing_a_stretch_equals_planning_each_round_on_a_long_quiet_trace(tmp_path):
    """A long trace with one job at a time: stretches of hundreds of rounds, each advanced in one
    step (sim/quiet_advance.py), against every round planned; written and read back as a trace
    file first, as a user's trace would be."""
    trace = generate_trace(TraceSpec(num_jobs=25, jobs_per_hour=0.05), TABLE, np.random.default_rng(2))
    write_trace(trace, tmp_path / "long.trace")
    trace = read_trace(tmp_path / "long.trace")
    results = []
    for skip in (True, False):
        config = RunConfig("max_min_fairness_perf", CLUSTER, _settings("default", 1), skip_quiet_rounds=skip)
        results.append(dataclasses.replace(simulate(trace, config, CONTEXT), wall_s=0.0, solve_times_s=()))
    assert results[0] == results[1]
    assert len(results[0].rounds) > 1000
