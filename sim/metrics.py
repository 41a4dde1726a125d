"""A run's numbers: what summary.json reports, the comparison table and the series the plots draw.

Pure: a SimulationResult in, values out; no clock, no files, no logging. The definitions follow
Gavel's where Gavel has one (docs/gavel-semantics.md section 10) and say where they add to it.

Conventions used throughout:

- **Measured jobs** are ``result.measured_job_ids`` (the window; every job when none was given).
  A measured job is *completed* if it has a completion time and was not dropped, *dropped* if
  ``dropped`` is set, and *unfinished* otherwise (including a measured id with no outcome).
- **JCT** = completion_s - arrival_s, over the measured completed jobs only (Gavel skips the
  jobs it dropped after 5 failures in its average, section 8.3).
- **Percentiles** are numpy's default ("linear", Hyndman-Fan type 7): the p-th percentile of
  n sorted values v_0..v_{n-1} is v_k + f (v_{k+1} - v_k) with k + f = p/100 x (n - 1).
- A statistic of an empty set is None (JSON null), never NaN.

Costs use the jobs' leased GPU time (``JobOutcome.gpu_seconds_by_type``); utilisation uses the
rounds' busy GPU time (``RoundRecord.busy_gpu_seconds_by_type``, a packed GPU counted once), as
Gavel's ``cluster_utilization`` does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from types import MappingProxyType

import numpy as np

from common.errors import ConfigError
from common.throughputs import ThroughputTable
from sim.results import JobOutcome, SimulationResult

SECONDS_PER_HOUR = 3600.0


# --- the run summary -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Summary:
    """The numbers of one run. Times in seconds, money in US dollars, shares in [0, 1].

    Jobs (measured window): ``jobs_measured = jobs_completed + jobs_unfinished + jobs_dropped +
    jobs_rejected``.

    JCT over the measured completed jobs: mean, median, 95th and 99th percentile.

    ``makespan_s``: the simulated time when the run stopped (Gavel: the end of the round in which
    the last measured job finished, with a window). ``num_rounds``: the RoundRecords, i.e. rounds
    that placed at least one job (Gavel's num_rounds). ``num_resets``: allocation recomputations.

    Utilisation: ``busy_gpu_seconds_by_type[w]`` = sum over rounds of the GPU time that ran on
    type w; ``utilization_by_type[w] = busy_gpu_seconds_by_type[w] / (GPUs of w x makespan_s)``;
    ``cluster_utilization = sum_w busy / (sum_w GPUs x makespan_s)`` (Gavel's mean over workers
    of busy / t_stop). None when makespan_s or the GPU count is 0.

    Leases: ``lease_extension_share = lease_extensions / lease_opportunities``, both summed over
    rounds (Gavel section 6.3); None with no opportunity.

    Policy solves: one time per allocation computed; count, total, mean, median, p95, max.

    Cost: a job costs ``sum_w gpu_seconds_by_type[w] x price_per_hour[w] / 3600``.
    ``cost_total_usd`` sums every job of the run (measured or not); ``cost_measured_usd`` the
    measured ones; ``cost_per_measured_job_usd = cost_measured_usd / jobs_measured``.

    Finish-time fairness: ``rho_mean`` and ``rho_worst`` (the largest) over the ``rho_jobs``
    measured completed jobs, see ``finish_time_fairness``; None (and rho_jobs 0) when the
    isolated throughputs were not given.
    """

    jobs_measured: int
    jobs_completed: int
    jobs_unfinished: int
    jobs_dropped: int
    jobs_rejected: int  # refused at submission: they could never run on this cluster
    avg_jct_s: float | None
    median_jct_s: float | None
    p95_jct_s: float | None
    p99_jct_s: float | None
    makespan_s: float
    num_rounds: int
    num_resets: int
    busy_gpu_seconds_by_type: Mapping[str, float]
    utilization_by_type: Mapping[str, float | None]
    cluster_utilization: float | None
    lease_extensions: int
    lease_opportunities: int
    lease_extension_share: float | None
    num_solves: int
    solve_time_total_s: float
    solve_time_mean_s: float | None
    solve_time_median_s: float | None
    solve_time_p95_s: float | None
    solve_time_max_s: float | None
    cost_total_usd: float
    cost_measured_usd: float
    cost_per_measured_job_usd: float | None
    rho_jobs: int
    rho_mean: float | None
    rho_worst: float | None
    # The estimates the policy used (a learned estimator; None with the oracle): the mean over the
    # solves of the mean absolute percentage error, alone and packed (sim/estimation.py), and the
    # same over the last tenth of the solves (what it has learned by the end).
    estimation_isolated_mape: float | None = None
    estimation_colocated_mape: float | None = None
    estimation_isolated_mape_end: float | None = None
    estimation_colocated_mape_end: float | None = None

    def as_dict(self) -> dict[str, object]:
        """Plain JSON-ready values (mappings become dicts), in field order."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = dict(value) if isinstance(value, Mapping) else value
        return out


def summarize(
    result: SimulationResult,
    prices_per_hour: Mapping[str, float],
    isolated_throughputs: Mapping[str, Mapping[str, float]] | None = None,
) -> Summary:
    """The Summary of a run (definitions on Summary).

    ``prices_per_hour``: accelerator type -> $ per GPU-hour; every type some job has GPU time on
    must have one (ConfigError otherwise). ``isolated_throughputs``: job id -> accelerator type ->
    steps/s of the job's whole gang alone on that type (as in the throughput table); needed only
    for rho, and then for every measured completed job.
    """
    measured = set(result.measured_job_ids)
    measured_jobs = [job for job in result.jobs if job.job_id in measured]
    completed = [job for job in measured_jobs if _completed(job)]
    dropped = sum(job.dropped for job in measured_jobs)
    rejected = len(measured & set(result.rejected_job_ids))
    jct_s = np.array([job.jct_s for job in completed], dtype=float)
    avg, median, p95, p99 = _stats(jct_s, 50, 95, 99)

    types = tuple(result.cluster)
    busy = {w: float(sum(r.busy_gpu_seconds_by_type.get(w, 0.0) for r in result.rounds)) for w in types}
    utilization = {w: _ratio(busy[w], result.cluster[w] * result.makespan_s) for w in types}
    total_gpus = sum(result.cluster.values())

    extensions = sum(r.leases_extended for r in result.rounds)
    opportunities = sum(r.lease_opportunities for r in result.rounds)

    solve_s = np.array(result.solve_times_s, dtype=float)
    solve_mean, solve_median, solve_p95 = _stats(solve_s, 50, 95)

    cost_total = sum(job_cost_usd(job, prices_per_hour) for job in result.jobs)
    cost_measured = sum(job_cost_usd(job, prices_per_hour) for job in measured_jobs)

    rho = (
        np.array(list(finish_time_fairness(result, isolated_throughputs).values()), dtype=float)
        if isolated_throughputs is not None
        else np.empty(0)
    )

    return Summary(
        jobs_measured=len(measured),
        jobs_completed=len(completed),
        jobs_unfinished=len(measured) - len(completed) - dropped - rejected,
        jobs_dropped=dropped,
        jobs_rejected=rejected,
        avg_jct_s=avg,
        median_jct_s=median,
        p95_jct_s=p95,
        p99_jct_s=p99,
        makespan_s=float(result.makespan_s),
        num_rounds=len(result.rounds),
        num_resets=result.resets,
        busy_gpu_seconds_by_type=MappingProxyType(busy),
        utilization_by_type=MappingProxyType(utilization),
        cluster_utilization=_ratio(sum(busy.values()), total_gpus * result.makespan_s),
        lease_extensions=extensions,
        lease_opportunities=opportunities,
        lease_extension_share=_ratio(extensions, opportunities),
        num_solves=len(solve_s),
        solve_time_total_s=float(solve_s.sum()),
        solve_time_mean_s=solve_mean,
        solve_time_median_s=solve_median,
        solve_time_p95_s=solve_p95,
        solve_time_max_s=float(solve_s.max()) if len(solve_s) else None,
        cost_total_usd=float(cost_total),
        cost_measured_usd=float(cost_measured),
        cost_per_measured_job_usd=_ratio(cost_measured, len(measured)),
        rho_jobs=len(rho),
        rho_mean=float(rho.mean()) if len(rho) else None,
        rho_worst=float(rho.max()) if len(rho) else None,
        **estimation_errors(result),
    )


def estimation_errors(result: SimulationResult) -> dict[str, float | None]:
    """The Summary's estimation fields (see Summary)."""
    out: dict[str, float | None] = {}
    for name in ("isolated", "colocated"):
        values = [v for v in (getattr(s, f"{name}_mape") for s in result.estimation) if v is not None]
        tail = values[-max(1, len(values) // 10):]
        out[f"estimation_{name}_mape"] = float(np.mean(values)) if values else None
        out[f"estimation_{name}_mape_end"] = float(np.mean(tail)) if values else None
    return out


def job_cost_usd(job: JobOutcome, prices_per_hour: Mapping[str, float]) -> float:
    """``sum_w gpu_seconds_by_type[w] x prices_per_hour[w] / 3600``; types with no GPU time need
    no price."""
    cost = 0.0
    for accelerator_type, gpu_s in job.gpu_seconds_by_type.items():
        if gpu_s == 0:
            continue
        if accelerator_type not in prices_per_hour:
            raise ConfigError(
                f"no price per hour for accelerator type {accelerator_type!r}, on which job "
                f"{job.job_id} ran (prices known: {', '.join(sorted(prices_per_hour)) or 'none'})"
            )
        cost += gpu_s * prices_per_hour[accelerator_type] / SECONDS_PER_HOUR
    return cost


def finish_time_fairness(
    result: SimulationResult, isolated_throughputs: Mapping[str, Mapping[str, float]]
) -> dict[str, float]:
    """rho per measured completed job (job id -> rho), in result.jobs order.

    For job j with scale factor s_j, total steps S_j, arrival a_j and completion c_j:

    - n_j = the mean over the rounds r with a_j <= r.start_s < c_j of
      (r.jobs_running + r.jobs_waiting), the jobs in the system during j's lifetime; 1 if no
      recorded round starts in that interval, and at least 1 in any case;
    - j's isolated share of the cluster is 1/n_j of every type's GPUs: N_w / n_j GPUs of type w,
      i.e. a fraction of time x_jw = N_w / (n_j s_j) on type w for a gang of s_j GPUs, each row
      divided by max(1, sum_w x_jw) so the job runs at most all the time (Gavel's X_iso,
      docs/gavel-semantics.md section 9.2);
    - its throughput there is X_j = sum_w x_jw T_jw, with T_jw = isolated_throughputs[j][w]
      (the whole gang's steps/s alone on type w; a missing type counts as 0);
    - rho_j = JCT_j / (S_j / X_j).

    rho = 1 means the job finished exactly when it would have on its fair isolated share; above
    1 it was worse off than there. Raises ConfigError for a job with no isolated throughput.
    """
    measured = set(result.measured_job_ids)
    jobs = [job for job in result.jobs if job.job_id in measured and _completed(job)]
    if not jobs:
        return {}
    missing = [job.job_id for job in jobs if job.job_id not in isolated_throughputs]
    if missing:
        raise ConfigError(f"no isolated throughputs for {len(missing)} measured job(s), e.g. {missing[:3]}")

    # n_j with prefix sums over the rounds sorted by start: O((jobs + rounds) log rounds).
    types = tuple(result.cluster)
    rounds = sorted(result.rounds, key=lambda r: r.start_s)
    round_start_s = np.array([r.start_s for r in rounds], dtype=float)
    in_system = np.array([r.jobs_running + r.jobs_waiting for r in rounds], dtype=float)
    prefix = np.concatenate(([0.0], np.cumsum(in_system)))
    arrival_s = np.array([job.arrival_s for job in jobs], dtype=float)
    completion_s = np.array([job.completion_s for job in jobs], dtype=float)
    lo = np.searchsorted(round_start_s, arrival_s, side="left")
    hi = np.searchsorted(round_start_s, completion_s, side="left")
    count = hi - lo
    n = np.where(count > 0, (prefix[hi] - prefix[lo]) / np.maximum(count, 1), 1.0)
    n = np.maximum(n, 1.0)

    gpus = np.array([result.cluster[w] for w in types], dtype=float)
    scale = np.array([job.scale_factor for job in jobs], dtype=float)
    share = gpus[None, :] / (n[:, None] * scale[:, None])  # rows: jobs, columns: types
    share /= np.maximum(1.0, share.sum(axis=1, keepdims=True))
    steps_per_s = np.array(
        [[float(isolated_throughputs[job.job_id].get(w, 0.0)) for w in types] for job in jobs], dtype=float
    ).reshape(len(jobs), len(types))
    isolated_steps_per_s = (share * steps_per_s).sum(axis=1)
    stuck = [job.job_id for job, x in zip(jobs, isolated_steps_per_s) if x <= 0]
    if stuck:
        raise ConfigError(f"measured job(s) {stuck[:3]} have no positive isolated throughput on the cluster's types")

    total_steps = np.array([job.total_steps for job in jobs], dtype=float)
    jct_s = completion_s - arrival_s
    rho = jct_s * isolated_steps_per_s / total_steps
    return {job.job_id: float(value) for job, value in zip(jobs, rho)}


def isolated_throughputs_from_table(result: SimulationResult, table: ThroughputTable) -> dict[str, dict[str, float]]:
    """job id -> accelerator type -> isolated steps/s of the job's gang, for every job of the run
    and the cluster's types, from a throughput table (a type the table lacks for the job is left
    out, i.e. counts as 0): the ``isolated_throughputs`` argument of ``summarize``."""
    steps_per_s = table.isolated_steps_per_s
    return {
        job.job_id: {
            w: steps_per_s[(job.job_type, job.scale_factor, w)]
            for w in result.cluster
            if (job.job_type, job.scale_factor, w) in steps_per_s
        }
        for job in result.jobs
    }


def measured_jcts_s(result: SimulationResult) -> np.ndarray:
    """The JCTs of the measured completed jobs, ascending; shape (jobs_completed,)."""
    measured = set(result.measured_job_ids)
    jct_s = [job.jct_s for job in result.jobs if job.job_id in measured and _completed(job)]
    return np.sort(np.array(jct_s, dtype=float))


def _completed(job: JobOutcome) -> bool:
    return job.completion_s is not None and not job.dropped


def _ratio(numerator: float, denominator: float) -> float | None:
    return float(numerator) / float(denominator) if denominator else None


def _stats(values: np.ndarray, *percentiles: float) -> tuple[float | None, ...]:
    """(mean, then each percentile) of values; all None when empty."""
    if not len(values):
        return (None,) * (1 + len(percentiles))
    return (float(values.mean()), *(float(p) for p in np.percentile(values, percentiles)))


# --- series over time (for the plots) ----------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class TimeSeries:
    """Piecewise-constant series over simulated time.

    ``edges_s``: shape (k + 1,), ascending, from 0 to the end of the run. ``values``: series name
    -> shape (k,); value i holds on [edges_s[i], edges_s[i+1]) and is the time-weighted mean of
    the per-round values over that interval (NaN where a series is undefined there).
    ``window_s``: None when each interval is one round or one gap between rounds (exact), else
    the width of the uniform averaging windows (smoothed).
    """

    edges_s: np.ndarray
    values: Mapping[str, np.ndarray]
    window_s: float | None


MAX_BINS = 200  # above this many rounds and gaps, series are averaged over uniform windows


def utilization_over_time(
    result: SimulationResult, max_bins: int = MAX_BINS, window_s: float | None = None
) -> TimeSeries:
    """Leased GPUs / GPUs per accelerator type over time, plus ``"all"`` for the whole cluster.

    Per round r and type w the value is ``r.busy_gpus_by_type[w] / N_w``; between recorded rounds
    nothing was placed, so the value is 0 there. Types with no GPU are left out. Exact (one
    interval per round or gap) up to ``max_bins`` intervals, else averaged over ``max_bins``
    uniform windows; with ``window_s``, averaged over windows of that width from 0 (the last one
    cut at the end of the run), e.g. to put several runs on one grid.
    """
    types = [w for w, n in result.cluster.items() if n > 0]
    total = sum(result.cluster[w] for w in types)
    per_round = {w: [r.busy_gpus_by_type.get(w, 0) / result.cluster[w] for r in result.rounds] for w in types}
    per_round["all"] = [
        sum(r.busy_gpus_by_type.get(w, 0) for w in types) / total if total else 0.0 for r in result.rounds
    ]
    return _series(result, per_round, max_bins, window_s, gaps_are_zero=True)


def queue_over_time(result: SimulationResult, max_bins: int = MAX_BINS, window_s: float | None = None) -> TimeSeries:
    """Jobs ``"waiting"`` (admitted, not running) and ``"running"`` per round over time; NaN
    between recorded rounds (the simulator records only rounds that placed something), and a
    window's value is the mean over its recorded time. Bins as in ``utilization_over_time``."""
    per_round = {
        "waiting": [float(r.jobs_waiting) for r in result.rounds],
        "running": [float(r.jobs_running) for r in result.rounds],
    }
    return _series(result, per_round, max_bins, window_s, gaps_are_zero=False)


def _series(
    result: SimulationResult,
    per_round: Mapping[str, Sequence[float]],
    max_bins: int,
    window_s: float | None,
    gaps_are_zero: bool,
) -> TimeSeries:
    order = np.argsort([r.start_s for r in result.rounds], kind="stable")
    start_s = np.array([r.start_s for r in result.rounds], dtype=float)[order]
    end_s = np.array([r.end_s for r in result.rounds], dtype=float)[order]
    # Defensive: rounds are disjoint by construction; clip a float overlap so the integral below
    # stays monotone in time.
    end_s = np.minimum(end_s, np.concatenate((start_s[1:], [np.inf])))
    end_of_run_s = max(float(result.makespan_s), float(end_s.max()) if len(end_s) else 0.0)

    if window_s is None:
        edges_s = np.unique(np.concatenate(([0.0, end_of_run_s], start_s, end_s)))
        if len(edges_s) - 1 > max_bins:
            window_s = end_of_run_s / max_bins
    if window_s is not None:
        inner_s = np.arange(0.0, end_of_run_s, window_s)
        # No sliver of a window at the end from rounding (end / (end / k) can exceed k).
        edges_s = np.append(inner_s[inner_s < end_of_run_s - 1e-9 * window_s], end_of_run_s)
    if len(edges_s) < 2:  # an empty run of zero length: one empty interval
        edges_s = np.array([0.0, 0.0])

    covered = _integral_at(edges_s, start_s, end_s, np.ones_like(start_s))
    width = np.diff(covered) if not gaps_are_zero else np.diff(edges_s)
    values = {}
    for name, series in per_round.items():
        area = np.diff(_integral_at(edges_s, start_s, end_s, np.asarray(series, dtype=float)[order]))
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(width > 0, area / np.where(width > 0, width, 1.0), np.nan if not gaps_are_zero else 0.0)
        values[name] = mean
    return TimeSeries(edges_s=edges_s, values=MappingProxyType(values), window_s=window_s)


def _integral_at(t_s: np.ndarray, start_s: np.ndarray, end_s: np.ndarray, value: np.ndarray) -> np.ndarray:
    """The integral from 0 to each t of the function equal to value[i] on [start_s[i], end_s[i])
    and 0 elsewhere (disjoint, ascending intervals): piecewise linear through the interval ends,
    so one np.interp evaluates it anywhere."""
    if not len(start_s):
        return np.zeros_like(t_s, dtype=float)
    area_end = np.cumsum(value * (end_s - start_s))
    area_start = area_end - value * (end_s - start_s)
    knots_s = np.column_stack((start_s, end_s)).ravel()
    area = np.column_stack((area_start, area_end)).ravel()
    return np.interp(t_s, knots_s, area, left=0.0, right=float(area_end[-1]))


# --- side-by-side comparison -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ComparisonRow:
    """One policy's line in the comparison table. Hours = seconds / 3600; ``lease_extension_pct``
    = 100 x lease_extension_share; ``cost_usd`` is the measured jobs' cost (comparable across
    policies with a window, where each run stops at a different time)."""

    policy: str
    jobs_completed: int
    jobs_measured: int
    avg_jct_h: float | None
    median_jct_h: float | None
    p95_jct_h: float | None
    p99_jct_h: float | None
    makespan_h: float
    cluster_utilization: float | None
    lease_extension_pct: float | None
    cost_usd: float

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def compare(summaries: Mapping[str, Summary]) -> list[ComparisonRow]:
    """One row per summary, keyed by policy (or any run label), in the mapping's order."""
    return [
        ComparisonRow(
            policy=policy,
            jobs_completed=s.jobs_completed,
            jobs_measured=s.jobs_measured,
            avg_jct_h=_hours(s.avg_jct_s),
            median_jct_h=_hours(s.median_jct_s),
            p95_jct_h=_hours(s.p95_jct_s),
            p99_jct_h=_hours(s.p99_jct_s),
            makespan_h=s.makespan_s / SECONDS_PER_HOUR,
            cluster_utilization=s.cluster_utilization,
            lease_extension_pct=None if s.lease_extension_share is None else 100.0 * s.lease_extension_share,
            cost_usd=s.cost_measured_usd,
        )
        for policy, s in summaries.items()
    ]


_COLUMNS = (  # header, right-aligned?, cell
    ("policy", False, lambda r: r.policy),
    ("done", True, lambda r: f"{r.jobs_completed}/{r.jobs_measured}"),
    ("avg JCT h", True, lambda r: _fmt(r.avg_jct_h, ".2f")),
    ("median h", True, lambda r: _fmt(r.median_jct_h, ".2f")),
    ("p95 h", True, lambda r: _fmt(r.p95_jct_h, ".2f")),
    ("p99 h", True, lambda r: _fmt(r.p99_jct_h, ".2f")),
    ("makespan h", True, lambda r: _fmt(r.makespan_h, ".2f")),
    ("util", True, lambda r: _fmt(r.cluster_utilization, ".3f")),
    ("lease-ext %", True, lambda r: _fmt(r.lease_extension_pct, ".1f")),
    ("cost $", True, lambda r: _fmt(r.cost_usd, ",.2f")),
)


def render_comparison(rows: Sequence[ComparisonRow]) -> str:
    """A plain-text table, one line per row under a header, columns separated by two spaces;
    '-' for a value that is undefined (None). Ends with a newline."""
    cells = [[header for header, _, _ in _COLUMNS]] + [[cell(r) for _, _, cell in _COLUMNS] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(_COLUMNS))]
    lines = [
        "  ".join(c.rjust(w) if right else c.ljust(w) for c, w, (_, right, _) in zip(line, widths, _COLUMNS)).rstrip()
        for line in cells
    ]
    return "\n".join(lines) + "\n"


def _hours(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / SECONDS_PER_HOUR


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


# --- sweeps (policies x input rates x seeds) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class SweepRow:
    """One run of a sweep: its policy, input rate, seed and average JCT (None: none completed);
    ``option``: its variant's label ("" none: gavel sweep --variant)."""

    policy: str
    jobs_per_hour: float
    seed: int
    avg_jct_s: float | None
    option: str = ""


@dataclass(frozen=True, slots=True, eq=False)
class SweepLine:
    """One policy's (under one variant's options) average JCT against input rate. Arrays of
    shape (rates,), rates ascending; over the seeds with a value at each rate: mean, min and max
    of the average JCT in hours, and how many seeds there were. A rate where no seed completed a
    job is left out."""

    policy: str
    jobs_per_hour: np.ndarray
    mean_jct_h: np.ndarray
    min_jct_h: np.ndarray
    max_jct_h: np.ndarray
    seeds: np.ndarray
    option: str = ""

    @property
    def label(self) -> str:
        """``policy``, or ``policy [variant]``."""
        return f"{self.policy} [{self.option}]" if self.option else self.policy


def sweep_lines(rows: Iterable[SweepRow]) -> tuple[SweepLine, ...]:
    """Group sweep rows by (policy, option) (in order of first appearance) and rate."""
    by_line: dict[tuple[str, str], dict[float, list[float]]] = {}
    for row in rows:
        rates = by_line.setdefault((row.policy, row.option), {})
        if row.avg_jct_s is not None and math.isfinite(row.avg_jct_s):  # a saturated cell: no point to draw
            rates.setdefault(float(row.jobs_per_hour), []).append(row.avg_jct_s / SECONDS_PER_HOUR)
    lines = []
    for (policy, option), rates in by_line.items():
        ordered = sorted(rates.items())
        lines.append(
            SweepLine(
                policy=policy,
                option=option,
                jobs_per_hour=np.array([rate for rate, _ in ordered], dtype=float),
                mean_jct_h=np.array([np.mean(v) for _, v in ordered], dtype=float),
                min_jct_h=np.array([np.min(v) for _, v in ordered], dtype=float),
                max_jct_h=np.array([np.max(v) for _, v in ordered], dtype=float),
                seeds=np.array([len(v) for _, v in ordered], dtype=int),
            )
        )
    return tuple(lines)
