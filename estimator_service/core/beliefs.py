"""Combining evidence about one figure (a job's steps/s on a type, or a packed fraction).

Every source says "the figure is x, give or take a factor exp(sd)": a log-normal belief. Sources
combine by precision (1 / variance of the log) weighting, the Bayesian posterior for independent
Gaussian errors in log space, so a measurement (sd ~0.05) outweighs a user's guess (sd 0.5) a
hundredfold, and evidence accumulates: n measurements count as one with variance sd^2 / n (evidence.py).

Zero is not a log-normal value: it says "cannot run (or cannot pack) there" (out of memory). A
measured zero wins unless positive measurements outnumber the zeros; a zero from a prior (the
reference cannot run there) holds only until something positive is measured.

The result carries the provenance of the source with the largest weight, and a confidence in
[0, 1): 1 / (1 + variance / CONFIDENCE_SD^2), so a figure known within 10% has confidence 0.5,
within 1% 0.99, and a guess (sd 1) 0.01.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from common.messages import Provenance

CONFIDENCE_SD = 0.1
MEASUREMENTS = (Provenance.MEASURED, Provenance.PROFILED)


@dataclass(frozen=True, slots=True)
class Belief:
    """A figure (0: cannot), the variance of its log, and where most of it came from."""

    value: float
    variance: float
    provenance: Provenance

    @property
    def confidence(self) -> float:
        return 1.0 / (1.0 + self.variance / CONFIDENCE_SD**2)

    @property
    def log_value(self) -> float:
        return math.log(self.value)


@dataclass(frozen=True, slots=True)
class Source:
    """One piece of evidence: ``value`` >= 0 with ``variance`` of its log (0 values: a zero)."""

    value: float
    variance: float
    provenance: Provenance
    count: int = 1  # measurements behind it (for the zeros-against-positives vote)


def combine(sources: Iterable[Source]) -> Belief | None:
    """The posterior of independent sources (module docstring); None when there is none."""
    weights: dict[Provenance, float] = {}
    total_weight = 0.0
    weighted_log = 0.0
    measured_zeros = 0
    measured_positives = 0
    prior_zero: Source | None = None
    for source in sources:
        if source.value <= 0.0:
            if source.provenance in MEASUREMENTS:
                measured_zeros += source.count
            elif prior_zero is None or source.variance < prior_zero.variance:
                prior_zero = source
            continue
        if source.provenance in MEASUREMENTS:
            measured_positives += source.count
        weight = 1.0 / max(source.variance, 1e-12)
        total_weight += weight
        weighted_log += weight * math.log(source.value)
        weights[source.provenance] = weights.get(source.provenance, 0.0) + weight
    if measured_zeros and measured_zeros >= measured_positives:
        return Belief(0.0, 0.0, Provenance.MEASURED)
    if measured_positives == 0 and prior_zero is not None:
        return Belief(0.0, prior_zero.variance, prior_zero.provenance)
    if total_weight == 0.0:
        return None
    provenance = max(weights, key=lambda p: (weights[p], -_RANK[p]))
    return Belief(math.exp(weighted_log / total_weight), 1.0 / total_weight, provenance)


# Ties between equal weights go to the stronger kind of evidence.
_RANK = {p: i for i, p in enumerate(reversed(Provenance))}
