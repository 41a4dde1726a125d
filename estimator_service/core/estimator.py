"""The learned estimator: submissions, progress reports and job ends in, what changed out.

    estimator.submitted(spec)      -> ThroughputEstimated | None
    estimator.progress(report)     -> ThroughputEstimated | None
    estimator.ended(job_id)        -> ThroughputEstimated | None
    estimator.everything()         -> ThroughputEstimated   (the whole current picture)

Pure: no I/O, no clock, no randomness beyond the seeded completion. docs/estimator.md gives the
method with its formulas. The estimator holds the evidence and applies each input to it: a job's
measurements (evidence.py), pooled per class (pools.py), the calibration of this cluster's hardware
against the table (calibration.py), straggler flags (stragglers.py), a new class's measured cells of
the completion (colocation.py). The figures are functions of that evidence (view.py), cached here
by the stamps they were computed under: per job, its steps/s alone per type (rows.py, with the
sources of priors.py); per pair of classes and type, the fraction each keeps packed (fractions.py);
what to profile (profiling.py).

Outputs are diffed against what was published (publishing.py): a figure is sent again only when it
moved by more than ``publish_tolerance`` and by more than ``publish_sds`` of its own standard
deviation, or its provenance changed. What is dirty, the stamps the cached figures key on and
what was published are changes.py's.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from common.messages import ColocationEstimate, JobProgress, JobSpec, JobThroughput, ProfileCell, ThroughputEstimated
from estimator_service.core import fractions, priors, profiling, rows
from estimator_service.core.beliefs import Belief, Source, combine
from estimator_service.core.calibration import AS_THE_TABLE, Calibration, Fit
from estimator_service.core.changes import STAMP_TOLERANCE, Changes, moved, moved_belief
from estimator_service.core.colocation import AGAINST, WITH, ColocationModel
from estimator_service.core.evidence import NO_STRAGGLERS, JobEvidence, Stragglers, usable
from estimator_service.core.pools import Pool
from estimator_service.core.publishing import colocation_estimate, job_throughput
from estimator_service.core.reference import ReferenceSet, class_of
from estimator_service.core.settings import EstimatorSettings
from estimator_service.core.snapshots import upgraded
from estimator_service.core.stragglers import MIN_CONFIDENCE, StragglerWatch, predicted
from estimator_service.core.view import Cell, ClassEvidence, EvidenceView, Row

WATCHED_PER_JOB = 2  # a job's first measurements on a worker judge the worker (then it is known)
# The calibration is applied again when a shift moved by more than this (log): each reference
# report moves it a little, and every figure is recomputed when it is applied.
CALIBRATION_STEP = 0.01
_Class = ClassEvidence  # its name when it lived here: estimator snapshots pickled then refer to it


class Estimator:
    def __init__(self, references: ReferenceSet, settings: EstimatorSettings = EstimatorSettings()) -> None:
        self.references = references
        self.settings = settings
        self.types = references.accelerator_types
        self.colocation = ColocationModel(references, settings.completion)
        self.jobs: dict[str, JobEvidence] = {}
        self.classes: dict[str, ClassEvidence] = {}
        self.pools: dict[tuple[str, str], Pool] = {}
        self.stragglers = StragglerWatch(settings.straggler_ratio, settings.straggler_jobs)
        self.calibration = Calibration(settings.calibration_tolerance, settings.calibration_sd)
        self._calibrated: Fit = AS_THE_TABLE  # the calibration applied
        self._last_fit: Fit = AS_THE_TABLE  # the latest fit compared with it
        self.changes = Changes()  # what is dirty, the stamps, what was published (changes.py)
        self._order = 0
        self._rows: dict[str, tuple[tuple[int, int], Row]] = {}
        self._matches: dict[str, tuple[tuple[int, int], np.ndarray | None]] = {}  # class -> its match's speeds
        self._priors: dict[tuple[str, str, str], tuple[int, Source | None]] = {}  # fraction priors, by refit
        self._fractions: dict[tuple[str, str, str], tuple[tuple[int, ...], Belief | None]] = {}
        # (class, partner class, type) -> the jobs of the class measured packed so (in order)
        self._packed_jobs: dict[tuple[str, str, str], list[str]] = {}
        self._gangs_seen: dict[str, int] = {}  # type -> the largest gang a report came from there
        self._packing_open = True  # no new class lacks a run alone that can be served (profiling.py)
        self._gate_jobs: set[str] = set()  # the new classes' profiled jobs, whose rows that depends on
        self._gate_stale = True
        self._slow: Stragglers = NO_STRAGGLERS  # flagged workers: their measurements count where no healthy one's do
        # Types published: the profiled ones and any a report named (a pseudo-type nobody runs on is
        # not worth estimating at every step).
        self._types_out: tuple[str, ...] = references.feature_types
        self._fits_seen: dict[int, int] = {}  # scale factor -> completion fits already accounted for
        self._typical = {sf: references.typical_isolated(sf) for sf in {*references.groups, 1}}

    def __setstate__(self, state: dict[str, object]) -> None:
        """A snapshot from an older estimator loads as the same model (snapshots.py)."""
        self.__dict__.update(upgraded(state))

    @property
    def revision(self) -> int:
        """The last message's revision (how many it has sent)."""
        return self.changes.revision

    # -- inputs ------------------------------------------------------------------------------------

    def submitted(self, spec: JobSpec) -> ThroughputEstimated | None:
        if spec.job_id in self.jobs:
            return None  # a redelivery
        name = class_of(spec.job_type, spec.scale_factor)
        user = {
            w: float(v) for w, v in (spec.throughput_estimate_steps_per_s or {}).items()
            if w in self.types and math.isfinite(v) and v >= 0
        }
        self.jobs[spec.job_id] = JobEvidence(spec.job_id, name, spec.scale_factor, self._order, user)
        self._order += 1
        cls = self.classes.get(name)
        if cls is None:
            cls = self.classes[name] = ClassEvidence(name, spec.scale_factor)
        cls.jobs.append(spec.job_id)
        self._trim(cls)
        first = not cls.active
        cls.active.add(spec.job_id)
        self.changes.dirty_rows.add(spec.job_id)
        if first:
            self.changes.dirty_pairs.update(self._pairs_of(name))
        self.changes.dirty_profiling.add(name)
        return self._flush()

    def progress(self, report: JobProgress) -> ThroughputEstimated | None:
        job = self.jobs.get(report.job_id)
        if job is None or not usable(report) or report.accelerator_type not in self.types:
            return None
        if report.lease_id:  # a report delivered twice (at least once) is one measurement
            if report.lease_id in job.leases:
                return None
            job.leases.add(report.lease_id)
        w = report.accelerator_type
        if self._gangs_seen.get(w, 0) < job.scale_factor:
            self._gangs_seen[w] = job.scale_factor
            self._gate_stale = True
        if w not in self._types_out:
            self._types_out = tuple(t for t in self.types if t in {*self._types_out, w})
            self._everything_dirty()
        partners = [self.jobs[p] for p in report.packed_with if p in self.jobs]
        if len(partners) != len(report.packed_with) or len(partners) > 1:
            return None  # a partner it never heard of: the fraction cannot be placed
        partner_class = partners[0].colocation_class if partners else ""
        profiled = self._was_requested(job.job_id, w, partner_class)
        value = max(0.0, report.throughput_steps_per_s)
        cls = self.classes[job.colocation_class]
        if partners:
            cells = len(cls.evidenced)
            job.record(w, partner_class, report.worker_id, value, profiled)
            measured_so = self._packed_jobs.setdefault((job.colocation_class, partner_class, w), [])
            with_itself = partner_class == cls.name and not measured_so  # a cell of its request (profiling.py)
            if job.job_id not in measured_so:
                measured_so.append(job.job_id)
            self._packed_changed(job.colocation_class, partner_class, w)
            if self.references.locate(job.colocation_class) is None:
                cls.stamp += 1  # its packed runs tell its speed alone
                self.changes.dirty_rows.add(job.job_id)
            new_cell = len(cls.evidenced) > cells or with_itself
        else:
            new_cell = not len(self.pools.get((cls.name, w), ()))
            self._watch(job, w, report.worker_id, value)
            job.record(w, "", report.worker_id, value, profiled)
            self._calibrate(job, w, report.worker_id)
            self._alone_changed(job, w)
        if new_cell:  # what the class still lacks changed: its profiling request with it
            self.changes.dirty_profiling.add(job.colocation_class)
        return self._flush()

    def ended(self, job_id: str) -> ThroughputEstimated | None:
        job = self.jobs.get(job_id)
        if job is None or not job.active:
            return None
        job.active = False
        cls = self.classes[job.colocation_class]
        cls.active.discard(job_id)
        self.changes.job_ended(job_id)
        self._rows.pop(job_id, None)
        self._trim(cls)
        self.changes.dirty_profiling.add(cls.name)
        if not cls.active:
            self.changes.class_ended(cls.name)
        return self._flush()

    def everything(self) -> ThroughputEstimated:
        """Every active job's figures, every pair among active classes, every profiling request and
        straggler flag, as if all were new (a restarted estimator says it all once)."""
        self.changes.forget_published()
        self._everything_dirty()
        self.changes.dirty_profiling.update(c.name for c in self.classes.values() if c.active)
        self.changes.new_flags.extend(self.stragglers.flagged.values())
        picture = self._flush(always=True)
        assert picture is not None
        return dataclasses.replace(picture, complete=True)

    def _everything_dirty(self) -> None:
        active = [c for c in self.classes.values() if c.active]
        self.changes.dirty_rows.update(j for c in active for j in c.active)
        self.changes.dirty_pairs.update(p for c in active for p in self._pairs_of(c.name))

    # -- evidence bookkeeping -----------------------------------------------------------------------

    def _trim(self, cls: ClassEvidence) -> None:
        """Keep the most recent pooled jobs (active ones are never dropped)."""
        excess = len(cls.jobs) - self.settings.pooled_jobs
        if excess <= 0:
            return
        dropped = [j for j in cls.jobs if j not in cls.active][:excess]
        for key in [k for k in self._packed_jobs if k[0] == cls.name and dropped]:
            self._packed_jobs[key] = [j for j in self._packed_jobs[key] if j not in dropped]
        for job_id in dropped:
            cls.jobs.remove(job_id)
            for w in self.types:
                pool = self.pools.get((cls.name, w))
                if pool is not None:
                    pool.put(job_id, None, 0)
            self.jobs.pop(job_id, None)
        if dropped:
            cls.stamp += 1

    def _pool(self, name: str, accelerator_type: str) -> Pool:
        pool = self.pools.get((name, accelerator_type))
        if pool is None:
            pool = self.pools[(name, accelerator_type)] = Pool(self.settings.job_spread_sd**2)
        return pool

    def _alone_changed(self, job: JobEvidence, accelerator_type: str) -> None:
        cls = self.classes[job.colocation_class]
        sources = job.alone_sources(accelerator_type, self.settings.measurement_sd, self._slow)
        belief = combine(sources)
        pool = self._pool(cls.name, accelerator_type)
        own_before = pool.contributions.get(job.job_id)
        before = pool.mean()
        count = sum(s.count for s in sources)
        pool.put(job.job_id, belief, count)
        after = pool.mean()
        if own_before is None or moved_belief(own_before[0], belief) or count & (count - 1) == 0:
            # its own figure moved (or its count reached a power of two: its confidence grew
            # enough to say so; a measurement that only repeats the mean changes nothing else)
            self._rows.pop(job.job_id, None)
            self.changes.dirty_rows.add(job.job_id)
        if moved(before, after, STAMP_TOLERANCE):
            # the class's mean moved: every job of the class may read it differently
            cls.stamp += 1
            self.changes.dirty_rows.update(cls.active)
        if moved(before, after, self.settings.publish_tolerance):
            # fractions are measured against the speed alone: every pair of this class moves
            self.changes.dirty_pairs.update(self._pairs_of(cls.name))
            self._observe_class(cls.name)

    def _packed_changed(self, name: str, partner: str, accelerator_type: str) -> None:
        self.changes.packed_measured(_ordered(name, partner))
        self._observe_cell(name, partner, accelerator_type)

    def _watch(self, job: JobEvidence, accelerator_type: str, worker_id: str, value: float) -> None:
        """Straggler evidence: this measurement against a confident estimate of the worker's
        healthy peers of its type (none: no evidence)."""
        if job.alone_count(accelerator_type, worker_id) >= WATCHED_PER_JOB:
            return  # this job has said what it can about this worker
        predicted_there = predicted(self._view(), job, accelerator_type, worker_id, self.stragglers.flagged, self.calibration)
        if predicted_there is None or predicted_there.confidence < MIN_CONFIDENCE:
            return
        change = self.stragglers.observe(worker_id, job.job_id, value, predicted_there.value)
        if change is None:
            return
        self.changes.new_flags.append(change)
        self.changes.global_stamp += 1
        flagged = self.stragglers.flagged
        self._slow = Stragglers.of({w: math.log(f.ratio) for w, f in flagged.items()}, self.settings.straggler_sd**2)
        self._recalibrate()  # its measurements leave (or rejoin) the calibration
        for other in self.jobs.values():  # its measurements give way to (or rejoin) healthy ones
            if worker_id in other.workers():
                for w in other.alone:
                    sources = other.alone_sources(w, self.settings.measurement_sd, self._slow)
                    self._pool(other.colocation_class, w).put(other.job_id, combine(sources), sum(x.count for x in sources))
                self.classes[other.colocation_class].stamp += 1
                if other.colocation_class in self.classes and self.classes[other.colocation_class].evidenced:
                    self._refill(other.colocation_class)
        self._everything_dirty()

    def _calibrate(self, job: JobEvidence, accelerator_type: str, worker_id: str) -> None:
        """A reference job measured alone: its worker's ratio to the table, the calibration."""
        located = self.references.locate(job.colocation_class)
        mean_log = job.mean_log(accelerator_type, worker_id)
        if located is None or mean_log is None:
            return
        table = located[0].isolated[located[1], self.types.index(accelerator_type)]
        if np.isfinite(table) and table > 0:
            self.calibration.observe(worker_id, accelerator_type, job.job_id, job.colocation_class, mean_log - math.log(table))
            self._recalibrate()

    def _recalibrate(self) -> None:
        """Apply the calibration if it moved (every figure derived from the table moves with it)."""
        now = self.calibration.fitted(self.types, self.stragglers.flagged) or AS_THE_TABLE
        if now is self._last_fit:
            return  # (the same fit, cached: compared already)
        self._last_fit = now
        if now.moved(self._calibrated, CALIBRATION_STEP):
            self._calibrated = now
            self.changes.global_stamp += 1
            self._everything_dirty()

    def _was_requested(self, job_id: str, accelerator_type: str, partner_class: str) -> bool:
        request = self.changes.published_profiling.get(job_id)
        return request is not None and ProfileCell(accelerator_type, partner_class) in request.cells

    # -- a new class's completion row ---------------------------------------------------------------

    def _observe_cell(self, name: str, partner: str, accelerator_type: str) -> None:
        """A packed measurement of (name with partner): the cell of each class's row it fills."""
        for row_class, other, direction in ((name, partner, WITH), (partner, name, AGAINST)):
            cell = fractions.cell(self._view(), row_class, other, accelerator_type, direction)
            if cell is not None:
                self.classes[row_class].evidenced.add(cell)
                self._refill(row_class, cell)

    def _observe_class(self, name: str) -> None:
        """The class's speed alone moved: every measured fraction it is part of moves with it."""
        if self.references.locate(name) is None and self.classes[name].evidenced:
            self._refill(name)
        for other in self.classes.values():
            if other.evidenced and self.references.locate(other.name) is None and other.name != name:
                if any(fractions.reference_index(self.references, name, other.scale_factor) == cell[2] for cell in other.evidenced):
                    self._refill(other.name)

    def _refill(self, name: str, only: Cell | None = None) -> None:
        """Recompute the measured cells of a new class's row (all, or ``only`` one that a packed
        run just measured) and hand the row to the completion."""
        cls = self.classes[name]
        model = self.colocation.model(cls.scale_factor)
        if model is None:
            return
        before = model.observed.get(name)
        row = before.copy() if before is not None and only is not None else self.colocation.empty_row(cls.scale_factor)
        assert row is not None
        cells = (only,) if only is not None else cls.evidenced
        model.observe(name, fractions.completion_row(self._view(), name, model, cells, row, self._row))

    # -- figures (cached by the stamps they were computed under) ------------------------------------

    def _view(self) -> EvidenceView:
        return EvidenceView(
            self.settings, self.references, self.colocation, self.jobs, self.classes, self.pools, self._packed_jobs,
            self._calibrated, self._slow, self._types_out, self._typical,
        )

    def _row(self, job: JobEvidence) -> Row:
        """(Cached: it moves with its class's evidence, a flag, a calibration, a refit.)"""
        cls = self.classes[job.colocation_class]
        key = (cls.stamp, self.changes.global_stamp)
        cached = self._rows.get(job.job_id)
        if cached is not None and cached[0] == key:
            return cached[1]
        row = rows.row(self._view(), job, self._match, self._fraction_prior)
        self._rows[job.job_id] = (key, row)
        return row

    def _match(self, name: str, scale_factor: int) -> np.ndarray | None:
        """(Cached per class as a row is: it moves with the class's evidence, a flag, a calibration, a refit.)"""
        group = self.references.group(scale_factor)
        if group is None:
            return None
        key = (self.classes[name].stamp, self.changes.global_stamp)
        cached = self._matches.get(name)
        if cached is not None and cached[0] == key:
            return cached[1]
        found = priors.matched(self._view(), name, scale_factor, group)
        self._matches[name] = (key, found)
        return found

    def _fraction(self, name: str, partner: str, accelerator_type: str) -> Belief | None:
        """(Cached: it moves with either class's evidence, the pair's own measurements, a refit.)"""
        key = (name, partner, accelerator_type)
        stamp = (
            self.classes[name].stamp, self.classes[partner].stamp, self.changes.global_stamp,
            self.changes.pair_versions.get(_ordered(name, partner), 0),
        )
        cached = self._fractions.get(key)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        measured = fractions.measured(self._view(), name, partner, accelerator_type, self._row)
        belief = fractions.combined(measured, self._fraction_prior(name, partner, accelerator_type))
        self._fractions[key] = (stamp, belief)
        return belief

    def _fraction_prior(self, name: str, partner: str, accelerator_type: str) -> Source | None:
        """(Cached: it moves only with the completion and the matches.)"""
        key = (name, partner, accelerator_type)
        cached = self._priors.get(key)
        if cached is not None and cached[0] == self.changes.global_stamp:
            return cached[1]
        prior = fractions.prior(self._view(), name, partner, accelerator_type)
        self._priors[key] = (self.changes.global_stamp, prior)
        return prior

    # -- what changed, as a message ---------------------------------------------------------------

    def _pairs_of(self, name: str) -> list[tuple[str, str]]:
        scale_factor = self.classes[name].scale_factor
        return [
            _ordered(name, other.name) for other in self.classes.values()
            if other.active and other.scale_factor == scale_factor
        ]

    def _flush(self, *, always: bool = False) -> ThroughputEstimated | None:
        changes, s = self.changes, self.settings
        for scale_factor, model in self.colocation.groups.items():
            if model.observed:
                model.refresh()
            if model.fits != self._fits_seen.get(scale_factor, 0):
                self._fits_seen[scale_factor] = model.fits
                changes.global_stamp += 1  # every prior of a new class may have moved
                new = [
                    c for c in self.classes.values()
                    if c.active and c.scale_factor == scale_factor and self.references.locate(c.name) is None
                ]
                changes.dirty_pairs.update(p for c in new for p in self._pairs_of(c.name))
                changes.dirty_rows.update(j for c in new for j in c.active)
        job_rows = changes.rows_to_send(self._row_message, self._order_of, s.publish_tolerance, s.publish_sds)
        pairs = changes.pairs_to_send(self._pair_message, s.publish_tolerance, s.publish_sds)
        if changes.dirty_profiling or self._gate_stale or any(r.job_id in self._gate_jobs for r in job_rows):
            self._update_gate()
        requests = changes.requests_to_send(lambda name: profiling.requests(self._view(), name, self._packing_open))
        return changes.message(job_rows, pairs, requests, always=always, profiling_share=s.profiling_share)

    def _order_of(self, job_id: str) -> int:
        return self.jobs[job_id].order if job_id in self.jobs else -1

    def _row_message(self, job_id: str) -> JobThroughput | None:
        job = self.jobs.get(job_id)
        if job is None or not job.active:
            return None
        return job_throughput(job_id, self._row(job), job.colocation_class)

    def _pair_message(self, pair: tuple[str, str]) -> ColocationEstimate | None:
        a, b = pair
        if a not in self.classes or b not in self.classes or not (self.classes[a].active and self.classes[b].active):
            return None
        return colocation_estimate((a, b), ((w, self._fraction(a, b, w), self._fraction(b, a, w)) for w in self._types_out))

    def _update_gate(self) -> None:
        """Whether packed cells may be asked (profiling.py); when that flips, every new class's
        request changes. (Recomputed only when a request, a gang seen or a profiled job's row moved.)"""
        self._gate_stale = False
        new = [c for c in self.classes.values() if c.active and self.references.locate(c.name) is None]
        self._gate_jobs = {min(c.active, key=lambda j: self.jobs[j].order) for c in new}
        packing_open = profiling.packing_open(self._view(), new, self._gangs_seen, self.changes.published_rows)
        if packing_open != self._packing_open:
            self._packing_open = packing_open
            self.changes.dirty_profiling.update(c.name for c in new)


def _ordered(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)
