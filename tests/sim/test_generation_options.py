"""The generated jobs' options of Gavel's generated-jobs driver (issue 26, item 4): fixed run time,
steady-state start, priority weights and SLOs, in the generator, `gavel trace generate` and
`gavel simulate`. Under a second.
"""

from __future__ import annotations

import csv
import json

import pytest

from services.cli import main
from sim.traces import TraceSpec, TraceStreams, generate_trace, read_trace
from tests.sim.test_traces import TABLE

V100 = "v100"


def generated(**options) -> tuple:
    spec = TraceSpec(options.pop("num_jobs", 200), jobs_per_hour=options.pop("rate", 4.0), **options)
    return generate_trace(spec, TABLE, TraceStreams.gavel(options.pop("seed", 3)))


def test_a_fixed_run_time_sizes_every_job_to_it_on_the_reference_type():
    jobs = generated(fixed_run_time_s=5400.0, multi_gpu=True)
    for job in jobs:
        rate = TABLE.isolated_steps_per_s[(job.job_type, job.scale_factor, V100)]
        assert job.total_steps == max(1, int(5400.0 * rate))
    # no duration is drawn, so the job stream moves on to the types sooner: other jobs than without
    assert [j.job_type for j in jobs] != [j.job_type for j in generated(multi_gpu=True)]


def test_a_steady_state_start_puts_the_same_jobs_first_at_zero_then_the_arrivals():
    plain = generated(num_jobs=60)
    steady = generated(num_jobs=60, steady_state_gpus=(4, 4, 4))
    # single-GPU jobs: 12 fill the 12 GPUs; the arrival process then starts at t = 0 with the 13th
    assert [j.arrival_time_s for j in steady[:13]] == [0.0] * 13
    assert steady[13].arrival_time_s > 0
    # the same job stream (types, steps) and the same arrival stream, shifted by the 12 jobs
    strip = [(j.job_type, j.total_steps) for j in steady]
    assert strip == [(j.job_type, j.total_steps) for j in plain]
    assert [j.arrival_time_s for j in steady[12:]] == [j.arrival_time_s for j in plain[:48]]


def test_a_steady_state_fill_counts_gpus_type_by_type_with_multi_gpu_jobs():
    gpus = (8, 0, 16)
    steady = generated(num_jobs=80, multi_gpu=True, steady_state_gpus=gpus)
    at_zero = [j for j in steady if j.arrival_time_s == 0.0]
    filled = at_zero[:-1]  # the last job at t = 0 is the arrival process's first
    # the fill of each type stops at the first job that reaches its count: rebuild the cut points
    cuts, remaining, position = [], [g for g in gpus if g > 0], 0
    for count in remaining:
        while count > 0:
            count -= filled[position].scale_factor
            position += 1
        cuts.append(position)
    assert cuts[-1] == len(filled)
    assert sum(j.scale_factor for j in filled) >= sum(gpus)


def test_priority_weights_and_slos_are_gavels():
    jobs = generated(num_jobs=600, priority_weights=True, slos=True, fixed_run_time_s=3600.0)
    weights = [j.priority_weight for j in jobs]
    assert set(weights) == {1.0, 5.0}
    assert 0.15 < weights.count(5.0) / len(jobs) < 0.25  # 20 %
    factors = [round(j.slo_s / 3600.0, 6) for j in jobs]  # the SLO is factor x the run time
    assert set(factors) == {1.2, 2.0, 10.0}
    for factor in (1.2, 2.0, 10.0):
        assert 0.28 < factors.count(factor) / len(jobs) < 0.39  # 0.33 / 0.34 / 0.33


def test_trace_generate_takes_the_options_and_refuses_bad_ones(tmp_path, capsys):
    out = tmp_path / "t.trace"
    argv = ["trace", "generate", "--jobs", "30", "--jobs-per-hour", "3", "--output", str(out)]
    assert main([*argv, "--steady-state", "v100=4,k80=2", "--fixed-run-time-s", "1800", "--priority-weights", "--slos"]) == 0
    jobs = read_trace(out)
    assert sum(1 for j in jobs if j.arrival_time_s == 0.0) == 7  # 6 GPUs filled, then the first arrival
    assert all(j.slo_s is not None for j in jobs)
    capsys.readouterr()
    assert main([*argv, "--steady-state", "v100=4,tpu=2"]) == 2
    assert "--steady-state v100=4,tpu=2: 'tpu' is not in the throughput table" in capsys.readouterr().err
    assert main([*argv, "--fixed-run-time-s", "-5"]) == 2
    assert "--fixed-run-time-s: expected a finite number of seconds > 0" in capsys.readouterr().err


def test_simulate_generates_with_the_options_and_says_so(tmp_path, capsys):
    out = tmp_path / "run"
    code = main([
        "simulate", "--jobs", "16", "--jobs-per-hour", "4", "--cluster", "v100=2,p100=2,k80=2", "--policy", "fifo_perf",
        "--steady-state", "--fixed-run-time-s", "1800", "--priority-weights", "--no-plots", "--json", "--out", str(out),
    ])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["jobs_completed"] == 16
    trace = read_trace(out / "trace.trace")
    assert sum(1 for j in trace if j.arrival_time_s == 0.0) == 7  # the cluster's 6 GPUs, then the first arrival


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--trace", "x.trace", "--steady-state"], "--trace: a trace file and generation options"),
        (["--jobs", "5", "--static", "--fixed-run-time-s", "0"], "--fixed-run-time-s: expected a number of seconds > 0"),
    ],
)
def test_simulate_refuses_contradicting_or_bad_options(extra, message, capsys):
    assert main(["simulate", "--cluster", "4:4:4", "--policy", "fifo_perf", "--no-plots", *extra]) == 2
    assert message in capsys.readouterr().err


def test_a_sweep_runs_each_cell_as_simulate_runs_it_with_the_options(tmp_path, capsys):
    """Gavel's sweeps take the generated jobs' options and --ideal: a cell's average JCT is the
    `gavel simulate` run's with the same flags. Two runs of 20 jobs: about 2 s."""
    options = ["--jobs", "20", "--cluster", "2:2:2", "--steady-state", "--slos", "--fixed-run-time-s", "3600", "--ideal"]
    assert main(["sweep", "--policies", "max_min_fairness_perf", "--rates", "3", "--processes", "1",
                 "--out", str(tmp_path / "sweep"), *options]) == 0
    (row,) = list(csv.DictReader((tmp_path / "sweep" / "sweep.csv").read_text().splitlines()))
    capsys.readouterr()
    assert main(["simulate", "--policy", "max_min_fairness_perf", "--jobs-per-hour", "3", "--no-plots", "--json",
                 "--out", str(tmp_path / "run"), *options]) == 0
    assert float(row["avg_jct_s"]) == pytest.approx(json.loads(capsys.readouterr().out)["avg_jct_s"], rel=1e-12)
