"""What was measured of one job: its steps/s alone per accelerator type, and packed per (partner
class, type), each measurement with the worker that made it (a straggler's are left out later)
and whether it was a profiling run. The most recent ``kept`` per figure are kept."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from common.messages import Provenance
from estimator_service.core.beliefs import Source, measured

Measurement = tuple[str, float, bool]  # (worker id, steps/s, profiled)


@dataclass
class JobEvidence:
    job_id: str
    colocation_class: str
    scale_factor: int
    order: int  # submission order: the oldest job of a class is the one profiled
    user: Mapping[str, float] = field(default_factory=dict)  # the user's estimate per type
    alone: dict[str, list[Measurement]] = field(default_factory=dict)
    packed: dict[tuple[str, str], list[Measurement]] = field(default_factory=dict)  # (partner class, type)
    active: bool = True
    # (series key, left-out workers) -> its sources: the estimator asks for the same series many
    # times between two measurements of it
    _sources_cache: dict[tuple[object, frozenset[str]], list[Source]] = field(default_factory=dict, repr=False)

    def record(self, accelerator_type: str, partner_class: str, measurement: Measurement, kept: int) -> None:
        """One measurement, alone (``partner_class`` "") or packed."""
        if partner_class:
            series = self.packed.setdefault((partner_class, accelerator_type), [])
        else:
            series = self.alone.setdefault(accelerator_type, [])
        series.append(measurement)
        if len(series) > kept:
            del series[: len(series) - kept]
        self._sources_cache.clear()

    def alone_sources(self, accelerator_type: str, sd: float, excluded: frozenset[str] = frozenset()) -> list[Source]:
        return self._cached(accelerator_type, self.alone.get(accelerator_type, ()), sd, excluded)

    def packed_sources(
        self, partner_class: str, accelerator_type: str, sd: float, excluded: frozenset[str] = frozenset()
    ) -> list[Source]:
        key = (partner_class, accelerator_type)
        return self._cached(key, self.packed.get(key, ()), sd, excluded)

    def _cached(self, key: object, series, sd: float, excluded: frozenset[str]) -> list[Source]:  # noqa: ANN001
        found = self._sources_cache.get((key, excluded))
        if found is None:
            found = self._sources_cache[(key, excluded)] = _sources(series, sd, excluded)
        return found

    def workers(self) -> set[str]:
        return {m[0] for series in (*self.alone.values(), *self.packed.values()) for m in series}


def _sources(series, sd: float, excluded: Collection[str]) -> list[Source]:  # noqa: ANN001 - list of Measurement
    profiled = [value for worker, value, was_profiled in series if was_profiled and worker not in excluded]
    scheduled = [value for worker, value, was_profiled in series if not was_profiled and worker not in excluded]
    return measured(scheduled, sd) + measured(profiled, sd, Provenance.PROFILED)
