"""What was measured of one job: its steps/s alone per accelerator type, and packed per (partner
class, type). A figure's measurements are kept as sums per (worker, profiled or not): the count
of positive ones, the sum of their logs, and the count of zeros. So a straggler's are left out by
leaving out its sums, and a long job costs no more than a short one."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from common.messages import Provenance
from estimator_service.core.beliefs import Source

# (worker id, profiled) -> [positive measurements, sum of their logs, zero measurements]
Series = dict[tuple[str, bool], list[float]]


@dataclass
class JobEvidence:
    job_id: str
    colocation_class: str
    scale_factor: int
    order: int  # submission order: the oldest job of a class is the one profiled
    user: Mapping[str, float] = field(default_factory=dict)  # the user's estimate per type
    alone: dict[str, Series] = field(default_factory=dict)
    packed: dict[tuple[str, str], Series] = field(default_factory=dict)  # (partner class, type)
    active: bool = True
    leases: set[str] = field(default_factory=set)  # whose reports were counted (redeliveries are not)
    # (series key, left-out workers) -> its sources: the estimator asks for the same series many
    # times between two measurements of it
    _sources_cache: dict[tuple[object, frozenset[str]], list[Source]] = field(default_factory=dict, repr=False)

    def record(self, accelerator_type: str, partner_class: str, worker_id: str, steps_per_s: float, profiled: bool) -> None:
        """One measurement, alone (``partner_class`` "") or packed."""
        if partner_class:
            series = self.packed.setdefault((partner_class, accelerator_type), {})
        else:
            series = self.alone.setdefault(accelerator_type, {})
        sums = series.setdefault((worker_id, profiled), [0, 0.0, 0])
        if steps_per_s > 0:
            sums[0] += 1
            sums[1] += math.log(steps_per_s)
        else:
            sums[2] += 1
        self._sources_cache.clear()

    def alone_sources(self, accelerator_type: str, sd: float, excluded: frozenset[str] = frozenset()) -> list[Source]:
        return self._cached(accelerator_type, self.alone.get(accelerator_type), sd, excluded)

    def packed_sources(
        self, partner_class: str, accelerator_type: str, sd: float, excluded: frozenset[str] = frozenset()
    ) -> list[Source]:
        key = (partner_class, accelerator_type)
        return self._cached(key, self.packed.get(key), sd, excluded)

    def alone_count(self, accelerator_type: str, worker_id: str) -> int:
        """Measurements of the job alone on the type made by the worker."""
        series = self.alone.get(accelerator_type, {})
        return int(sum(sum((s[0], s[2])) for (w, _), s in series.items() if w == worker_id))

    def workers(self) -> set[str]:
        return {w for series in (*self.alone.values(), *self.packed.values()) for w, _ in series}

    def _cached(self, key: object, series: Series | None, sd: float, excluded: frozenset[str]) -> list[Source]:
        found = self._sources_cache.get((key, excluded))
        if found is None:
            found = self._sources_cache[(key, excluded)] = _sources(series or {}, sd, excluded)
        return found


def _sources(series: Series, sd: float, excluded: frozenset[str]) -> list[Source]:
    """The measurements as sources: per kind (scheduled, profiled), the geometric mean of the
    positive ones (variance sd^2 / n) and the zeros."""
    out = []
    for profiled, provenance in ((False, Provenance.MEASURED), (True, Provenance.PROFILED)):
        positives = zeros = 0
        logs = 0.0
        for (worker, was_profiled), (n, log_sum, z) in series.items():
            if was_profiled == profiled and worker not in excluded:
                positives += int(n)
                logs += log_sum
                zeros += int(z)
        if positives:
            out.append(Source(math.exp(logs / positives), sd * sd / positives, provenance, positives))
        if zeros:
            out.append(Source(0.0, 0.0, provenance, zeros))
    return out
