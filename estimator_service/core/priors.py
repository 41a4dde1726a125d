"""The sources of a job's steps/s alone on a type beyond its own and its class's measurements.

- ``reference``: for a class the reference set knows, the table's figure, calibrated
  (calibration.py: this cluster's hardware against the table's, apart from how the class runs on it);
- ``implied_by_packing``: for a class it does not know, each packed run's steps/s over the prior
  fraction of that pair;
- ``matched_ratio``: for such a class measured on some types but not on this one, its measured
  speed there times the matched reference's speed ratio between the types (with the hardware's
  difference between them, as calibrated); ``matched`` finds that reference;
- ``typical``: the typical reference job of its size, when nothing at all is known (its spread is
  an order of magnitude).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from common.messages import Provenance
from estimator_service.core.beliefs import Belief, Source, combine
from estimator_service.core.calibration import Fit
from estimator_service.core.evidence import JobEvidence
from estimator_service.core.reference import ReferenceGroup
from estimator_service.core.view import EvidenceView

# (class, partner class, type) -> the prior of the class's packed fraction there (fractions.prior)
FractionPrior = Callable[[str, str, str], Source | None]


def reference(
    view: EvidenceView, located: tuple[ReferenceGroup, int], name: str, accelerator_type: str, fit: Fit | None = None,
) -> Source | None:
    """The table's figure of reference class ``name`` (``located`` in the set) on the type,
    calibrated (by ``fit``, the calibration applied when None)."""
    value = located[0].isolated[located[1], view.types.index(accelerator_type)]
    if not np.isfinite(value):
        return None
    s = view.settings
    calibrated = (view.calibrated if fit is None else fit).reference(name, accelerator_type)
    variance = s.reference_sd**2 + s.job_spread_sd**2 + calibrated.variance
    return Source(float(value) * calibrated.factor, variance, Provenance.REFERENCE)


def typical(view: EvidenceView, scale_factor: int, accelerator_type: str) -> Source:
    """The typical reference job of the size (of size 1 when the set has none), calibrated."""
    typical = view.typical.get(scale_factor, view.typical[1])
    calibrated = view.calibrated.typical(accelerator_type)
    k = view.types.index(accelerator_type)
    return Source(float(typical[k]) * calibrated.factor, view.settings.typical_sd**2 + calibrated.variance, Provenance.REFERENCE)


def implied_by_packing(view: EvidenceView, job: JobEvidence, accelerator_type: str, fraction_prior: FractionPrior) -> list[Source]:
    """A new class's speed alone implied by its packed runs there: each run's steps/s over the
    prior fraction of that pair (the completion's, which never used this type's measured
    fractions unless the speed alone there was measured: no circle)."""
    out = []
    for partner, w in [key for key in job.packed if key[1] == accelerator_type]:
        packed = combine(job.packed_sources(partner, w, view.settings.measurement_sd, view.slow))
        prior = fraction_prior(job.colocation_class, partner, w)
        if packed is None or prior is None or not (packed.value > 0 and prior.value > 0):
            continue
        out.append(Source(packed.value / prior.value, packed.variance + prior.variance, Provenance.COMPLETED))
    return out


def matched_ratio(view: EvidenceView, match: np.ndarray, measured: dict[str, Belief], k: int) -> Source | None:
    """The job's measured speeds times the matched reference's ratio to type k (with the hardware's
    difference between the types, as calibrated)."""
    if not np.isfinite(match[k]):
        return None
    types, matched_sd = view.types, view.settings.matched_sd
    logs, variances = [], []
    for w, belief in measured.items():
        other = match[types.index(w)]
        if np.isfinite(other) and other > 0:
            if match[k] <= 0:
                return Source(0.0, matched_sd**2, Provenance.REFERENCE)
            between = view.calibrated.between(types[k], w)
            logs.append(belief.log_value + math.log(match[k] / other) + between.log_shift)
            variances.append(belief.variance + between.variance)
    if not logs:
        return None
    variance = matched_sd**2 + math.fsum(variances) / len(variances)
    return Source(math.exp(math.fsum(logs) / len(logs)), variance, Provenance.REFERENCE)


def matched(view: EvidenceView, name: str, scale_factor: int, group: ReferenceGroup) -> np.ndarray | None:
    """(K,) the speeds alone of the reference (of ``group``, its size's) a new class is matched to:
    by its completed colocation row when anything was measured packed, else by its measured
    speeds alone (the nearest in log speed on the types measured)."""
    index = view.colocation.match(name, scale_factor) if view.classes[name].evidenced else None
    if index is None:
        index = _speed_match(view, name, group.isolated)
    return None if index is None else group.isolated[index]


def _speed_match(view: EvidenceView, name: str, isolated: np.ndarray) -> int | None:
    measured = []
    for k, w in enumerate(view.types):
        mean = view.pooled(name, w)
        if mean is not None and mean.value > 0:  # against the table calibrated to this hardware
            measured.append((k, math.log(mean.value) - view.calibrated.typical(w).log_shift))
    if not measured:
        return None
    columns = [k for k, _ in measured]
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(isolated[:, columns])
    distance = np.nanmean((logs - np.array([v for _, v in measured])) ** 2, axis=1)
    distance = np.where(np.isfinite(distance), distance, np.inf)
    return int(np.argmin(distance)) if np.isfinite(distance).any() else None
