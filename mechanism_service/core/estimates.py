"""The estimator's latest word, as the mechanism keeps it (docs/estimator.md).

``EstimateBook.apply(message)`` takes a ThroughputEstimated in: each job's row (steps/s alone per
type, with provenance and confidence), the packed fractions per pair of colocation classes, the
profiling requests and the straggler flags. It returns what changed, so the caller can decide
whether the change is material (``material``): worth solving the allocation again.

The book is part of the mechanism's memory (journaled, snapshotted): a restarted mechanism, or
one whose estimator is down, schedules on the last estimates.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from common.messages import ProfilingRequest, StragglerFlag, ThroughputEstimated

# An estimate that moved by more than this (relative), or to or from zero, is worth a new solve:
# below it, the allocation it would give differs by less than the estimate's own error.
MATERIAL_CHANGE = 0.05


@dataclass(frozen=True, slots=True)
class Changes:
    jobs: set[str]  # rows that changed
    pairs: set[tuple[str, str]]  # class pairs whose fractions changed
    requests: set[str]  # jobs with a new profiling request (or a withdrawn one)


@dataclass
class EstimateBook:
    rows: dict[str, dict[str, float]] = field(default_factory=dict)  # job -> type -> steps/s alone
    provenance: dict[str, dict[str, str]] = field(default_factory=dict)  # job -> type -> provenance
    confidence: dict[str, dict[str, float]] = field(default_factory=dict)
    classes: dict[str, str] = field(default_factory=dict)  # job -> colocation class
    fractions: dict[tuple[str, str], dict[str, tuple[float, float]]] = field(default_factory=dict)  # (a, b), a <= b
    fraction_provenance: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    profiling: dict[str, ProfilingRequest] = field(default_factory=dict)  # job -> its latest request
    stragglers: dict[str, StragglerFlag] = field(default_factory=dict)  # flagged workers
    profiling_share: float = 0.0
    mode: str = ""  # the estimator's ("" : none heard yet)
    revision: int = 0

    def apply(self, message: ThroughputEstimated, ended: Iterable[str] = ()) -> Changes:
        """Take a message in; what changed. Rows of jobs in ``ended`` (already gone from the
        cluster) are not kept: a late estimate must not resurrect them."""
        gone = set(ended)
        jobs: set[str] = set()
        pairs: set[tuple[str, str]] = set()
        requests: set[str] = set()
        for row in message.jobs:
            if row.job_id in gone:
                continue
            values = {w: float(v) for w, v in row.throughputs_steps_per_s.items()}
            if self.rows.get(row.job_id) != values or self.classes.get(row.job_id) != row.colocation_class:
                jobs.add(row.job_id)
            self.rows[row.job_id] = values
            self.provenance[row.job_id] = {w: str(p) for w, p in row.provenance.items()}
            self.confidence[row.job_id] = dict(row.confidence)
            self.classes[row.job_id] = row.colocation_class
        for pair in message.colocations:
            if len(pair.classes) != 2:
                continue
            a, b = pair.classes
            fractions = {w: (float(f[0]), float(f[1])) for w, f in pair.fractions.items() if len(f) == 2}
            key = (a, b)
            if a > b:
                key, fractions = (b, a), {w: (f[1], f[0]) for w, f in fractions.items()}
            if self.fractions.get(key) != fractions:
                pairs.add(key)
            self.fractions[key] = fractions
            self.fraction_provenance[key] = {w: str(p) for w, p in pair.provenance.items()}
        if message.complete:  # the whole picture: what it leaves out is withdrawn
            requests.update(j for j in self.profiling if j not in {r.job_id for r in message.profiling})
            self.profiling = {}
            self.stragglers = {}
        for request in message.profiling:
            if request.job_id in gone:
                continue
            requests.add(request.job_id)
            if request.cells:
                self.profiling[request.job_id] = request
            else:
                self.profiling.pop(request.job_id, None)
        for flag in message.stragglers:
            if flag.flagged:
                self.stragglers[flag.worker_id] = flag
            else:
                self.stragglers.pop(flag.worker_id, None)
        self.profiling_share = message.profiling_share
        self.mode = message.mode
        self.revision = max(self.revision, message.revision)
        return Changes(jobs, pairs, requests)

    def forget(self, job_id: str) -> None:
        """The job left the cluster: nothing of it is needed any more."""
        for table in (self.rows, self.provenance, self.confidence, self.classes, self.profiling):
            table.pop(job_id, None)

    def fraction(self, a: str, b: str, accelerator_type: str) -> tuple[float, float] | None:
        """(a's fraction, b's fraction) packed on the type; None when the estimator said nothing."""
        if a <= b:
            by_type = self.fractions.get((a, b))
            return None if by_type is None else by_type.get(accelerator_type, (0.0, 0.0))
        # stored under (b, a): swap the members back
        by_type = self.fractions.get((b, a))
        if by_type is None:
            return None
        f = by_type.get(accelerator_type, (0.0, 0.0))
        return f[1], f[0]


def material(before: Mapping[str, tuple[float, ...]], after: Mapping[str, tuple[float, ...]], threshold: float = MATERIAL_CHANGE) -> bool:
    """Whether throughputs moved enough to solve again: by more than ``threshold`` (relative) on
    some type, or to or from zero."""
    for w, new in after.items():
        old = before.get(w)
        if old is None:
            return True
        for x, y in zip(old, new, strict=True):
            if (x <= 0) != (y <= 0):
                return True
            if x > 0 and abs(math.log(y / x)) > threshold:
                return True
    return False
