"""The estimator in oracle mode: a measured table taken as the truth (Gavel's simulator with its
estimator off). Same interface as the learned Estimator; measurements change nothing.

A job whose type (or size) the table does not know gets no figures: the mechanism then keeps its
own prior for it (the service says so).
"""

from __future__ import annotations

from common.messages import ColocationEstimate, JobProgress, JobSpec, JobThroughput, Provenance, ThroughputEstimated
from common.throughputs import ThroughputTable
from estimator_service.core.reference import class_of


class OracleEstimator:
    def __init__(self, table: ThroughputTable) -> None:
        self.table = table
        self.revision = 0
        self._active: dict[str, tuple[str, int]] = {}  # job -> (type, scale factor)

    def submitted(self, spec: JobSpec) -> ThroughputEstimated | None:
        if spec.job_id in self._active:
            return None
        if not self.knows(spec):
            return None
        new_class = (spec.job_type, spec.scale_factor) not in self._active.values()
        self._active[spec.job_id] = (spec.job_type, spec.scale_factor)
        pairs = self._pairs_of(spec.job_type, spec.scale_factor) if new_class else ()
        return self._message((self._row(spec.job_id),), pairs)

    def knows(self, spec: JobSpec) -> bool:
        return self.table.has_job(spec.job_type, spec.scale_factor)

    def progress(self, report: JobProgress) -> ThroughputEstimated | None:  # noqa: ARG002 - the table knows
        return None

    def ended(self, job_id: str) -> ThroughputEstimated | None:
        self._active.pop(job_id, None)
        return None

    def everything(self) -> ThroughputEstimated:
        classes = sorted(set(self._active.values()))
        pairs = [
            self._pair(a, b, sf)
            for i, (a, sf) in enumerate(classes) for b, other_sf in classes[i:] if other_sf == sf
        ]
        return self._message(tuple(self._row(j) for j in self._active), tuple(p for p in pairs if p is not None))

    def _message(self, rows: tuple[JobThroughput, ...], pairs: tuple[ColocationEstimate, ...]) -> ThroughputEstimated:
        self.revision += 1
        return ThroughputEstimated(jobs=rows, colocations=pairs, revision=self.revision, mode="oracle")

    def _row(self, job_id: str) -> JobThroughput:
        job_type, scale_factor = self._active[job_id]
        values = {
            w: self.table.isolated_steps_per_s[(job_type, scale_factor, w)]
            for w in self.table.accelerator_types if (job_type, scale_factor, w) in self.table.isolated_steps_per_s
        }
        return JobThroughput(
            job_id, values, dict.fromkeys(values, Provenance.ORACLE), dict.fromkeys(values, 1.0), class_of(job_type, scale_factor)
        )

    def _pairs_of(self, job_type: str, scale_factor: int) -> tuple[ColocationEstimate, ...]:
        others = sorted({t for t, sf in self._active.values() if sf == scale_factor})
        pairs = (self._pair(*sorted((job_type, other), key=lambda t: class_of(t, scale_factor)), scale_factor) for other in others)
        return tuple(p for p in pairs if p is not None)

    def _pair(self, a: str, b: str, scale_factor: int) -> ColocationEstimate | None:
        fractions = {}
        for w in self.table.accelerator_types:
            packed = self.table.pair(a, b, scale_factor, w)
            alone_a = self.table.isolated_steps_per_s.get((a, scale_factor, w), 0.0)
            alone_b = self.table.isolated_steps_per_s.get((b, scale_factor, w), 0.0)
            if packed is None or not (alone_a > 0 and alone_b > 0):
                continue
            fractions[w] = (min(1.0, packed[0] / alone_a), min(1.0, packed[1] / alone_b))
        if not fractions:
            return None
        classes = (class_of(a, scale_factor), class_of(b, scale_factor))
        return ColocationEstimate(classes, fractions, dict.fromkeys(fractions, Provenance.ORACLE), dict.fromkeys(fractions, 1.0))
