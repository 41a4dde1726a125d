"""The throughput estimator service. For now it answers from the measured table (provenance
"oracle"): for every submitted job it publishes how fast the job runs on each accelerator type
alone. Profiling new jobs against reference jobs, matrix completion and online refinement come
with a later issue; they will publish the same message with another
provenance."""

from __future__ import annotations

import structlog

from common.bus import Bus, Delivery
from common.errors import ProblemError
from common.messages import JobSubmitted, Provenance, ThroughputEstimated
from common.throughputs import ThroughputTable

log = structlog.get_logger("gavel.estimator")


class EstimatorService:
    name = "estimator"

    def __init__(self, *, table: ThroughputTable) -> None:
        self._table = table
        self._bus: Bus | None = None

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        await bus.subscribe("estimator.submissions", [JobSubmitted.ROUTING_KEY], self.on_submitted)

    async def stop(self) -> None:
        return None

    async def on_submitted(self, d: Delivery) -> None:
        assert isinstance(d.message, JobSubmitted) and self._bus is not None
        spec = d.message.spec
        throughputs: dict[str, tuple[float, ...]] = {}
        for accelerator_type in self._table.accelerator_types:
            try:
                throughputs[accelerator_type] = (self._table.isolated(spec.job_type, spec.scale_factor, accelerator_type),)
            except ProblemError:
                continue  # not measured there: say nothing rather than guess
        if not throughputs:
            log.warning("no_estimate", job_id=spec.job_id, job_type=spec.job_type, scale_factor=spec.scale_factor)
            return
        estimate = ThroughputEstimated((spec.job_id,), throughputs, Provenance.ORACLE)
        await self._bus.publish(estimate, correlation_id=d.envelope.message_id, mandatory=False)
