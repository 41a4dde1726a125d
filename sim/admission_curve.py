"""Where a run's jobs waited, for admission studies (Blox, EuroSys 2024, figures 12-13): in the
admission queue (arrival to admission) or in the scheduler (admission to completion, less the time
they ran). Pure: read from a SimulationResult's outcomes."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from sim.results import SimulationResult


@dataclass(frozen=True, slots=True)
class Waits:
    jobs: int  # completed jobs counted
    jct_s: float  # mean completion time from arrival
    jct_from_admission_s: float  # mean completion time from admission (Blox's JCT of admitted jobs)
    admission_wait_s: float  # mean time from arrival to admission
    scheduler_wait_s: float  # mean time admitted and not running: JCT from admission less running time


def waits(result: SimulationResult) -> Waits:
    """Over the measured jobs that completed. A job's running time is its leased GPU time over its
    gang (a packed job's shared time counts as running)."""
    measured = set(result.measured_job_ids)
    done = [j for j in result.jobs if j.job_id in measured and j.completion_s is not None]
    if not done:
        raise ValueError("no measured job completed")
    from_admission = [j.jct_from_admission_s for j in done]
    running = [sum(j.gpu_seconds_by_type.values()) / j.scale_factor for j in done]
    return Waits(
        jobs=len(done),
        jct_s=statistics.fmean(j.jct_s for j in done),  # type: ignore[misc]
        jct_from_admission_s=statistics.fmean(from_admission),  # type: ignore[arg-type]
        admission_wait_s=statistics.fmean(j.jct_s - a for j, a in zip(done, from_admission)),  # type: ignore[operator]
        scheduler_wait_s=statistics.fmean(a - r for a, r in zip(from_admission, running)),  # type: ignore[operator]
    )
