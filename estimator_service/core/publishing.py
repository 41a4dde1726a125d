"""What is worth publishing: a figure's change against the one the mechanism already has.

A figure is sent again when it moved by more than ``tolerance`` (relative), or by more than
``sds`` of its own standard deviation (the uncertainty its confidence states), to or from zero, or
when its provenance changed. The second rule is the scheduler's side of "give or take": a figure
known within 30% that moves by 10% when the completion is refitted, or a class's match changes,
says nothing new, and each such move that reaches the mechanism's material threshold makes it
solve again on noise. On 100-job static traces (4:4:4, 9 of 26 types unknown, packed max-min
fairness, 9 runs) holding back moves within one standard deviation took the learned average JCT
from +6.3% to +4.3% of the oracle's (bench/RESULTS.md); half a deviation gave +5.0%, two +5.2%.

What is sent: a figure rounded to six significant digits (``rounded``), its confidence to three; a
pair's provenance and confidence are its less confident member's (``job_throughput``,
``colocation_estimate``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from common.messages import ColocationEstimate, JobThroughput
from estimator_service.core.beliefs import CONFIDENCE_SD, Belief

Published = JobThroughput | ColocationEstimate


def rounded(value: float) -> float:
    """Six significant digits: far below any estimate's error, and the same figure whatever order
    equal evidence arrived in (sums of floats are not associative)."""
    return float(f"{value:.6g}")


def job_throughput(job_id: str, row: Mapping[str, Belief], colocation_class: str) -> JobThroughput:
    """A job's row as it is sent."""
    return JobThroughput(
        job_id,
        {w: rounded(b.value) for w, b in row.items()},
        {w: b.provenance for w, b in row.items()},
        {w: round(b.confidence, 3) for w, b in row.items()},
        colocation_class,
    )


def colocation_estimate(pair: tuple[str, str], by_type: Iterable[tuple[str, Belief | None, Belief | None]]) -> ColocationEstimate:
    """A pair's fractions as they are sent: ``by_type`` gives each type's fraction of the first
    class and of the second (a type where either is None is left out)."""
    fractions, provenance, confidence = {}, {}, {}
    for w, first, second in by_type:
        if first is None or second is None:
            continue
        fractions[w] = (rounded(first.value), rounded(second.value))
        weaker = first if first.confidence <= second.confidence else second
        provenance[w] = weaker.provenance
        confidence[w] = round(weaker.confidence, 3)
    return ColocationEstimate(pair, fractions, provenance, confidence)


def differs(before: Published | None, now: Published, tolerance: float, sds: float) -> bool:
    """Whether ``now`` says something ``before`` (what was published) does not (module docstring)."""
    if before is None or before.provenance != now.provenance:
        return True
    old = before.throughputs_steps_per_s if isinstance(before, JobThroughput) else before.fractions
    new = now.throughputs_steps_per_s if isinstance(now, JobThroughput) else now.fractions  # type: ignore[union-attr]
    if old.keys() != new.keys():
        return True
    for w, value in new.items():
        allowed = max(tolerance, sds * _sd(now.confidence.get(w, 1.0)))
        for x, y in zip(_as_tuple(old[w]), _as_tuple(value), strict=True):
            if (x <= 0) != (y <= 0) or (x > 0 and abs(math.log(y / x)) > allowed):
                return True
    return False


def _sd(confidence: float) -> float:
    """The standard deviation (log) a confidence states: beliefs.Belief.confidence inverted."""
    if confidence >= 1.0:
        return 0.0
    return CONFIDENCE_SD * math.sqrt(1.0 / max(confidence, 1e-3) - 1.0)


def _as_tuple(value: float | tuple[float, ...]) -> tuple[float, ...]:
    return value if isinstance(value, tuple) else (value,)
