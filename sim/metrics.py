"""A run's numbers: what summary.json reports (the comparison table of several runs is in
sim/comparison.py, the series the plots draw in sim/series.py, a sweep's lines in
sim/sweep_lines.py).

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

from collections.abc import Mapping
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
