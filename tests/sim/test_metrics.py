"""sim/metrics.py on small hand-made results whose numbers are worked out in the comments."""

from __future__ import annotations

import json
import math
import pathlib
import re
from dataclasses import replace

import numpy as np
import pytest

from common.errors import ConfigError
from common.throughputs import throughput_table_from_json
from sim.comparison import ComparisonRow, compare, render_comparison
from sim.metrics import Summary, finish_time_fairness, isolated_throughputs_from_table, measured_jcts_s, summarize
from sim.series import queue_over_time, utilization_over_time
from sim.sweep_lines import SweepRow, sweep_lines
from sim.results import JobOutcome, RoundRecord, SimulationResult

ROOT = pathlib.Path(__file__).resolve().parents[2]
PRICES = {"v100": 3.6, "k80": 1.8}  # $/GPU-hour: 0.001 and 0.0005 $ per GPU-second


# --- builders ------------------------------------------------------------------------------------


def job(job_id: str, arrival_s: float = 0.0, completion_s: float | None = None, **changes) -> JobOutcome:
    base = JobOutcome(
        job_id=job_id,
        job_type="ResNet-18 (batch size 64)",
        scale_factor=1,
        priority_weight=1.0,
        total_steps=1000,
        arrival_s=arrival_s,
        start_s=arrival_s,
        completion_s=completion_s,
        steps_done=1000 if completion_s is not None else 0,
        gpu_seconds_by_type={},
    )
    return replace(base, **changes)


def round_(round_id: int, start_s: float, end_s: float, **changes) -> RoundRecord:
    base = RoundRecord(
        round_id=round_id,
        start_s=start_s,
        end_s=end_s,
        busy_gpus_by_type={},
        busy_gpu_seconds_by_type={},
        jobs_running=0,
        jobs_waiting=0,
        leases_extended=0,
        lease_opportunities=0,
        reset=False,
    )
    return replace(base, **changes)


def run(jobs=(), rounds=(), measured: tuple[str, ...] | None = None, **changes) -> SimulationResult:
    jobs = tuple(jobs)
    base = SimulationResult(
        policy="max_min_fairness_perf",
        preset="default",
        cluster={"v100": 2, "k80": 2},
        round_s=360.0,
        seed=0,
        jobs=jobs,
        rounds=tuple(rounds),
        makespan_s=1000.0,
        measured_job_ids=tuple(j.job_id for j in jobs) if measured is None else measured,
        resets=0,
        solve_times_s=(),
    )
    return replace(base, **changes)


def flat(d: dict, prefix: str = "") -> dict:
    """Nested mappings flattened to dotted keys, so pytest.approx can compare a whole summary."""
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def assert_summary(actual: Summary, expected: Summary) -> None:
    assert flat(actual.as_dict()) == pytest.approx(flat(expected.as_dict()))


# --- the scenario ------------------------------------------------------------------------------

# Cluster v100=2, k80=2; run stops at 1000 s. Jobs 0-5 are measured, 6 is outside the window.
JOBS = (
    job("0", 0, 100, gpu_seconds_by_type={"v100": 100}),  # JCT 100, $0.10
    job("1", 0, 200, gpu_seconds_by_type={"k80": 200}),  # JCT 200, $0.10
    job("2", 100, 500, gpu_seconds_by_type={"v100": 200, "k80": 200}),  # JCT 400, $0.20 + $0.10
    job("3", 200, 1000, scale_factor=2, gpu_seconds_by_type={"v100": 1600}),  # JCT 800, $1.60
    job("4", 300, None, start_s=600, steps_done=400, gpu_seconds_by_type={"k80": 400}),  # unfinished, $0.20
    job("5", 0, None, dropped=True, gpu_seconds_by_type={"k80": 100, "v100": 0}),  # dropped, $0.05
    job("6", 0, 300, gpu_seconds_by_type={"v100": 300}),  # not measured, $0.30
)
ROUNDS = (
    round_(0, 0, 250, busy_gpu_seconds_by_type={"v100": 300, "k80": 400}, reset=True),
    round_(1, 250, 500, busy_gpu_seconds_by_type={"v100": 500, "k80": 100}, leases_extended=2, lease_opportunities=3),
    round_(2, 500, 1000, busy_gpu_seconds_by_type={"v100": 1000, "k80": 300}, leases_extended=1, lease_opportunities=1),
)
SCENARIO = run(JOBS, ROUNDS, measured=("0", "1", "2", "3", "4", "5"), resets=2, solve_times_s=(0.5, 1.5, 0.25, 2.0))


def test_summary_of_the_scenario():
    assert_summary(
        summarize(SCENARIO, PRICES),
        Summary(
            jobs_measured=6,
            jobs_completed=4,
            jobs_unfinished=1,
            jobs_dropped=1,
            jobs_rejected=0,
            avg_jct_s=375.0,  # (100 + 200 + 400 + 800) / 4
            median_jct_s=300.0,  # (200 + 400) / 2
            p95_jct_s=740.0,  # rank 0.95 x 3 = 2.85: 400 + 0.85 x (800 - 400)
            p99_jct_s=788.0,  # rank 2.97: 400 + 0.97 x 400
            makespan_s=1000.0,
            num_rounds=3,
            num_resets=2,
            busy_gpu_seconds_by_type={"v100": 1800.0, "k80": 800.0},
            utilization_by_type={"v100": 0.9, "k80": 0.4},  # 1800 / (2 x 1000), 800 / (2 x 1000)
            cluster_utilization=0.65,  # 2600 / (4 x 1000)
            lease_extensions=3,
            lease_opportunities=4,
            lease_extension_share=0.75,
            num_solves=4,
            solve_time_total_s=4.25,
            solve_time_mean_s=1.0625,
            solve_time_median_s=1.0,  # sorted 0.25 0.5 1.5 2.0: (0.5 + 1.5) / 2
            solve_time_p95_s=1.925,  # rank 2.85: 1.5 + 0.85 x 0.5
            solve_time_max_s=2.0,
            cost_total_usd=2.65,
            cost_measured_usd=2.35,  # everything but job 6
            cost_per_measured_job_usd=2.35 / 6,
            rho_jobs=0,
            rho_mean=None,
            rho_worst=None,
        ),
    )


def test_measured_jcts_are_the_completed_window_jobs_in_order():
    assert measured_jcts_s(SCENARIO).tolist() == [100.0, 200.0, 400.0, 800.0]


def test_the_summary_is_json_ready():
    record = summarize(SCENARIO, PRICES).as_dict()
    assert json.loads(json.dumps(record, allow_nan=False)) == record
    assert record["utilization_by_type"] == {"v100": 0.9, "k80": 0.4}


def test_an_empty_run_has_counts_and_no_statistics():
    s = summarize(run(makespan_s=0.0), PRICES, isolated_throughputs={})
    assert (s.jobs_measured, s.jobs_completed, s.num_rounds, s.num_solves, s.rho_jobs) == (0, 0, 0, 0, 0)
    assert (s.avg_jct_s, s.p99_jct_s, s.cluster_utilization, s.lease_extension_share, s.solve_time_max_s) == (None,) * 5
    assert s.utilization_by_type == {"v100": None, "k80": None}
    assert (s.cost_total_usd, s.cost_per_measured_job_usd, s.rho_mean) == (0.0, None, None)
    json.dumps(s.as_dict(), allow_nan=False)


def test_a_measured_id_with_no_outcome_counts_as_unfinished():
    s = summarize(run([job("0", 0, 100)], measured=("0", "1")), PRICES)
    assert (s.jobs_measured, s.jobs_completed, s.jobs_unfinished, s.jobs_dropped) == (2, 1, 1, 0)


def test_a_dropped_job_with_a_completion_time_is_not_in_the_jct():
    s = summarize(run([job("0", 0, 100), job("1", 0, 50, dropped=True)]), PRICES)
    assert (s.avg_jct_s, s.jobs_completed, s.jobs_dropped, s.jobs_unfinished) == (100.0, 1, 1, 0)


def test_a_type_with_gpu_time_and_no_price_is_an_error_naming_it():
    with pytest.raises(ConfigError, match="'p100'.*job 0"):
        summarize(run([job("0", 0, 100, gpu_seconds_by_type={"p100": 10.0})]), PRICES)


# --- finish-time fairness ------------------------------------------------------------------------

# Cluster v100=2, k80=2. Jobs in the system per round: 4, 4, 2, 2 (rounds start at 0, 100, 200, 300).
FAIRNESS_ROUNDS = tuple(
    round_(i, 100 * i, 100 * (i + 1), jobs_running=r, jobs_waiting=w)
    for i, (r, w) in enumerate([(2, 2), (3, 1), (2, 0), (1, 1)])
)
FAIRNESS = run(
    [
        # Rounds 0-3: n = (4 + 4 + 2 + 2) / 4 = 3. Share: 2/3 of the time on each type, rows sum to
        # 4/3 > 1, so halved: x = (1/2, 1/2). X = 10/2 + 5/2 = 7.5 steps/s; alone 1000 / 7.5 s,
        # rho = 400 x 7.5 / 1000 = 3.
        job("j", 0, 400, total_steps=1000),
        # Rounds 2-3 (it arrives at 150: round 1 started before): n = 2, gang of 2: x = 2 / (2 x 2)
        # = 1/2 per type (sum 1, kept). X = 6/2 + 0 = 3 steps/s; alone 600 / 3 = 200 s; JCT 250:
        # rho = 1.25.
        job("k", 150, 400, scale_factor=2, total_steps=600),
        # No recorded round starts in [410, 420): n = 1, x = (1, 1) halved to (1/2, 1/2): X = 7.5,
        # alone 75 / 7.5 = 10 s, JCT 10: rho = 1.
        job("m", 410, 420, total_steps=75),
        job("u", 0, None),  # unfinished: no rho
    ],
    FAIRNESS_ROUNDS,
)
ISOLATED = {"j": {"v100": 10.0, "k80": 5.0}, "k": {"v100": 6.0}, "m": {"v100": 10.0, "k80": 5.0}}


def test_rho_per_job_follows_the_documented_formula():
    assert finish_time_fairness(FAIRNESS, ISOLATED) == pytest.approx({"j": 3.0, "k": 1.25, "m": 1.0})


def test_rho_worst_and_mean_in_the_summary():
    s = summarize(FAIRNESS, PRICES, isolated_throughputs=ISOLATED)
    assert (s.rho_jobs, s.rho_worst) == (3, pytest.approx(3.0))
    assert s.rho_mean == pytest.approx((3.0 + 1.25 + 1.0) / 3)


def test_rho_needs_every_measured_completed_job():
    with pytest.raises(ConfigError, match="no isolated throughputs"):
        finish_time_fairness(FAIRNESS, {"j": {"v100": 1.0}})
    with pytest.raises(ConfigError, match="no positive isolated throughput"):
        finish_time_fairness(FAIRNESS, {**ISOLATED, "m": {"p100": 3.0}})


def test_isolated_throughputs_come_from_the_table_for_the_cluster_types():
    table = throughput_table_from_json(json.loads((ROOT / "common/data/simulation_throughputs.json").read_text()))
    job_type, scale_factor, _ = next(iter(table.isolated_steps_per_s))
    result = run([job("a", job_type=job_type, scale_factor=scale_factor)], cluster={"v100": 1, "k80": 1, "tpu": 1})
    assert isolated_throughputs_from_table(result, table) == {
        "a": {w: table.isolated(job_type, scale_factor, w) for w in ("v100", "k80")}
    }


# --- series over time ----------------------------------------------------------------------------

# v100=2. Rounds [0,100) 2 busy, [100,200) 1 busy, nothing recorded in [200,300), [300,400) 2 busy.
SERIES = run(
    rounds=[
        round_(0, 0, 100, busy_gpus_by_type={"v100": 2}, jobs_running=2, jobs_waiting=3),
        round_(1, 100, 200, busy_gpus_by_type={"v100": 1}, jobs_running=1, jobs_waiting=2),
        round_(2, 300, 400, busy_gpus_by_type={"v100": 2}, jobs_running=2, jobs_waiting=0),
    ],
    cluster={"v100": 2},
    makespan_s=400.0,
)


def test_utilisation_per_round_with_idle_gaps():
    series = utilization_over_time(SERIES)
    assert series.window_s is None
    assert series.edges_s.tolist() == [0, 100, 200, 300, 400]
    assert series.values["v100"] == pytest.approx([1.0, 0.5, 0.0, 1.0])
    assert series.values["all"] == pytest.approx([1.0, 0.5, 0.0, 1.0])


def test_queue_per_round_is_undefined_in_gaps():
    series = queue_over_time(SERIES)
    np.testing.assert_allclose(series.values["waiting"], [3, 2, np.nan, 0])
    np.testing.assert_allclose(series.values["running"], [2, 1, np.nan, 2])


def test_many_rounds_are_averaged_over_uniform_windows():
    util = utilization_over_time(SERIES, max_bins=2)
    assert (util.window_s, util.edges_s.tolist()) == (200.0, [0, 200, 400])
    assert util.values["v100"] == pytest.approx([0.75, 0.5])  # gaps count as idle
    queue = queue_over_time(SERIES, max_bins=2)
    assert queue.values["waiting"] == pytest.approx([2.5, 0.0])  # over the recorded time only


def test_series_of_a_run_without_rounds():
    series = utilization_over_time(run(makespan_s=50.0))
    assert series.edges_s.tolist() == [0, 50]
    assert series.values["v100"].tolist() == [0.0]
    assert math.isnan(queue_over_time(run(makespan_s=50.0)).values["running"][0])


# --- comparison and sweeps ---------------------------------------------------------------------


def test_comparison_rows_and_table():
    fast = summarize(SCENARIO, PRICES)
    empty = summarize(run(), PRICES)
    rows = compare({"las": fast, "fifo": empty})
    assert rows[0] == ComparisonRow(
        policy="las",
        jobs_completed=4,
        jobs_measured=6,
        avg_jct_h=pytest.approx(375 / 3600),
        median_jct_h=pytest.approx(300 / 3600),
        p95_jct_h=pytest.approx(740 / 3600),
        p99_jct_h=pytest.approx(788 / 3600),
        makespan_h=pytest.approx(1000 / 3600),
        cluster_utilization=pytest.approx(0.65),
        lease_extension_pct=pytest.approx(75.0),
        cost_usd=pytest.approx(2.35),
    )
    text = render_comparison(rows)
    lines = text.splitlines()
    columns = ["policy", "done", "avg JCT h", "median h", "p95 h", "p99 h", "makespan h", "util", "lease-ext %"]
    columns.append("cost $")
    assert re.split(r"\s{2,}", lines[0]) == columns
    assert lines[1].split() == ["las", "4/6", "0.10", "0.08", "0.21", "0.22", "0.28", "0.650", "75.0", "2.35"]
    assert lines[2].split() == ["fifo", "0/0", "-", "-", "-", "-", "0.28", "0.000", "-", "0.00"]
    assert len({len(line) for line in lines[:2]}) == 1  # aligned columns
    assert text.endswith("\n")


def test_sweep_lines_group_by_policy_and_rate():
    rows = [
        SweepRow("las", 2.0, 0, 3600.0),
        SweepRow("las", 1.0, 0, 1800.0),
        SweepRow("las", 2.0, 1, 7200.0),
        SweepRow("las", 3.0, 0, None),  # nothing completed: no point
        SweepRow("fifo", 1.0, 0, 5400.0),
    ]
    las, fifo = sweep_lines(rows)
    assert (las.policy, fifo.policy) == ("las", "fifo")
    assert las.jobs_per_hour.tolist() == [1.0, 2.0]
    assert las.mean_jct_h.tolist() == [0.5, 1.5]
    assert (las.min_jct_h.tolist(), las.max_jct_h.tolist(), las.seeds.tolist()) == ([0.5, 1.0], [0.5, 2.0], [1, 2])
    assert fifo.mean_jct_h.tolist() == [1.5]


# --- scale -------------------------------------------------------------------------------------


def synthetic_run(num_jobs: int, num_rounds: int, seed: int = 0) -> SimulationResult:
    """A large result with plausible values (not a consistent schedule), to time the metrics."""
    rng = np.random.default_rng(seed)
    round_s = 360.0
    types = ("v100", "p100", "k80")
    cluster = {w: 36 for w in types}
    busy = rng.integers(0, 37, size=(num_rounds, 3))
    rounds = tuple(
        RoundRecord(
            round_id=i,
            start_s=i * round_s,
            end_s=(i + 1) * round_s,
            busy_gpus_by_type=dict(zip(types, map(int, busy[i]))),
            busy_gpu_seconds_by_type={w: float(b) * round_s * 0.9 for w, b in zip(types, busy[i])},
            jobs_running=int(busy[i].sum()),
            jobs_waiting=int(rng.integers(0, 50)),
            leases_extended=int(busy[i].sum() // 2),
            lease_opportunities=int(busy[i].sum()),
            reset=bool(i % 5 == 0),
        )
        for i in range(num_rounds)
    )
    arrival_s = np.sort(rng.uniform(0, num_rounds * round_s * 0.8, num_jobs))
    jct_s = rng.lognormal(9.0, 1.0, num_jobs)
    jobs = tuple(
        JobOutcome(
            job_id=str(i),
            job_type="ResNet-50 (batch size 64)",
            scale_factor=1,
            priority_weight=1.0,
            total_steps=10_000,
            arrival_s=float(arrival_s[i]),
            start_s=float(arrival_s[i]),
            completion_s=float(arrival_s[i] + jct_s[i]) if i % 10 else None,
            steps_done=10_000 if i % 10 else 5_000,
            gpu_seconds_by_type={"v100": float(jct_s[i]) / 2, "k80": float(jct_s[i]) / 2},
        )
        for i in range(num_jobs)
    )
    return SimulationResult(
        policy="max_min_fairness_perf",
        preset="default",
        cluster=cluster,
        round_s=round_s,
        seed=seed,
        jobs=jobs,
        rounds=rounds,
        makespan_s=num_rounds * round_s,
        measured_job_ids=tuple(str(i) for i in range(num_jobs // 10, num_jobs)),
        resets=num_rounds // 5,
        solve_times_s=tuple(rng.uniform(0.01, 0.5, num_rounds // 5)),
    )


def test_summarize_handles_ten_thousand_jobs_and_rounds():
    # Vectorised: about 0.03 s here (speed itself is a benchmark's business, not a test's).
    result = synthetic_run(10_000, 10_000)
    isolated = {job.job_id: {"v100": 2.0, "p100": 1.0, "k80": 0.5} for job in result.jobs}
    s = summarize(result, {"v100": 2.48, "p100": 1.46, "k80": 0.45}, isolated_throughputs=isolated)
    utilization = utilization_over_time(result)
    queue = queue_over_time(result)
    assert s.num_rounds == 10_000 and s.rho_jobs == s.jobs_completed > 0
    assert len(utilization.edges_s) <= 201 and len(queue.edges_s) <= 201  # averaged into at most 200 windows


def test_rejected_submissions_are_counted_apart_from_unfinished_jobs():
    import dataclasses

    result = dataclasses.replace(SCENARIO, rejected_job_ids=("9",), measured_job_ids=(*SCENARIO.measured_job_ids, "9"))
    s = summarize(result, PRICES)
    assert s.jobs_rejected == 1
    assert s.jobs_measured == s.jobs_completed + s.jobs_unfinished + s.jobs_dropped + s.jobs_rejected
