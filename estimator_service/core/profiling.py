"""What the estimator asks the mechanism to measure (ProfilingRequest), and in what order.

Per class the reference set does not know, its oldest active job is profiled: alone on every
feature type not yet measured, then packed with another job of its own class on each type (when
one is active: a static trace holds several jobs of a class, and two of them sharing a GPU is a
pair the completion only guesses, through the class's match), then packed with reference classes
until ``profiling_percentage`` of its (type, reference) cells are measured (Gavel's
profiling_percentage). The reference cells are asked type after type for each reference in turn,
so whatever share gets measured covers every type: asked type by type, the 13 cells of 25% were
all on the first type (k80), and the completion guessed every v100 fraction from k80's.

Across classes, runs alone come first. The mechanism serves requests in job order, each job's
first servable cell, within a budget (mechanism_service/core/profiling.py): about one lease a
round on a 12-GPU cluster at the default share. Asked at once, the first class's 13 packed cells
held back every later class's runs alone for as many rounds: on a static trace (100 jobs at
t = 0, 9 of them new classes, 4:4:4) the last new class was first measured alone after ~6 hours,
and until then its speeds were the typical job's, wrong by 100% on average. So packed cells are
asked only while no new class lacks a run alone that can be served: on a type some worker has
reported from with a gang that large, where the job is not believed unable to run (a cell the
mechanism would never serve must not hold the others back for ever).

``requests`` gives a class's requests from the estimator's evidence (view.py), ``packing_open``
whether packed cells may be asked; ``wanted``, ``blocks_packing`` and ``request`` decide on plain
values.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from common.messages import JobThroughput, ProfileCell, ProfilingRequest
from estimator_service.core.colocation import WITH, GroupModel
from estimator_service.core.view import Cell, ClassEvidence, EvidenceView


@dataclass(frozen=True, slots=True)
class Wanted:
    """What a new class still lacks."""

    alone: tuple[ProfileCell, ...]
    packed: tuple[ProfileCell, ...]
    packed_wanted: int


def wanted(
    name: str,
    feature_types: tuple[str, ...],
    measured_alone: Collection[str],
    measured_with_itself: Collection[str] | None,
    model: GroupModel | None,
    evidenced: Collection[Cell],
    percentage: float,
) -> Wanted:
    """A new class's runs alone on the types not measured, packed with itself on the types not
    measured (``measured_with_itself`` None: no other job of the class to pair with), and with
    references (every cell not measured, so many wanted) until ``percentage`` of those are."""
    alone = tuple(ProfileCell(w) for w in feature_types if w not in measured_alone)
    if model is None or percentage <= 0:
        return Wanted(alone, (), 0)
    itself = () if measured_with_itself is None else tuple(
        ProfileCell(w, name) for w in feature_types if w not in measured_with_itself
    )
    measured = {(p, r) for d, p, r in evidenced if d == WITH}
    total = len(feature_types) * model.num_references
    references_wanted = max(0, math.ceil(percentage * total) - len(measured))
    references = () if not references_wanted else tuple(
        ProfileCell(w, partner)
        for r, partner in enumerate(model.group.classes)
        for p, w in enumerate(feature_types)
        if (p, r) not in measured
    )
    return Wanted(alone, itself + references, len(itself) + references_wanted)


def blocks_packing(
    alone: tuple[ProfileCell, ...], scale_factor: int, gangs_seen: Mapping[str, int], believed: Mapping[str, float]
) -> bool:
    """Whether some run alone the class lacks can be served (then it goes before every class's
    packed cells): a type some worker reported from with a gang at least this large, where the
    job's published speed is not zero."""
    return any(
        gangs_seen.get(cell.accelerator_type, 0) >= scale_factor and believed.get(cell.accelerator_type, 1.0) > 0
        for cell in alone
    )


def request(job_id: str, lacking: Wanted, packing_open: bool) -> ProfilingRequest:
    """The job's request: its runs alone, and its packed cells when no run alone comes first."""
    if not packing_open or not lacking.packed:
        return ProfilingRequest(job_id, lacking.alone)
    return ProfilingRequest(job_id, lacking.alone + lacking.packed, lacking.packed_wanted)


def requests(view: EvidenceView, name: str, packing_open: bool) -> list[ProfilingRequest]:
    """A class's profiling requests, one per active job: its first job asks, the others not."""
    cls = view.classes.get(name)
    if cls is None:
        return []
    chosen = min(cls.active, key=lambda j: view.jobs[j].order) if cls.active else None
    return [
        _class_request(view, cls, job_id, packing_open) if job_id == chosen else ProfilingRequest(job_id, ())
        for job_id in sorted(cls.active)
    ]


def _class_request(view: EvidenceView, cls: ClassEvidence, job_id: str, packing_open: bool) -> ProfilingRequest:
    """What a new class still lacks, packed cells only once runs alone are done."""
    if view.references.locate(cls.name) is not None:
        return ProfilingRequest(job_id, ())
    types = view.references.feature_types
    measured = {w for w in types if len(view.pools.get((cls.name, w), ()))}
    with_itself = {w for w in types if view.packed_jobs.get((cls.name, cls.name, w))} if len(cls.active) > 1 else None
    lacking = wanted(
        cls.name, types, measured, with_itself, view.colocation.model(cls.scale_factor), cls.evidenced,
        view.settings.profiling_percentage,
    )
    return request(job_id, lacking, packing_open)


def packing_open(
    view: EvidenceView, new: Sequence[ClassEvidence], gangs_seen: Mapping[str, int], published: Mapping[str, JobThroughput],
) -> bool:
    """Whether packed cells may be asked: no ``new`` class (active, the reference set does not know
    it) lacks a run alone that can be served, as its profiled job's ``published`` row believes."""
    for cls in new:
        alone = tuple(ProfileCell(w) for w in view.references.feature_types if not len(view.pools.get((cls.name, w), ())))
        profiled = published.get(min(cls.active, key=lambda j: view.jobs[j].order))
        believed = profiled.throughputs_steps_per_s if profiled is not None else {}
        if blocks_packing(alone, cls.scale_factor, gangs_seen, believed):
            return False
    return True
