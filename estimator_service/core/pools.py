"""What the jobs of one class measured of one figure, pooled: the class's mean, and the same mean
without any one job (a job's own estimate must not count its own measurements twice).

Each job contributes the belief its own measurements give (beliefs.measured), with the spread
between jobs of one class added to its variance (a job's mean estimates the class's mean only up to
that spread). Sums are kept, so leaving one job out costs nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from common.messages import Provenance
from estimator_service.core.beliefs import Belief, Source


@dataclass
class Pool:
    spread_variance: float
    contributions: dict[str, tuple[Belief, int]] = field(default_factory=dict)  # job -> (belief, measurements)
    _weight: float = 0.0
    _weighted_log: float = 0.0
    _zeros: int = 0
    _positives: int = 0
    _by_provenance: dict[Provenance, float] = field(default_factory=dict)

    def put(self, job_id: str, belief: Belief | None, count: int) -> None:
        """Set (or with None remove) a job's contribution."""
        old = self.contributions.pop(job_id, None)
        if old is not None:
            self._add(*old, sign=-1)
        if belief is not None:
            self.contributions[job_id] = (belief, count)
            self._add(belief, count, sign=1)

    def _add(self, belief: Belief, count: int, sign: int) -> None:
        if belief.value <= 0:
            self._zeros += sign * count
            return
        weight = 1.0 / (belief.variance + self.spread_variance)
        self._weight += sign * weight
        self._weighted_log += sign * weight * belief.log_value
        self._positives += sign * count
        self._by_provenance[belief.provenance] = self._by_provenance.get(belief.provenance, 0.0) + sign * weight

    def __len__(self) -> int:
        return len(self.contributions)

    def mean(self, without: str | None = None) -> Source | None:
        """The class's mean as one source (a measured zero when zeros outnumber the rest), leaving
        out ``without``'s contribution; None when nothing is left."""
        weight, weighted_log, zeros, positives = self._weight, self._weighted_log, self._zeros, self._positives
        by_provenance = self._by_provenance
        left_out = self.contributions.get(without) if without is not None else None
        if left_out is not None:
            belief, count = left_out
            if belief.value <= 0:
                zeros -= count
            else:
                w = 1.0 / (belief.variance + self.spread_variance)
                weight -= w
                weighted_log -= w * belief.log_value
                positives -= count
                by_provenance = {**by_provenance, belief.provenance: by_provenance[belief.provenance] - w}
        if zeros > 0 and zeros >= positives:
            return Source(0.0, 0.0, Provenance.MEASURED, zeros)
        if positives <= 0 or weight <= 1e-12:
            return None
        provenance = max(by_provenance, key=lambda p: by_provenance[p])
        return Source(math.exp(weighted_log / weight), 1.0 / weight, provenance, positives)
