"""The learned estimator: submissions, progress reports and job ends in, what changed out.

    estimator.submitted(spec)      -> ThroughputEstimated | None
    estimator.progress(report)     -> ThroughputEstimated | None
    estimator.ended(job_id)        -> ThroughputEstimated | None
    estimator.everything()         -> ThroughputEstimated   (the whole current picture)

Pure: no I/O, no clock, no randomness beyond the seeded completion. docs/estimator.md gives the
method with its formulas; in short, per job and accelerator type k, its steps/s alone combines
(beliefs.combine, in log space, weighted by precision):

- its own measurements on k (a flagged straggler's only where no healthy worker measured it);
- the other jobs of its colocation class, pooled (pools.py);
- the reference table's figure, for a class the reference set knows, calibrated (calibration.py:
  this cluster's hardware against the table's, apart from how the class runs on it);
- the user's estimate at submission;
- for a class the reference set does not know, measured on some types but not on k: its
  measured speed there times the matched reference's speed ratio between k and those types (with
  the hardware's difference between the types, as calibrated);
- the typical reference job of its size, which says little (its spread is an order of magnitude).

Per pair of classes and type, the fraction of its speed alone that each keeps when packed combines
the measured fractions (a packed run's steps/s over the job's own estimate alone) with a prior: the
table's for two references, the completion's (colocation.py) when one is new, and the matched
reference's when both are.

Outputs are diffed against what was published (publishing.py): a figure is sent again only when it
moved by more than ``publish_tolerance`` and by more than ``publish_sds`` of its own standard
deviation, or its provenance changed. What is dirty, the stamps the cached figures key on and
what was published are changes.py's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from common.messages import (
    ColocationEstimate,
    JobProgress,
    JobSpec,
    JobThroughput,
    ProfileCell,
    ProfilingRequest,
    Provenance,
    ThroughputEstimated,
)
from estimator_service.core.beliefs import MEASUREMENTS, Belief, Source, combine
from estimator_service.core.calibration import AS_THE_TABLE, Calibration, Fit
from estimator_service.core.changes import STAMP_TOLERANCE, Changes, moved, moved_belief
from estimator_service.core.colocation import AGAINST, WITH, ColocationModel
from estimator_service.core.evidence import NO_STRAGGLERS, JobEvidence, Stragglers
from estimator_service.core.pools import Pool
from estimator_service.core.profiling import blocks_packing, request, wanted
from estimator_service.core.publishing import rounded
from estimator_service.core.reference import ReferenceSet, class_of
from estimator_service.core.settings import EstimatorSettings
from estimator_service.core.stragglers import MIN_CONFIDENCE, StragglerWatch

Row = dict[str, Belief]  # accelerator type -> belief
Cell = tuple[int, int, int]  # (direction, feature type position, reference index) in a completion row
TYPICAL_FRACTION_SD = 0.5  # a packed fraction nothing is known of: somewhere in (0.3, 1], say
WATCHED_PER_JOB = 2  # a job's first measurements on a worker judge the worker (then it is known)
# The calibration is applied again when a shift moved by more than this (log): each reference
# report moves it a little, and every figure is recomputed when it is applied.
CALIBRATION_STEP = 0.01


@dataclass
class _Class:
    name: str
    scale_factor: int
    jobs: list[str] = field(default_factory=list)  # pooled, oldest first (at most pooled_jobs)
    active: set[str] = field(default_factory=set)
    stamp: int = 0  # grows whenever its evidence changes (caches key on it)
    evidenced: set[Cell] = field(default_factory=set)  # completion cells with measurements (a new class)


class Estimator:
    def __init__(self, references: ReferenceSet, settings: EstimatorSettings = EstimatorSettings()) -> None:
        self.references = references
        self.settings = settings
        self.types = references.accelerator_types
        self.colocation = ColocationModel(references, settings.completion)
        self.jobs: dict[str, JobEvidence] = {}
        self.classes: dict[str, _Class] = {}
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
        """A snapshot from an older estimator loads as the same model: settings it lacks take their
        defaults; one from before calibration (which left stragglers' measurements out) has
        nothing calibrated yet and its flags as corrections; one from before the joint fit of
        hardware and classes (a calibration per type) calibrates again from what comes next; one
        from before changes.py holds its change tracking in fields of its own, taken into one."""
        self.__dict__.update(state)
        if "changes" not in state:
            self.changes = Changes.taken_from(self.__dict__)
        old = self.settings  # fields added since were never set on it
        if not all(hasattr(old, f.name) for f in dataclasses.fields(old)):
            self.settings = EstimatorSettings(**{f.name: getattr(old, f.name) for f in dataclasses.fields(old) if hasattr(old, f.name)})
        self.__dict__.setdefault("_gangs_seen", {})
        self.__dict__.setdefault("_packing_open", True)
        self.__dict__.setdefault("_gate_jobs", set())
        self.__dict__.setdefault("_gate_stale", True)
        self.__dict__.setdefault("_last_fit", AS_THE_TABLE)
        if "calibration" in state:
            if not isinstance(self._calibrated, Fit):  # per type (calibration.py loaded it empty)
                self._calibrated = AS_THE_TABLE
                self.changes.global_stamp += 1
            return
        self.calibration = Calibration(self.settings.calibration_tolerance, self.settings.calibration_sd)
        self._calibrated = AS_THE_TABLE
        flagged = self.stragglers.flagged
        self._slow = Stragglers.of({w: math.log(f.ratio) for w, f in flagged.items()}, self.settings.straggler_sd**2)
        self.__dict__.pop("_excluded", None)
        self.changes.global_stamp += 1

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
            cls = self.classes[name] = _Class(name, spec.scale_factor)
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
        if job is None or not _usable(report) or report.accelerator_type not in self.types:
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

    def _trim(self, cls: _Class) -> None:
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
        predicted = self._predicted(job, accelerator_type, worker_id)
        if predicted is None or predicted.confidence < MIN_CONFIDENCE:
            return
        change = self.stragglers.observe(worker_id, job.job_id, value, predicted.value)
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

    def _predicted(self, job: JobEvidence, accelerator_type: str, worker_id: str) -> Belief | None:
        """The job's speed alone on the type as the worker's healthy peers of that type say: their
        measurements of it and of its class, the table's figure calibrated on them. None without
        a peer: a worker is slow against its peers, not against a table measured elsewhere."""
        s = self.settings
        excluded = frozenset(self.stragglers.flagged) | {worker_id}
        sources = list(job.alone_sources(accelerator_type, s.measurement_sd, NO_STRAGGLERS, excluded))
        for other_id in self.classes[job.colocation_class].jobs:
            other = self.jobs[other_id]
            if other_id != job.job_id and accelerator_type in other.alone:
                pooled = combine(other.alone_sources(accelerator_type, s.measurement_sd, NO_STRAGGLERS, excluded))
                if pooled is not None:
                    sources.append(Source(pooled.value, pooled.variance + 2 * s.job_spread_sd**2, pooled.provenance))
        located = self.references.locate(job.colocation_class)
        peers = self.calibration.fitted(self.types, excluded) if located is not None else None
        if located is not None and peers is not None and peers.has_peers(accelerator_type):
            value = located[0].isolated[located[1], self.types.index(accelerator_type)]
            if np.isfinite(value):
                shift = peers.reference(job.colocation_class, accelerator_type)
                variance = s.reference_sd**2 + s.job_spread_sd**2 + shift.variance
                sources.append(Source(float(value) * shift.factor, variance, Provenance.REFERENCE))
        return combine(sources)

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
            cell = self._cell(row_class, other, accelerator_type, direction)
            if cell is not None:
                self.classes[row_class].evidenced.add(cell)
                self._refill(row_class, cell)

    def _observe_class(self, name: str) -> None:
        """The class's speed alone moved: every measured fraction it is part of moves with it."""
        if self.references.locate(name) is None and self.classes[name].evidenced:
            self._refill(name)
        for other in self.classes.values():
            if other.evidenced and self.references.locate(other.name) is None and other.name != name:
                if any(self._reference_index(name, other.scale_factor) == cell[2] for cell in other.evidenced):
                    self._refill(other.name)

    def _cell(self, row_class: str, other: str, accelerator_type: str, direction: int) -> Cell | None:
        """Where (row_class, other) lands in row_class's completion row: row_class new, other a
        reference of its size, the type a feature type."""
        cls = self.classes.get(row_class)
        if cls is None or self.references.locate(row_class) is not None:
            return None
        reference = self._reference_index(other, cls.scale_factor)
        if reference is None or accelerator_type not in self.references.feature_types:
            return None
        return direction, self.references.feature_types.index(accelerator_type), reference

    def _reference_index(self, name: str, scale_factor: int) -> int | None:
        group = self.references.group(scale_factor)
        return None if group is None else group.index.get(name)

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
        group = model.group
        for direction, position, reference in (only,) if only is not None else cls.evidenced:
            w = self.references.feature_types[position]
            if direction == WITH and not self._measured_alone(name, w):
                # its fraction there would be measured against a guess of its speed alone: left
                # to the completion, and the packed runs tell its speed instead (_packed_sources)
                continue
            partner = group.classes[reference]
            a, b = (name, partner) if direction == WITH else (partner, name)
            belief = combine(self._fraction_sources(a, b, w))
            if belief is not None:
                row[model.column(direction, position, reference)] = belief.value
        model.observe(name, row)

    def _measured_alone(self, name: str, accelerator_type: str) -> bool:
        pool = self.pools.get((name, accelerator_type))
        mean = pool.mean() if pool is not None else None
        return mean is not None and mean.value > 0

    # -- figures -------------------------------------------------------------------------------------

    def _row(self, job: JobEvidence) -> Row:
        cls = self.classes[job.colocation_class]
        key = (cls.stamp, self.changes.global_stamp)
        cached = self._rows.get(job.job_id)
        if cached is not None and cached[0] == key:
            return cached[1]
        row = self._compute_row(job)
        self._rows[job.job_id] = (key, row)
        return row

    def _compute_row(self, job: JobEvidence) -> Row:
        s = self.settings
        slow = self._slow
        located = self.references.locate(job.colocation_class)
        spread = s.job_spread_sd**2
        direct: dict[str, list[Source]] = {}
        for w in self._types_out:
            k = self.types.index(w)
            sources = list(job.alone_sources(w, s.measurement_sd, slow))
            pooled = self._pool(job.colocation_class, w).mean(without=job.job_id)
            if pooled is not None:
                sources.append(Source(pooled.value, pooled.variance + spread, pooled.provenance, pooled.count))
            if located is not None:
                value = located[0].isolated[located[1], k]
                if np.isfinite(value):
                    calibrated = self._calibrated.reference(job.colocation_class, w)
                    variance = s.reference_sd**2 + spread + calibrated.variance
                    sources.append(Source(float(value) * calibrated.factor, variance, Provenance.REFERENCE))
            if w in job.user:
                sources.append(Source(job.user[w], s.user_sd**2, Provenance.USER))
            if located is None:
                sources += self._packed_sources(job, w, slow)
            direct[w] = sources
        beliefs = {w: combine(sources) for w, sources in direct.items()}
        measured = {
            w: b for w, b in beliefs.items()
            if b is not None and b.value > 0 and b.provenance in MEASUREMENTS
        }
        match = None if located is not None else self._match(job.colocation_class, job.scale_factor)
        typical = self._typical.get(job.scale_factor, self._typical[1])
        row: Row = {}
        for w in self._types_out:
            k = self.types.index(w)
            sources = direct[w]
            if match is not None and measured and w not in measured:
                ratio = self._ratio_source(match, measured, k)
                if ratio is not None:
                    sources = [*sources, ratio]
            if not sources:  # nothing at all is known: the typical job of its size
                calibrated = self._calibrated.typical(w)
                sources = [Source(float(typical[k]) * calibrated.factor, s.typical_sd**2 + calibrated.variance, Provenance.REFERENCE)]
            belief = combine(sources)
            row[w] = belief if belief is not None else Belief(0.0, 0.0, Provenance.REFERENCE)
        return row

    def _packed_sources(self, job: JobEvidence, accelerator_type: str, slow: Stragglers) -> list[Source]:
        """A new class's speed alone implied by its packed runs there: each run's steps/s over the
        prior fraction of that pair (the completion's, which never used this type's measured
        fractions unless the speed alone there was measured: no circle)."""
        out = []
        for partner, w in [key for key in job.packed if key[1] == accelerator_type]:
            packed = combine(job.packed_sources(partner, w, self.settings.measurement_sd, slow))
            prior = self._fraction_prior(job.colocation_class, partner, w)
            if packed is None or prior is None or not (packed.value > 0 and prior.value > 0):
                continue
            out.append(Source(packed.value / prior.value, packed.variance + prior.variance, Provenance.COMPLETED))
        return out

    def _ratio_source(self, match: np.ndarray, measured: dict[str, Belief], k: int) -> Source | None:
        """The job's measured speeds times the matched reference's ratio to type k (with the hardware's
        difference between the types, as calibrated)."""
        if not np.isfinite(match[k]):
            return None
        logs, variances = [], []
        for w, belief in measured.items():
            other = match[self.types.index(w)]
            if np.isfinite(other) and other > 0:
                if match[k] <= 0:
                    return Source(0.0, self.settings.matched_sd**2, Provenance.REFERENCE)
                between = self._calibrated.between(self.types[k], w)
                logs.append(belief.log_value + math.log(match[k] / other) + between.log_shift)
                variances.append(belief.variance + between.variance)
        if not logs:
            return None
        variance = self.settings.matched_sd**2 + math.fsum(variances) / len(variances)
        return Source(math.exp(math.fsum(logs) / len(logs)), variance, Provenance.REFERENCE)

    def _match(self, name: str, scale_factor: int) -> np.ndarray | None:
        """(K,) the speeds alone of the reference a new class is matched to: by its completed
        colocation row when anything was measured packed, else by its measured speeds alone (the
        nearest in log speed on the types measured)."""
        group = self.references.group(scale_factor)
        if group is None:
            return None
        key = (self.classes[name].stamp, self.changes.global_stamp)
        cached = self._matches.get(name)
        if cached is not None and cached[0] == key:
            return cached[1]
        index = self.colocation.match(name, scale_factor) if self.classes[name].evidenced else None
        if index is None:
            index = self._speed_match(name, group.isolated)
        found = None if index is None else group.isolated[index]
        self._matches[name] = (key, found)
        return found

    def _speed_match(self, name: str, isolated: np.ndarray) -> int | None:
        measured = []
        for k, w in enumerate(self.types):
            pooled = self.pools.get((name, w))
            mean = pooled.mean() if pooled is not None else None
            if mean is not None and mean.value > 0:  # against the table calibrated to this hardware
                measured.append((k, math.log(mean.value) - self._calibrated.typical(w).log_shift))
        if not measured:
            return None
        columns = [k for k, _ in measured]
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(isolated[:, columns])
        distance = np.nanmean((logs - np.array([v for _, v in measured])) ** 2, axis=1)
        distance = np.where(np.isfinite(distance), distance, np.inf)
        return int(np.argmin(distance)) if np.isfinite(distance).any() else None

    def _fraction_sources(self, name: str, partner: str, accelerator_type: str) -> list[Source]:
        """Measured fractions of ``name`` packed with ``partner`` on the type: each pooled job's
        packed steps/s over its own estimate alone there."""
        s = self.settings
        sources = []
        for job_id in self._packed_jobs.get((name, partner, accelerator_type), ()):
            job = self.jobs.get(job_id)
            if job is None:
                continue
            packed = combine(job.packed_sources(partner, accelerator_type, s.measurement_sd, self._slow))
            if packed is None:
                continue
            if packed.value <= 0:
                sources.append(Source(0.0, 0.0, packed.provenance))
                continue
            alone = self._row(job).get(accelerator_type)
            if alone is None or alone.value <= 0:
                continue
            fraction = min(1.0, packed.value / alone.value)
            sources.append(Source(fraction, packed.variance + alone.variance, packed.provenance))
        return sources

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
        belief = self._compute_fraction(name, partner, accelerator_type)
        self._fractions[key] = (stamp, belief)
        return belief

    def _compute_fraction(self, name: str, partner: str, accelerator_type: str) -> Belief | None:
        sources = self._fraction_sources(name, partner, accelerator_type)
        prior = self._fraction_prior(name, partner, accelerator_type)
        if prior is not None:
            sources.append(prior)
        belief = combine(sources)
        if belief is not None and belief.value > 1.0:
            belief = Belief(1.0, belief.variance, belief.provenance)
        return belief

    def _fraction_prior(self, name: str, partner: str, accelerator_type: str) -> Source | None:
        """The prior of a fraction (cached: it moves only with the completion and the matches)."""
        key = (name, partner, accelerator_type)
        cached = self._priors.get(key)
        if cached is not None and cached[0] == self.changes.global_stamp:
            return cached[1]
        prior = self._compute_fraction_prior(name, partner, accelerator_type)
        self._priors[key] = (self.changes.global_stamp, prior)
        return prior

    def _compute_fraction_prior(self, name: str, partner: str, accelerator_type: str) -> Source | None:
        s = self.settings
        scale_factor = self.classes[name].scale_factor
        model = self.colocation.model(scale_factor)
        if model is None:
            return None
        group = model.group
        k = self.types.index(accelerator_type)
        mine, theirs = group.index.get(name), group.index.get(partner)
        if accelerator_type not in self.references.feature_types:
            # a pseudo-type: the references' (or the matches') own figure there
            a = mine if mine is not None else self.colocation.match(name, scale_factor)
            b = theirs if theirs is not None else self.colocation.match(partner, scale_factor)
            if a is None or b is None or not np.isfinite(group.colocation[a, b, k]):
                return None
            return Source(float(group.colocation[a, b, k]), s.matched_sd**2, Provenance.REFERENCE)
        position = self.references.feature_types.index(accelerator_type)
        if mine is not None and theirs is not None:
            value = group.colocation[mine, theirs, k]
            if np.isfinite(value):
                return Source(float(value), s.reference_sd**2, Provenance.REFERENCE)
            row = self.colocation.reference_row(scale_factor, mine)
            return None if row is None else Source(float(row[model.column(WITH, position, theirs)]), s.matched_sd**2, Provenance.COMPLETED)
        if mine is None and theirs is not None:
            row, column, provenance = self.colocation.prior_row(name, scale_factor), model.column(WITH, position, theirs), Provenance.COMPLETED
            evidenced = bool(self.classes[name].evidenced)
        elif mine is not None:
            row, column, provenance = self.colocation.prior_row(partner, scale_factor), model.column(AGAINST, position, mine), Provenance.COMPLETED
            evidenced = bool(self.classes[partner].evidenced)
        else:  # two new classes: each one's row against the other's match
            row = self.colocation.prior_row(name, scale_factor)
            match = self.colocation.match(partner, scale_factor) if self.classes[partner].evidenced else None
            if row is None:
                return None
            if match is None:
                start = model.column(WITH, position, 0)
                value = float(np.mean(row[start : start + model.num_references]))
                return Source(value, TYPICAL_FRACTION_SD**2, Provenance.REFERENCE)
            column, provenance, evidenced = model.column(WITH, position, match), Provenance.REFERENCE, bool(self.classes[name].evidenced)
        if row is None:
            return None
        variance = s.matched_sd**2 if evidenced else TYPICAL_FRACTION_SD**2
        return Source(float(row[column]), variance, provenance)

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
        rows = changes.rows_to_send(self._row_message, self._order_of, s.publish_tolerance, s.publish_sds)
        pairs = changes.pairs_to_send(self._pair_message, s.publish_tolerance, s.publish_sds)
        if changes.dirty_profiling or self._gate_stale or any(r.job_id in self._gate_jobs for r in rows):
            self._update_gate()
        profiling = changes.requests_to_send(self._class_requests)
        return changes.message(rows, pairs, profiling, always=always, profiling_share=s.profiling_share)

    def _order_of(self, job_id: str) -> int:
        return self.jobs[job_id].order if job_id in self.jobs else -1

    def _row_message(self, job_id: str) -> JobThroughput | None:
        job = self.jobs.get(job_id)
        if job is None or not job.active:
            return None
        row = self._row(job)
        return JobThroughput(
            job_id,
            {w: rounded(b.value) for w, b in row.items()},
            {w: b.provenance for w, b in row.items()},
            {w: round(b.confidence, 3) for w, b in row.items()},
            job.colocation_class,
        )

    def _pair_message(self, pair: tuple[str, str]) -> ColocationEstimate | None:
        a, b = pair
        if a not in self.classes or b not in self.classes or not (self.classes[a].active and self.classes[b].active):
            return None
        fractions, provenance, confidence = {}, {}, {}
        for w in self._types_out:
            first, second = self._fraction(a, b, w), self._fraction(b, a, w)
            if first is None or second is None:
                continue
            fractions[w] = (rounded(first.value), rounded(second.value))
            weaker = first if first.confidence <= second.confidence else second
            provenance[w] = weaker.provenance
            confidence[w] = round(weaker.confidence, 3)
        return ColocationEstimate((a, b), fractions, provenance, confidence)

    def _class_requests(self, name: str) -> list[ProfilingRequest]:
        """A class's profiling requests, one per active job: its first job asks, the others not."""
        cls = self.classes.get(name)
        if cls is None:
            return []
        chosen = min(cls.active, key=lambda j: self.jobs[j].order) if cls.active else None
        return [
            self._profiling_request(cls, job_id) if job_id == chosen else ProfilingRequest(job_id, ())
            for job_id in sorted(cls.active)
        ]

    def _update_gate(self) -> None:
        """Whether packed cells may be asked (profiling.py); when that flips, every new class's
        request changes. (Recomputed only when a request, a gang seen or a profiled job's row moved.)"""
        self._gate_stale = False
        new = [c for c in self.classes.values() if c.active and self.references.locate(c.name) is None]
        self._gate_jobs = {min(c.active, key=lambda j: self.jobs[j].order) for c in new}
        packing_open = True
        for cls in new:
            alone = tuple(ProfileCell(w) for w in self.references.feature_types if not len(self.pools.get((cls.name, w), ())))
            profiled = self.changes.published_rows.get(min(cls.active, key=lambda j: self.jobs[j].order))
            believed = profiled.throughputs_steps_per_s if profiled is not None else {}
            if blocks_packing(alone, cls.scale_factor, self._gangs_seen, believed):
                packing_open = False
                break
        if packing_open != self._packing_open:
            self._packing_open = packing_open
            self.changes.dirty_profiling.update(c.name for c in new)

    def _profiling_request(self, cls: _Class, job_id: str) -> ProfilingRequest:
        """What a new class still lacks (profiling.py), packed cells only once runs alone are done."""
        if self.references.locate(cls.name) is not None:
            return ProfilingRequest(job_id, ())
        types = self.references.feature_types
        measured = {w for w in types if len(self.pools.get((cls.name, w), ()))}
        with_itself = {w for w in types if self._packed_jobs.get((cls.name, cls.name, w))} if len(cls.active) > 1 else None
        lacking = wanted(
            cls.name, types, measured, with_itself, self.colocation.model(cls.scale_factor), cls.evidenced,
            self.settings.profiling_percentage,
        )
        return request(job_id, lacking, self._packing_open)


def _usable(report: JobProgress) -> bool:
    """A report that measured something: not a crash, and a real worker's with stepping time (a
    simulated fleet's, which has no breakdown, is the simulator's measurement: a zero there is a
    job that cannot run)."""
    if report.outcome in ("crashed", "killed"):
        return False
    real = report.startup_s > 0 or report.restore_s > 0 or report.stepping_s > 0 or report.checkpoint_s > 0
    # a real lease that ended before its first step (start-up longer than the lease) measured
    # nothing: a job that truly cannot run on a type crashes there (out of memory)
    return report.stepping_s > 0 and report.steps_done > 0 if real else True


def _ordered(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)
