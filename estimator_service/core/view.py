"""What the estimator's figure computations read: its evidence as it stands when a figure is asked for.

The estimator (estimator.py) holds the evidence and applies each input to it; the figures (rows.py:
a job's steps/s alone per type, priors.py: the sources of them beyond measurements, fractions.py:
packed fractions) are functions of an ``EvidenceView`` it builds when it asks for one. They change
none of it; a figure that reads another (a fraction reads its jobs' rows, a row a fraction's prior
and its class's match) gets it through a function the estimator passes, which answers from its
caches. ``ClassEvidence`` is what the estimator holds of one colocation class.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from estimator_service.core.beliefs import Belief, Source
from estimator_service.core.calibration import Fit
from estimator_service.core.colocation import ColocationModel
from estimator_service.core.evidence import JobEvidence, Stragglers
from estimator_service.core.pools import Pool
from estimator_service.core.reference import ReferenceSet
from estimator_service.core.settings import EstimatorSettings

Row = dict[str, Belief]  # accelerator type -> belief
Cell = tuple[int, int, int]  # (direction, feature type position, reference index) in a completion row


@dataclass
class ClassEvidence:
    """One colocation class: its jobs, and the completion cells measured of it (a new class)."""

    name: str
    scale_factor: int
    jobs: list[str] = field(default_factory=list)  # pooled, oldest first (at most pooled_jobs)
    active: set[str] = field(default_factory=set)
    stamp: int = 0  # grows whenever its evidence changes (caches key on it)
    evidenced: set[Cell] = field(default_factory=set)  # completion cells with measurements (a new class)


class EvidenceView(NamedTuple):
    """The estimator's evidence (its containers, not copies) and what it applies to the table now.

    (A named tuple rather than a frozen dataclass: one is built for each figure computed, ~200,000
    in a long learned simulation, and a frozen dataclass takes 2.5 us to build, five times as long.)"""

    settings: EstimatorSettings
    references: ReferenceSet
    colocation: ColocationModel  # (its lookups refit the completion when a row changed since)
    jobs: Mapping[str, JobEvidence]  # pooled jobs, active or not
    classes: Mapping[str, ClassEvidence]
    pools: Mapping[tuple[str, str], Pool]  # (class, type) -> its jobs' measurements alone, pooled
    packed_jobs: Mapping[tuple[str, str, str], Sequence[str]]  # (class, partner, type) -> jobs measured so
    calibrated: Fit  # the calibration applied
    slow: Stragglers  # flagged workers: their measurements count where no healthy one's do
    types_out: tuple[str, ...]  # the types published
    typical: Mapping[int, np.ndarray]  # scale factor -> (K,) the typical reference job's steps/s

    @property
    def types(self) -> tuple[str, ...]:
        return self.references.accelerator_types

    def pooled(self, name: str, accelerator_type: str, without: str | None = None) -> Source | None:
        """The class's pooled mean on the type (leaving out ``without``'s own), None when none."""
        pool = self.pools.get((name, accelerator_type))
        return None if pool is None else pool.mean(without)

    def measured_alone(self, name: str, accelerator_type: str) -> bool:
        mean = self.pooled(name, accelerator_type)
        return mean is not None and mean.value > 0
