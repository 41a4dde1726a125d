"""Stragglers: workers slower than their peers of the same accelerator type.

A straggler is slow against its peers, not against a table measured on other machines: hardware
that is slower (or faster) than the table as a whole is a calibration (calibration.py). So the
prediction a worker is judged against is its healthy peers' of the same type: their measurements
of the job and of its class, and the table's figure calibrated on their measurements alone
(``predicted``). With no peer of the type measured, there is no prediction and no straggler call.

Each measurement of a job alone that such a confident prediction (confidence >= ``MIN_CONFIDENCE``)
predicted gives the worker a ratio measured / predicted. A worker is flagged when the median of
its latest ratio per job, over at least ``jobs`` distinct jobs, is below ``threshold``; the flag is
withdrawn when the median climbs back above the threshold plus ``HYSTERESIS`` (a flag must not
flicker with one lease). A flagged worker's measurements describe the worker first: where a
healthy worker measured the same figure, the healthy one's stand; where none did, the straggler's
count, divided by its ratio (evidence.Stragglers), so nothing measured is thrown away.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection
from dataclasses import dataclass, field

from common.messages import StragglerFlag
from estimator_service.core import priors
from estimator_service.core.beliefs import Belief, Source, combine
from estimator_service.core.calibration import Calibration
from estimator_service.core.evidence import NO_STRAGGLERS, JobEvidence
from estimator_service.core.view import EvidenceView

MIN_CONFIDENCE = 0.5
HYSTERESIS = 0.1
RECENT_JOBS = 20  # jobs remembered per worker
# Workers remembered, the most recently measured: a cluster whose workers come and go under new
# ids (pods) would otherwise grow this for ever. One not measured among the latest this many is
# gone, and forgotten with its flag.
WORKERS_KEPT = 10_000


@dataclass
class StragglerWatch:
    threshold: float = 0.7
    jobs: int = 3
    ratios: dict[str, dict[str, float]] = field(default_factory=dict)  # worker -> job -> latest log ratio
    flagged: dict[str, StragglerFlag] = field(default_factory=dict)

    def observe(self, worker_id: str, job_id: str, measured: float, predicted: float) -> StragglerFlag | None:
        """Note one ratio; the worker's flag if it changed (raised or withdrawn), else None."""
        if not (measured > 0 and predicted > 0):
            return None
        recent = self.ratios.pop(worker_id, {})
        self.ratios[worker_id] = recent  # re-inserted last: the workers most recently measured in order
        while len(self.ratios) > WORKERS_KEPT:
            gone = next(iter(self.ratios))
            del self.ratios[gone]
            self.flagged.pop(gone, None)
        recent.pop(job_id, None)  # re-inserted last: the dict keeps the most recent jobs in order
        recent[job_id] = math.log(measured / predicted)
        while len(recent) > RECENT_JOBS:
            del recent[next(iter(recent))]
        if len(recent) < self.jobs:
            return None
        ratio = math.exp(statistics.median(recent.values()))
        was = worker_id in self.flagged
        if not was and ratio < self.threshold:
            self.flagged[worker_id] = StragglerFlag(worker_id, ratio, len(recent))
            return self.flagged[worker_id]
        if was and ratio >= self.threshold + HYSTERESIS:
            del self.flagged[worker_id]
            return StragglerFlag(worker_id, ratio, len(recent), flagged=False)
        return None

    def is_flagged(self, worker_id: str) -> bool:
        return worker_id in self.flagged

    def speed_ratios(self) -> dict[str, float]:
        """Every worker measured against a confident prediction: the median of its latest ratio
        per job (measured / predicted), flagged or not (the metrics' per-worker speed)."""
        return {worker_id: math.exp(statistics.median(recent.values())) for worker_id, recent in self.ratios.items() if recent}


def predicted(
    view: EvidenceView, job: JobEvidence, accelerator_type: str, worker_id: str, flagged: Collection[str],
    calibration: Calibration,
) -> Belief | None:
    """The job's speed alone on the type as the worker's healthy peers of that type say (the
    workers neither ``flagged`` nor ``worker_id``): their measurements of it and of its class, the
    table's figure calibrated on them. None without a peer: a worker is slow against its peers,
    not against a table measured elsewhere."""
    s = view.settings
    excluded = frozenset(flagged) | {worker_id}
    sources = list(job.alone_sources(accelerator_type, s.measurement_sd, NO_STRAGGLERS, excluded))
    for other_id in view.classes[job.colocation_class].jobs:
        other = view.jobs[other_id]
        if other_id != job.job_id and accelerator_type in other.alone:
            pooled = combine(other.alone_sources(accelerator_type, s.measurement_sd, NO_STRAGGLERS, excluded))
            if pooled is not None:
                sources.append(Source(pooled.value, pooled.variance + 2 * s.job_spread_sd**2, pooled.provenance))
    located = view.references.locate(job.colocation_class)
    peers = calibration.fitted(view.types, excluded) if located is not None else None
    if located is not None and peers is not None and peers.has_peers(accelerator_type):
        reference = priors.reference(view, located, job.colocation_class, accelerator_type, peers)
        if reference is not None:
            sources.append(reference)
    return combine(sources)
