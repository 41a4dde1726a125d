"""The throughput estimator service. For now it answers from the measured table (provenance
"oracle"): for every submitted job it publishes how fast the job runs on each accelerator type
alone. Profiling new jobs against reference jobs, matrix completion and online refinement come
with a later issue; they will publish the same message with another
provenance."""

from __future__ import annotations

import structlog

from common.bus import Bus, Delivery
from common.messages import JobSubmitted
from common.throughputs import ThroughputTable
from estimator_service.core.oracle import OracleEstimator

log = structlog.get_logger("gavel.estimator")


class EstimatorService:
    name = "estimator"

    def __init__(self, *, table: ThroughputTable) -> None:
        self._core = OracleEstimator(table)
        self._bus: Bus | None = None

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        await bus.subscribe("estimator.submissions", [JobSubmitted.ROUTING_KEY], self.on_submitted)

    async def stop(self) -> None:
        return None

    async def on_submitted(self, d: Delivery) -> None:
        assert isinstance(d.message, JobSubmitted) and self._bus is not None
        spec = d.message.spec
        estimate = self._core.submitted(spec)
        if estimate is None:
            log.warning("no_estimate", job_id=spec.job_id, job_type=spec.job_type, scale_factor=spec.scale_factor)
            return
        await self._bus.publish(estimate, correlation_id=d.envelope.message_id, mandatory=False)
