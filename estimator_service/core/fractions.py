"""Packed fractions: per pair of classes and accelerator type, the fraction of its steps/s alone
that a class keeps when packed with the other.

A fraction combines the measured ones (``measured``: a pooled job's packed steps/s over its own
estimate alone there) with a prior (``prior``): the table's for two references, the completion's
(colocation.py) when one of them is new, and the matched reference's when both are; capped at 1
(``combined``). A new class's measured fractions are also cells of its row in the completion
(``cell``: where one lands; ``completion_row``: the row with them written in).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from common.messages import Provenance
from estimator_service.core.beliefs import Belief, Source, combine
from estimator_service.core.colocation import AGAINST, WITH, GroupModel
from estimator_service.core.evidence import JobEvidence
from estimator_service.core.reference import ReferenceSet
from estimator_service.core.view import Cell, EvidenceView, Row

TYPICAL_FRACTION_SD = 0.5  # a packed fraction nothing is known of: somewhere in (0.3, 1], say

RowOf = Callable[[JobEvidence], Row]  # a job's row (rows.row, as the estimator caches it)


def measured(view: EvidenceView, name: str, partner: str, accelerator_type: str, row_of: RowOf) -> list[Source]:
    """Measured fractions of ``name`` packed with ``partner`` on the type: each pooled job's
    packed steps/s over its own estimate alone there."""
    s = view.settings
    sources = []
    for job_id in view.packed_jobs.get((name, partner, accelerator_type), ()):
        job = view.jobs.get(job_id)
        if job is None:
            continue
        packed = combine(job.packed_sources(partner, accelerator_type, s.measurement_sd, view.slow))
        if packed is None:
            continue
        if packed.value <= 0:
            sources.append(Source(0.0, 0.0, packed.provenance))
            continue
        alone = row_of(job).get(accelerator_type)
        if alone is None or alone.value <= 0:
            continue
        fraction = min(1.0, packed.value / alone.value)
        sources.append(Source(fraction, packed.variance + alone.variance, packed.provenance))
    return sources


def combined(sources: list[Source], prior: Source | None) -> Belief | None:
    """The measured fractions with the prior, capped at 1."""
    if prior is not None:
        sources.append(prior)
    belief = combine(sources)
    if belief is not None and belief.value > 1.0:
        belief = Belief(1.0, belief.variance, belief.provenance)
    return belief


def prior(view: EvidenceView, name: str, partner: str, accelerator_type: str) -> Source | None:
    """The prior of the fraction ``name`` keeps packed with ``partner`` on the type (module docstring)."""
    s = view.settings
    scale_factor = view.classes[name].scale_factor
    colocation = view.colocation
    model = colocation.model(scale_factor)
    if model is None:
        return None
    group = model.group
    k = view.types.index(accelerator_type)
    mine, theirs = group.index.get(name), group.index.get(partner)
    if accelerator_type not in view.references.feature_types:
        # a pseudo-type: the references' (or the matches') own figure there
        a = mine if mine is not None else colocation.match(name, scale_factor)
        b = theirs if theirs is not None else colocation.match(partner, scale_factor)
        if a is None or b is None or not np.isfinite(group.colocation[a, b, k]):
            return None
        return Source(float(group.colocation[a, b, k]), s.matched_sd**2, Provenance.REFERENCE)
    position = view.references.feature_types.index(accelerator_type)
    if mine is not None and theirs is not None:
        value = group.colocation[mine, theirs, k]
        if np.isfinite(value):
            return Source(float(value), s.reference_sd**2, Provenance.REFERENCE)
        row = colocation.reference_row(scale_factor, mine)
        return None if row is None else Source(float(row[model.column(WITH, position, theirs)]), s.matched_sd**2, Provenance.COMPLETED)
    if mine is None and theirs is not None:
        row, column, provenance = colocation.prior_row(name, scale_factor), model.column(WITH, position, theirs), Provenance.COMPLETED
        evidenced = bool(view.classes[name].evidenced)
    elif mine is not None:
        row, column, provenance = colocation.prior_row(partner, scale_factor), model.column(AGAINST, position, mine), Provenance.COMPLETED
        evidenced = bool(view.classes[partner].evidenced)
    else:  # two new classes: each one's row against the other's match
        row = colocation.prior_row(name, scale_factor)
        match = colocation.match(partner, scale_factor) if view.classes[partner].evidenced else None
        if row is None:
            return None
        if match is None:
            start = model.column(WITH, position, 0)
            value = float(np.mean(row[start : start + model.num_references]))
            return Source(value, TYPICAL_FRACTION_SD**2, Provenance.REFERENCE)
        column, provenance, evidenced = model.column(WITH, position, match), Provenance.REFERENCE, bool(view.classes[name].evidenced)
    if row is None:
        return None
    variance = s.matched_sd**2 if evidenced else TYPICAL_FRACTION_SD**2
    return Source(float(row[column]), variance, provenance)


def cell(view: EvidenceView, row_class: str, other: str, accelerator_type: str, direction: int) -> Cell | None:
    """Where (row_class, other) lands in row_class's completion row: row_class new, other a
    reference of its size, the type a feature type."""
    cls = view.classes.get(row_class)
    if cls is None or view.references.locate(row_class) is not None:
        return None
    reference = reference_index(view.references, other, cls.scale_factor)
    if reference is None or accelerator_type not in view.references.feature_types:
        return None
    return direction, view.references.feature_types.index(accelerator_type), reference


def reference_index(references: ReferenceSet, name: str, scale_factor: int) -> int | None:
    group = references.group(scale_factor)
    return None if group is None else group.index.get(name)


def completion_row(
    view: EvidenceView, name: str, model: GroupModel, cells: Iterable[Cell], row: np.ndarray, row_of: RowOf
) -> np.ndarray:
    """``row`` (new class ``name``'s in the completion ``model``) with the measured fractions of
    ``cells`` written in."""
    for direction, position, reference in cells:
        w = view.references.feature_types[position]
        if direction == WITH and not view.measured_alone(name, w):
            # its fraction there would be measured against a guess of its speed alone: left
            # to the completion, and the packed runs tell its speed instead (priors.implied_by_packing)
            continue
        partner = model.group.classes[reference]
        a, b = (name, partner) if direction == WITH else (partner, name)
        belief = combine(measured(view, a, b, w, row_of))
        if belief is not None:
            row[model.column(direction, position, reference)] = belief.value
    return row
