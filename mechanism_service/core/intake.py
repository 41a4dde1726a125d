"""What the mechanism does with a submission the moment it arrives, before any round: pure.

    receive(intake, message, now_s, ...) -> Receipt

Each submission ends one of four ways (issue 9: a second trace's ids used to vanish without a
word, and a bad field stopped every later solve):

- ``new``: accepted; it waits for its arrival time, then for admission at a round boundary;
- ``known``: the same id with the same spec: a retried publish or a resubmitted trace, absorbed;
- ``conflict``: the same id with another spec: refused with what differs; the first job stays;
- ``refused``: a field no policy accepts, or (a mechanism on a table's rates) a job type the
  throughput table does not know.

Arrival times. In lockstep (a trace replayed across processes) a job arrives at its trace time.
On a live cluster, at the mechanism's own clock: ``arrival_offset_s`` after the first submission
of its batch reached the mechanism (so a trace keeps its spacing, counted from when it was
submitted), or after the job itself reached it when it has no batch.

Batches (one `gavel submit` each) are tallied so that the submitter can be told what became of
its jobs when it seals the batch, and so that a lockstep replay knows when the whole trace is in.
A batch is forgotten once sealed (every job of it came before its seal, on the same queue).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from common.errors import JobFieldError
from common.job_checks import MAX_TIME_S, check_number
from common.messages import JobSpec, JobSubmitted
from mechanism_service.core.rates import Rates
from mechanism_service.core.reducers import NewJob, submission_problem

# The fields that make two submissions under one id the same job. Not the arrival: a retry, or
# the same trace submitted again later, is the same job arriving again.
SPEC_FIELDS = ("job_type", "total_steps", "scale_factor", "priority_weight", "slo_s", "entity", "command")
Fingerprint = tuple[object, ...]
REASONS_KEPT = 100  # refusal reasons a batch remembers for its reply (all are counted)


def fingerprint(spec: JobSpec) -> Fingerprint:
    return tuple(getattr(spec, name) for name in SPEC_FIELDS)


def differences(before: Fingerprint, now: Fingerprint) -> str:
    """``total_steps 2000 (was 1000), slo_s None (was 3600.0)``."""
    return ", ".join(
        f"{name} {b!r} (was {a!r})" for name, a, b in zip(SPEC_FIELDS, before, now, strict=True) if a != b
    )


@dataclass
class Batch:
    """One submission's jobs as they came in, until it is sealed."""

    received: set[str] = field(default_factory=set)  # distinct job ids seen, whatever became of them
    new: int = 0
    known: int = 0
    refused: int = 0  # conflicts included
    reasons: dict[str, str] = field(default_factory=dict)  # the first REASONS_KEPT refusals
    anchor_s: float | None = None  # mechanism time its first job was received (live arrivals)

    def summary(self, batch_id: str, count: int) -> dict[str, object]:
        return {
            "batch_id": batch_id, "count": count, "received": len(self.received), "new": self.new,
            "known": self.known, "refused": self.refused, "reasons": dict(self.reasons),
        }


@dataclass
class Intake:
    """Every job id ever accepted (with its spec), the batches still open, and how the sealed
    ones ended."""

    known: dict[str, Fingerprint | None] = field(default_factory=dict)  # None: accepted before specs were kept
    batches: dict[str, Batch] = field(default_factory=dict)
    sealed: int = 0  # batches sealed
    short: int = 0  # of those, sealed with fewer jobs received than announced

    def seal(self, batch_id: str, count: int) -> dict[str, object]:
        """Close a batch; what became of it, for the submitter."""
        batch = self.batches.pop(batch_id, None) or Batch()
        self.sealed += 1
        self.short += len(batch.received) < count
        return batch.summary(batch_id, count)

    def all_sealed_in(self) -> bool:
        """A lockstep replay may start: some batch was sealed, and each was whole."""
        return self.sealed > 0 and self.short == 0


Outcome = Literal["new", "known", "conflict", "refused"]


@dataclass(frozen=True, slots=True)
class Receipt:
    outcome: Outcome
    job: NewJob | None = None  # new and refused: the job as it would be admitted
    reason: str = ""  # conflict and refused: why


def receive(
    intake: Intake,
    message: JobSubmitted,
    now_s: float,
    *,
    lockstep: bool,
    rates: Rates,
    types: Sequence[str],
) -> Receipt:
    """Decide what becomes of a submission received at ``now_s`` (mechanism time), and note it.
    ``types``: the accelerator types a job may run on here (to refuse an unknown job type now)."""
    spec = message.spec
    batch = intake.batches.setdefault(message.batch_id, Batch()) if message.batch_id else None
    if batch is not None:
        batch.received.add(spec.job_id)
    this = fingerprint(spec)
    if spec.job_id in intake.known:
        before = intake.known[spec.job_id]
        if before is None or before == this:
            if batch is not None:
                batch.known += 1
            return Receipt("known")
        reason = (
            f"job id {spec.job_id!r} is taken by another job ({differences(before, this)}); "
            "submit this one under another id"
        )
        _refuse(batch, spec.job_id, reason)
        return Receipt("conflict", reason=reason)
    try:
        arrival_s = _arrival_s(message, batch, now_s, lockstep=lockstep)
    except JobFieldError as e:
        _refuse(batch, spec.job_id, str(e))
        return Receipt("refused", None, str(e))
    job = NewJob(
        spec.job_id, spec.job_type, spec.scale_factor, spec.total_steps, arrival_s,
        spec.priority_weight, spec.slo_s, spec.entity,
    )
    problem = submission_problem(job, rates, types)
    if problem:
        _refuse(batch, spec.job_id, problem)
        return Receipt("refused", job, problem)
    intake.known[spec.job_id] = this
    if batch is not None:
        batch.new += 1
    return Receipt("new", job)


def _arrival_s(message: JobSubmitted, batch: Batch | None, now_s: float, *, lockstep: bool) -> float:
    if lockstep:
        return check_number(message.spec.submit_time_s, "submit_time_s", maximum=MAX_TIME_S)
    offset_s = message.arrival_offset_s
    if offset_s != 0.0:  # the common case (one job, --now) needs no check
        offset_s = check_number(offset_s, "arrival_offset_s", maximum=MAX_TIME_S)
    if batch is None:
        return now_s + offset_s
    if batch.anchor_s is None:
        batch.anchor_s = now_s
    return batch.anchor_s + offset_s


def replay_now_s(message: JobSubmitted, arrival_s: float) -> float:
    """The ``now_s`` that makes ``receive`` stamp a journaled submission with the arrival it was
    given (on a live cluster the stamp depends on when the batch's first job was received)."""
    return arrival_s - message.arrival_offset_s


def _refuse(batch: Batch | None, job_id: str, reason: str) -> None:
    if batch is None:
        return
    batch.refused += 1
    if len(batch.reasons) < REASONS_KEPT:
        batch.reasons[job_id] = reason
