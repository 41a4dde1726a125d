"""The throughput estimator service: submissions, progress reports and job ends in, estimates out
(docs/estimator.md).

One durable queue, ``estimator.inputs`` (common/topology.py), declared by the topology as well as
by the service, so an estimator started after jobs were submitted still sees them; one queue for
every input, so a job's progress always follows its submission. Inputs are handled one at a time,
in order (the model is a sequence of updates).

Each input, as numbered steps:

1. append its wire bytes to the state journal (when there is one);
2. hand it to the core (learned: estimator_service/core/estimator.py; oracle: a table taken as
   the truth), which says what changed;
3. commit the journal, then publish what changed (ThroughputEstimated) and acknowledge.

A restarted estimator loads its last snapshot, replays the inputs after it through the same core
(the same inputs in the same order make the same model), and publishes the whole current picture
once: a mechanism that kept scheduling on the last estimates meanwhile is brought up to date.
A snapshot of the model is written every ``SNAPSHOT_EVERY`` inputs, so a replay stays short.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

import structlog

from common.bus import Bus, Delivery
from common.codec import DEFAULT_CODEC
from common.journal import Journal, wire_bytes
from common.messages import (
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobProgress,
    JobRejected,
    JobSpec,
    JobSubmitted,
    ThroughputEstimated,
)
from common.messages.base import Message
from common.metrics import (
    CollectorRegistry,
    FunctionCollector,
    GaugeMetricFamily,
    LoopMetrics,
    Spread,
    Tally,
    build_info,
    registry_or_private,
)
from common.topology import ESTIMATOR_INPUTS
from estimator_service.core.oracle import OracleEstimator

log = structlog.get_logger("gavel.estimator")

SNAPSHOT_EVERY = 2_000  # inputs between snapshots: a restart replays at most this many (~1 s)
JOURNAL_LABEL = "estimator state"
ERROR_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, float("inf"))


class EstimatorMetrics:
    """docs/metrics.md, "Estimator". The error of a measurement is against the estimate the
    estimator last published for that job on that type, alone (what the mechanism scheduled on);
    the shell keeps those figures for the active jobs only."""

    def __init__(self, registry: CollectorRegistry | None, core: Callable[[], object]) -> None:
        r = registry_or_private(registry)
        build_info(r, "estimator")
        self._core = core  # the estimator's core as it is now (a restart replaces it with its snapshot)
        r.register(FunctionCollector(self._speed))
        m = LoopMetrics(r)  # counted on the loop's thread, one input at a time
        self.measurements = m.add(Tally("gavel_estimator_measurements", "lease reports taken in"))
        self.error = m.add(Spread(
            "gavel_estimator_prediction_error_ratio", "abs(measured / predicted - 1) of a measurement alone", ERROR_BUCKETS
        ))
        self.profiling_requests = m.add(Tally("gavel_estimator_profiling_requests", "runs asked for"))
        self._published: dict[str, dict[str, float]] = {}  # job id -> type -> steps/s published

    def measured(self, report: JobProgress) -> None:
        self.measurements.inc()
        predicted = self._published.get(report.job_id, {}).get(report.accelerator_type, 0.0)
        if predicted > 0.0 and report.throughput_steps_per_s > 0.0 and not report.packed_with:
            self.error.observe(abs(report.throughput_steps_per_s / predicted - 1.0))

    def published(self, out: ThroughputEstimated) -> None:
        for job in out.jobs:
            self._published.setdefault(job.job_id, {}).update(job.throughputs_steps_per_s)
        self.profiling_requests.inc((), sum(1 for request in out.profiling if request.cells))

    def ended(self, job_id: str) -> None:
        self._published.pop(job_id, None)

    def _speed(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "gavel_estimator_worker_speed_ratio", "a worker's measured steps/s over its peers' prediction, its recent jobs",
            labels=("worker_id",),
        )
        watch = getattr(self._core(), "stragglers", None)  # a learned estimator's (an oracle judges nobody)
        for worker_id, ratio in sorted(watch.speed_ratios().items() if watch is not None else ()):
            family.add_metric((worker_id,), ratio)
        yield family


class Core(Protocol):
    revision: int

    def submitted(self, spec: JobSpec) -> ThroughputEstimated | None: ...
    def progress(self, report: JobProgress) -> ThroughputEstimated | None: ...
    def ended(self, job_id: str) -> ThroughputEstimated | None: ...
    def everything(self) -> ThroughputEstimated: ...


class EstimatorService:
    name = "estimator"

    def __init__(
        self, *, core: Core, journal: Journal | None = None, mode: str = "learned", registry: CollectorRegistry | None = None,
    ) -> None:
        self.core = core
        self.metrics = EstimatorMetrics(registry, lambda: self.core)
        self._journal = journal
        self._mode = mode
        self._bus: Bus | None = None
        self._since_snapshot = 0
        self._log = log.bind(mode=mode)

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        recovered = self._recover() if self._journal is not None else 0
        if recovered:
            # what the mechanism may have missed while we were down, said once before any new
            # input's answer (it absorbs repeats; a complete picture withdraws what it leaves out)
            await bus.publish(self.core.everything(), mandatory=False)
        await bus.subscribe(ESTIMATOR_INPUTS.name, list(ESTIMATOR_INPUTS.bindings), self.on_input, prefetch=256, concurrency=1)

    async def stop(self) -> None:
        if self._journal is not None:
            self._save_snapshot()
            self._journal.close()

    async def on_input(self, d: Delivery) -> None:
        assert self._bus is not None
        if self._journal is not None:
            self._journal.append("input", wire_bytes(d))
        message = d.message
        if isinstance(message, JobProgress):
            self.metrics.measured(message)
        elif isinstance(message, (JobCompleted, JobFailed, JobCancelled, JobRejected)):
            self.metrics.ended(message.job_id)
        out = self._apply(message, say=True)
        if self._journal is not None:
            self._journal.commit()
            self._since_snapshot += 1
            if self._since_snapshot >= SNAPSHOT_EVERY:
                self._save_snapshot()
        if out is not None:
            for flag in out.stragglers:
                if flag.flagged:
                    self._log.warning(
                        "straggler_detected", worker_id=flag.worker_id, speed_vs_predicted=round(flag.ratio, 3), jobs=flag.jobs,
                        action="its measurements are left out of the estimates",
                    )
                else:
                    self._log.info("straggler_recovered", worker_id=flag.worker_id, speed_vs_predicted=round(flag.ratio, 3))
            self.metrics.published(out)
            await self._bus.publish(out, correlation_id=d.envelope.message_id, mandatory=False)

    def _apply(self, message: Message, *, say: bool = False) -> ThroughputEstimated | None:
        """One input through the core (the same call at replay, where ``say`` is off)."""
        if isinstance(message, JobSubmitted):
            spec = message.spec
            if say and isinstance(self.core, OracleEstimator) and not self.core.knows(spec):
                self._log.warning(
                    "no_estimate", job_id=spec.job_id, job_type=spec.job_type, scale_factor=spec.scale_factor,
                    reason="the oracle's table has no such job type and size: the mechanism keeps its prior for it",
                )
            return self.core.submitted(spec)
        if isinstance(message, JobProgress):
            return self.core.progress(message)
        if isinstance(message, (JobCompleted, JobFailed, JobCancelled, JobRejected)):
            return self.core.ended(message.job_id)
        return None

    # -- state ---------------------------------------------------------------------------------

    def _recover(self) -> int:
        """Load the last snapshot and replay the inputs after it; how many inputs the model holds
        (0: a new state)."""
        assert self._journal is not None
        snapshot, last_seq = self._journal.load_snapshot()
        if snapshot is not None:
            self.core = snapshot
        replayed = 0
        for _, kind, body, _ in self._journal.events(after_seq=last_seq, kind="input"):
            self._apply(DEFAULT_CODEC.decode(body).message)
            replayed += 1
        self._since_snapshot = replayed
        if snapshot is not None or replayed:
            self._log.info(
                "estimator_recovered", journal=str(self._journal.path), snapshot=snapshot is not None,
                inputs_replayed=replayed, revision=self.core.revision,
            )
        return int(snapshot is not None) + replayed

    def _save_snapshot(self) -> None:
        assert self._journal is not None
        self._journal.save_snapshot(self.core)
        self._since_snapshot = 0

