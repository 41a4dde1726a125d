"""The estimator in a simulation: which one, what it may know, and (for the bus-free path) the
estimator core called in the loop exactly where the services would hear from it.

``EstimationConfig``: ``oracle`` (the mechanism reads the true table, as Gavel's simulator with
its estimator off: the default, and what every calibration against Gavel uses) or ``learned``
(the mechanism schedules on the estimator's estimates). ``unknown_types`` are removed from what
the estimator and the mechanism know (their reference table) but still run at their true speed:
only the simulated hardware holds the truth. Measurements are the true rates times a log-normal
factor of standard deviation ``measurement_noise``, drawn from (seed, job, lease start), so both
engines draw the same.

``InLoopEstimator`` is the bus-free path's estimator: it takes each arrival and each lease report
in the order the services would deliver them (by time), queues the estimator's answers, and hands
them to the mechanism's core at the next boundary (mechanism_service/core/learning.py), which is
when the mechanism service applies them too.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from common.messages import AllocationRequested, JobProgress, JobSpec, ThroughputEstimated
from common.throughputs import ThroughputTable
from estimator_service.core.settings import EstimatorSettings
from mechanism_service.core.estimates import EstimateBook
from mechanism_service.core.learning import take_estimate
from mechanism_service.core.model import MechanismState, Placement
from mechanism_service.core.reducers import LeaseResult
from sim.estimation import EstimationSample, sample
from sim.physics import true_rates
from sim.traces import TraceJob

if TYPE_CHECKING:
    from estimator_service.core.estimator import Estimator
    from estimator_service.core.oracle import OracleEstimator

MODES = ("oracle", "learned")


@dataclass(frozen=True, slots=True)
class EstimationConfig:
    mode: str = "oracle"
    unknown_types: tuple[str, ...] = ()
    reference_models: int | None = None  # Gavel's num_reference_models (None: every known type)
    settings: EstimatorSettings = field(default_factory=EstimatorSettings)
    measurement_noise: float = 0.0  # sd of the log of a measurement
    # What users said at submission (gavel submit --throughput): job id -> type -> steps/s
    user_estimates: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    @property
    def learned(self) -> bool:
        return self.mode == "learned"

    def reference_table(self, table: ThroughputTable) -> ThroughputTable:
        """What the estimator and the mechanism know: the table without the unknown types."""
        return table.without(self.unknown_types) if self.unknown_types else table

    def core(self, table: ThroughputTable, seed: int) -> Estimator | OracleEstimator:
        # Imported here: a run with the oracle (the default) never builds an estimator.
        from estimator_service.core.estimator import Estimator  # noqa: PLC0415
        from estimator_service.core.oracle import OracleEstimator  # noqa: PLC0415
        from estimator_service.core.reference import reference_set  # noqa: PLC0415

        if not self.learned:
            return OracleEstimator(table)
        references = reference_set(
            self.reference_table(table), keep=self.reference_models, rng=np.random.default_rng([seed, 11])
        )
        return Estimator(references, self.settings)


def measurement_factor(seed: int, job_id: str, started_s: float, noise: float) -> float:
    """exp(noise x z), z standard normal, the same for the same (seed, job, lease start)."""
    if noise <= 0:
        return 1.0
    z = np.random.default_rng([seed, zlib.crc32(job_id.encode()), int(round(started_s * 1000))]).standard_normal()
    return math.exp(noise * float(z))


def spec_of(job: TraceJob, user_estimates: Mapping[str, Mapping[str, float]] | None = None) -> JobSpec:
    """The submission of a trace job, with what its user estimated of it (if anything)."""
    estimate = (user_estimates or {}).get(job.job_id)
    return JobSpec(
        job.job_id, job.job_type, job.total_steps, job.scale_factor, job.priority_weight, job.slo_s,
        job.entity, job.command, job.arrival_time_s, throughput_estimate_steps_per_s=dict(estimate) if estimate else None,
    )


class InLoopEstimator:
    def __init__(self, config: EstimationConfig, table: ThroughputTable, seed: int) -> None:
        self.config = config
        self.table = table
        self.seed = seed
        self.core = config.core(table, seed)
        self.book = EstimateBook()
        self.pending: list[ThroughputEstimated] = []
        self.ended_jobs: set[str] = set()
        self.samples: list[EstimationSample] = []
        self._workers: dict[int, str] = {}  # GPU id -> the simulated worker (server) that holds it

    def hear(
        self, arrivals: Sequence[TraceJob], results: Sequence[LeaseResult], started_s: float, state: MechanismState
    ) -> None:
        """The round's arrivals and lease reports, in the order they happened (by time; a tie: the
        arrival first, then leases in dispatch order)."""
        events: list[tuple[float, int, int, object]] = [(j.arrival_time_s, 0, n, j) for n, j in enumerate(arrivals)]
        events += [(r.finish_s, 1, n, r) for n, r in enumerate(results)]
        for _, kind, _, item in sorted(events, key=lambda e: e[:3]):
            if kind == 0:
                self._keep(self.core.submitted(spec_of(item, self.config.user_estimates)))  # type: ignore[arg-type]
            else:
                for report in self._reports(item, started_s, state):  # type: ignore[arg-type]
                    self._keep(self.core.progress(report))

    def ended(self, job_ids: Iterable[str]) -> None:
        for job_id in job_ids:
            self.ended_jobs.add(job_id)
            self._keep(self.core.ended(job_id))

    def take(self, state: MechanismState, estimates: Sequence[ThroughputEstimated], rates) -> None:  # noqa: ANN001
        """What was heard before this boundary, applied as the mechanism service does (step 3)."""
        for estimate in estimates:
            take_estimate(state, self.book, estimate, rates, self.ended_jobs)

    def captured(self) -> list[ThroughputEstimated]:
        """The answers so far; later ones wait for the next boundary."""
        pending, self.pending = self.pending, []
        return pending

    def observe(self, request: AllocationRequested, time_s: float) -> None:
        observed = sample(request, self.table, time_s)
        if observed is not None:
            self.samples.append(observed)

    def _keep(self, estimate: ThroughputEstimated | None) -> None:
        if estimate is not None:
            self.pending.append(estimate)

    def _reports(self, result: LeaseResult, started_s: float, state: MechanismState) -> list[JobProgress]:
        """What the simulated fleet reports for a lease (sim/fleet.py): each member's steps, and
        its true rate times the measurement's noise."""
        jobs = [state.jobs.get(i) or _retired(state, i) for i in result.entry]
        w = result.placement.accelerator_type
        rates = true_rates(self.table, [j.job_type for j in jobs], jobs[0].scale_factor, w)
        worker = min(self._worker_of(state, result.placement))
        ids = [j.job_id for j in jobs]
        return [
            JobProgress(
                job_id=job.job_id, worker_id=worker, lease_id="", round_id=0, steps_done=steps,
                elapsed_s=result.finish_s - started_s,
                throughput_steps_per_s=rate * measurement_factor(self.seed, job.job_id, started_s, self.config.measurement_noise),
                accelerator_type=w, packed_with=tuple(other for other in ids if other != job.job_id),
            )
            for job, steps, rate in zip(jobs, result.steps, rates, strict=True)
        ]

    def _worker_of(self, state: MechanismState, placement: Placement) -> list[str]:
        if not self._workers:
            for w, servers in state.servers.items():
                for s, gpus in enumerate(servers):
                    self._workers.update(dict.fromkeys(gpus, f"{w}-{s}"))
        return [self._workers[g] for g in placement.worker_ids]


def _retired(state: MechanismState, index: int):  # noqa: ANN202 - a JobState
    """A job settled out of the active set already (the fastpath settles before it reports)."""
    return next(j for j in state.completed if j.index == index)
