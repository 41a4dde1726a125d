"""What a simulation run records: one outcome per job, one record per round, and the run's totals.

The metrics (sim/metrics.py), the files a run writes (summary.json, jobs.csv) and the plots are
all computed from these values, so the bus-free path and the services path, which both produce a
SimulationResult, are measured the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sim.estimation import EstimationSample
from sim.faults import FaultReport


@dataclass(frozen=True, slots=True)
class JobOutcome:
    job_id: str
    job_type: str
    scale_factor: int
    priority_weight: float
    total_steps: int
    arrival_s: float
    start_s: float | None  # first time it ran; None if it never did
    completion_s: float | None  # None: not finished when the run stopped, or dropped
    steps_done: int
    gpu_seconds_by_type: Mapping[str, float]  # leased GPU time (s GPUs x lease time), per type
    dropped: bool = False  # given up on (Gavel: a gang that failed 5 times in a row)
    # when it joined the scheduled set, where an admission policy ran (core/seams/admission.py);
    # None: at the first boundary after its arrival (accept_all)
    admitted_s: float | None = None

    @property
    def jct_s(self) -> float | None:
        return None if self.completion_s is None else self.completion_s - self.arrival_s

    @property
    def jct_from_admission_s(self) -> float | None:
        """Its completion time counted from its admission (Blox's JCT of admitted jobs)."""
        if self.completion_s is None:
            return None
        return self.completion_s - (self.arrival_s if self.admitted_s is None else self.admitted_s)


@dataclass(frozen=True, slots=True)
class RoundRecord:
    round_id: int
    start_s: float
    end_s: float
    busy_gpus_by_type: Mapping[str, int]  # GPUs leased in this round
    busy_gpu_seconds_by_type: Mapping[str, float]  # GPU time those leases actually ran
    jobs_running: int
    jobs_waiting: int  # admitted, unfinished, not running this round (the queue)
    leases_extended: int
    lease_opportunities: int  # leases of the previous round whose jobs were still active
    reset: bool  # the allocation was recomputed at this round's start
    leases: int = 0  # leases dispatched; those not extended paid a restore (a move or a first start)


@dataclass(frozen=True, slots=True)
class SimulationResult:
    policy: str
    preset: str
    cluster: Mapping[str, int]  # accelerator type -> GPUs
    round_s: float
    seed: int
    jobs: tuple[JobOutcome, ...]
    rounds: tuple[RoundRecord, ...]
    makespan_s: float  # simulated time when the run stopped
    measured_job_ids: tuple[str, ...]  # the window (all jobs when no window was given)
    resets: int
    solve_times_s: tuple[float, ...]  # one per allocation computed
    wall_s: float = 0.0
    rejected_job_ids: tuple[str, ...] = ()  # submissions that could never run on this cluster
    # the estimates' error at each solve (a learned estimator only: sim/estimation.py)
    estimation: tuple[EstimationSample, ...] = ()
    estimator: str = "oracle"  # oracle | learned
    unknown_types: tuple[str, ...] = ()  # job types the estimator and the mechanism were not told of
    faults: FaultReport | None = None  # what a run with faults injected and saw (sim/faults.py); None: none
    # the run's last solve failed with this reason (either engine): it ended on the allocation
    # kept in force (degraded mode), not on the policy's ("" it answered)
    policy_error: str = ""
