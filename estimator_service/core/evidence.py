"""What was measured of one job: its steps/s alone per accelerator type, and packed per (partner
class, type). A figure's measurements are kept as sums per (worker, profiled or not): the count
of positive ones, the sum of their logs, and the count of zeros. So a straggler's can be told apart
(stragglers.py: they count only where no healthy worker measured the figure, scaled by the
straggler's slowness), and a long job costs no more than a short one. ``usable``: whether a
report measured anything."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from common.messages import JobProgress, Provenance
from estimator_service.core.beliefs import Source

# (worker id, profiled) -> [positive measurements, sum of their logs, zero measurements]
Series = dict[tuple[str, bool], list[float]]


@dataclass(frozen=True)
class Stragglers:
    """The flagged workers and how slow each is against its peers (log measured / predicted).

    A figure some healthy worker measured is that worker's: a straggler's measurements of it are
    left out. A figure only stragglers measured is theirs, each measurement divided by its
    worker's slowness (what a healthy peer would have measured), with ``variance`` added for what
    that slowness is not known to (a median over a few jobs)."""

    log_ratios: frozenset[tuple[str, float]] = frozenset()
    variance: float = 0.0
    by_worker: Mapping[str, float] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @classmethod
    def of(cls, log_ratios: Mapping[str, float], variance: float) -> Stragglers:
        return cls(frozenset(log_ratios.items()), variance, dict(log_ratios))  # (a plain dict: it is pickled with the model)

    def __bool__(self) -> bool:
        return bool(self.log_ratios)


NO_STRAGGLERS = Stragglers()


def usable(report: JobProgress) -> bool:
    """A report that measured something: not a crash, and a real worker's with stepping time (a
    simulated fleet's, which has no breakdown, is the simulator's measurement: a zero there is a
    job that cannot run)."""
    if report.outcome in ("crashed", "killed"):
        return False
    real = report.startup_s > 0 or report.restore_s > 0 or report.stepping_s > 0 or report.checkpoint_s > 0
    # a real lease that ended before its first step (start-up longer than the lease) measured
    # nothing: a job that truly cannot run on a type crashes there (out of memory)
    return report.stepping_s > 0 and report.steps_done > 0 if real else True


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
    # (series key, stragglers' ratios, left-out workers) -> its sources: the estimator asks for the
    # same series many times between two measurements of it (keyed on the frozenset, whose hash
    # Python keeps, rather than on the Stragglers, whose hash a dataclass computes at every call)
    _sources_cache: dict[tuple[object, frozenset[tuple[str, float]], frozenset[str]], list[Source]] = field(
        default_factory=dict, repr=False
    )

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

    def alone_sources(
        self, accelerator_type: str, sd: float, stragglers: Stragglers = NO_STRAGGLERS, excluded: frozenset[str] = frozenset()
    ) -> list[Source]:
        """Its measurements alone on the type as sources (``excluded`` workers' left out)."""
        return self._cached(accelerator_type, self.alone.get(accelerator_type), sd, stragglers, excluded)

    def packed_sources(
        self, partner_class: str, accelerator_type: str, sd: float, stragglers: Stragglers = NO_STRAGGLERS,
        excluded: frozenset[str] = frozenset(),
    ) -> list[Source]:
        key = (partner_class, accelerator_type)
        return self._cached(key, self.packed.get(key), sd, stragglers, excluded)

    def alone_count(self, accelerator_type: str, worker_id: str) -> int:
        """Measurements of the job alone on the type made by the worker."""
        series = self.alone.get(accelerator_type, {})
        return int(sum(sum((s[0], s[2])) for (w, _), s in series.items() if w == worker_id))

    def mean_log(self, accelerator_type: str, worker_id: str) -> float | None:
        """The mean log of its positive measurements alone on the type made by the worker."""
        sums = [s for (w, _), s in self.alone.get(accelerator_type, {}).items() if w == worker_id]
        count = sum(s[0] for s in sums)
        return sum(s[1] for s in sums) / count if count else None

    def workers(self) -> set[str]:
        return {w for series in (*self.alone.values(), *self.packed.values()) for w, _ in series}

    def _cached(
        self, key: object, series: Series | None, sd: float, stragglers: Stragglers, excluded: frozenset[str]
    ) -> list[Source]:
        cache_key = (key, stragglers.log_ratios, excluded)
        found = self._sources_cache.get(cache_key)
        if found is None:
            found = self._sources_cache[cache_key] = _sources(series or {}, sd, stragglers, excluded)
        return found


def _sources(series: Series, sd: float, stragglers: Stragglers, excluded: frozenset[str]) -> list[Source]:
    """The measurements as sources: per kind (scheduled, profiled), the geometric mean of the
    positive ones (variance sd^2 / n) and the zeros. Stragglers' only where no healthy worker
    measured (Stragglers)."""
    slow = stragglers.by_worker
    healthy = not slow or any(w not in slow and w not in excluded for w, _ in series)
    out = []
    for profiled, provenance in ((False, Provenance.MEASURED), (True, Provenance.PROFILED)):
        positives = zeros = 0
        logs = 0.0
        for (worker, was_profiled), (n, log_sum, z) in series.items():
            if was_profiled != profiled or worker in excluded:
                continue
            if worker in slow:
                if healthy:
                    continue
                log_sum -= n * slow[worker]  # what a healthy peer would have measured
            positives += int(n)
            logs += log_sum
            zeros += int(z)
        if positives:
            variance = sd * sd / positives + (0.0 if healthy else stragglers.variance)
            out.append(Source(math.exp(logs / positives), variance, provenance, positives))
        if zeros:
            out.append(Source(0.0, 0.0, provenance, zeros))
    return out
