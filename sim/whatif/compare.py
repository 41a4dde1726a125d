"""The what-if comparison's numbers: per run (the real one and each replay), over the same
measured jobs, with the definitions of sim/metrics.py. Pure.

- JCT: completion - arrival of the measured jobs (those the real run completed); mean and
  percentiles (numpy's linear rule, as sim/metrics.py);
- makespan: from the comparison's time zero (the first arrival, or ``--from``) to the end of the
  round in which the last measured job finished;
- utilisation: busy GPU time / (the cluster's GPUs x makespan), a packed GPU counted once (a fleet
  that changed: over the GPU time it had);
- finish-time fairness rho (Themis, as Gavel's paper defines it; sim/metrics.py
  ``finish_time_fairness``): a job's JCT over the time it would have taken on an equal share of
  the cluster (1/n of every type, n the jobs in the system during its life); 1 is fair, above is
  worse off; the mean and the worst;
- Jain's index over the jobs' normalised rates 1/rho: (sum x)^2 / (n sum x^2), 1 when every job
  got the same share of its fair-share speed, 1/n when one job got all of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np

from common.throughputs import ThroughputTable
from sim.metrics import (
    finish_time_fairness,
    isolated_throughputs_from_table,
    measured_jcts_s,
    summarize,
)
from sim.results import SimulationResult

REAL = "real run"


@dataclass(frozen=True, slots=True)
class RunFigures:
    label: str  # REAL, or the policy replayed
    jobs_completed: int
    avg_jct_s: float | None
    p50_jct_s: float | None
    p90_jct_s: float | None
    p99_jct_s: float | None
    makespan_s: float
    utilization: float | None
    rho_mean: float | None
    rho_worst: float | None
    jain_index: float | None
    avg_jct_vs_real: float | None  # this run's average JCT / the real run's

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def run_figures(
    label: str, result: SimulationResult, table: ThroughputTable, prices_per_hour: Mapping[str, float],
    real_avg_jct_s: float | None = None, fleet_gpus: Sequence[tuple[float, int]] = (),
) -> RunFigures:
    """One run's figures (``result`` with the comparison's time zero at 0). ``fleet_gpus``: the
    cluster's GPUs from each time on, when its fleet changed (utilisation is then over the GPU
    time it had); empty: ``result.cluster`` throughout."""
    isolated = isolated_throughputs_from_table(result, table)
    # every type a job ran on needs a price for the summary's costs, which this comparison does
    # not show: a type without one counts 0
    prices = {**dict.fromkeys(result.cluster, 0.0), **prices_per_hour}
    summary = summarize(result, prices, isolated)
    jct_s = measured_jcts_s(result)
    p50, p90, p99 = (float(v) for v in np.percentile(jct_s, (50, 90, 99))) if len(jct_s) else (None, None, None)
    rho = np.array(list(finish_time_fairness(result, isolated).values()), dtype=float)
    avg = float(jct_s.mean()) if len(jct_s) else None
    return RunFigures(
        label=label, jobs_completed=len(jct_s), avg_jct_s=avg, p50_jct_s=p50, p90_jct_s=p90, p99_jct_s=p99,
        makespan_s=float(result.makespan_s),
        utilization=summary.cluster_utilization if not fleet_gpus else _utilization(result, fleet_gpus),
        rho_mean=float(rho.mean()) if len(rho) else None, rho_worst=float(rho.max()) if len(rho) else None,
        jain_index=jain_index(1.0 / rho) if len(rho) else None,
        avg_jct_vs_real=avg / real_avg_jct_s if avg is not None and real_avg_jct_s else None,
    )


def _utilization(result: SimulationResult, fleet_gpus: Sequence[tuple[float, int]]) -> float | None:
    """Busy GPU time over the GPU time the fleet had from 0 to the makespan (``fleet_gpus``: GPUs
    from each time on, in time order)."""
    busy_s = sum(sum(r.busy_gpu_seconds_by_type.values()) for r in result.rounds)
    edges = [max(0.0, min(t, result.makespan_s)) for t, _ in fleet_gpus[1:]] + [result.makespan_s]
    starts = [0.0, *edges[:-1]]
    had_s = sum(gpus * max(0.0, end - start) for (_, gpus), start, end in zip(fleet_gpus, starts, edges))
    return busy_s / had_s if had_s > 0 else None


def jain_index(values: np.ndarray) -> float | None:
    """(sum x)^2 / (n sum x^2) over positive values; None for none."""
    x = np.asarray(values, dtype=float)
    if not len(x) or not np.any(x):
        return None
    return float(x.sum() ** 2 / (len(x) * np.square(x).sum()))


def job_rows(results: Mapping[str, SimulationResult]) -> tuple[list[str], list[list[object]]]:
    """Each compared job's JCT in every run (jobs.csv): headers, then a row per job of the first
    run's measured ones, in its order (id, job type, arrival s, then a JCT in s per run; None:
    it did not finish there)."""
    labels = list(results)
    first = results[labels[0]]
    measured = set(first.measured_job_ids)
    jct_s = {label: {j.job_id: j.jct_s for j in r.jobs if not j.dropped} for label, r in results.items()}
    rows: list[list[object]] = [
        [j.job_id, j.job_type, j.arrival_s, *(jct_s[label].get(j.job_id) for label in labels)]
        for j in first.jobs if j.job_id in measured
    ]
    return ["job_id", "job_type", "arrival_s", *(f"jct_s {label}" for label in labels)], rows


HEADERS = (
    "run", "jobs", "avg JCT h", "vs real", "p50 h", "p90 h", "p99 h", "makespan h", "util", "rho mean", "rho worst",
    "Jain",
)


def table_rows(runs: Sequence[RunFigures]) -> list[list[str]]:
    """The comparison as text cells, one row per run (HEADERS)."""
    return [
        [
            r.label, str(r.jobs_completed), _hours(r.avg_jct_s), _ratio(r.avg_jct_vs_real), _hours(r.p50_jct_s),
            _hours(r.p90_jct_s), _hours(r.p99_jct_s), _hours(r.makespan_s), _share(r.utilization), _num(r.rho_mean),
            _num(r.rho_worst), _num(r.jain_index),
        ]
        for r in runs
    ]


def _hours(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:.2f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value - 1:+.1%}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
