"""The invariants a run must keep whatever faults it met (issue 13; docs/reliability.md), checked
over the mechanism's journal (its inputs and its audit trail, core/audit.py) and, where given,
what the workers and the broker saw. Pure: values in (the journal's rows), a report out.

I1 every accepted job reaches exactly one terminal state (completed at most once); a submission
   refused on receipt was never accepted. The same end written again after a restart (the
   boundary re-done under the next epoch, published under the same message id) is absorbed.
I2 no GPU holds two leases at once: within a boundary's leases (the journal), and in time on the
   workers' side (their occupancy log, when given).
I3 no GPU leaked: at each boundary the pool is exactly the live workers' GPUs (every one leased
   or free, none of a worker that is gone), leases are within the pool, and no lost worker keeps
   a GPU (in the journal or, when given, running a lease on its side) past its grace plus a round.
I4 the GPU time charged to a job is the time of the leases it really ran: each settled lease
   charges each member ran_s x GPUs / members, ran_s being what its accepted reports say
   (nothing for a fenced or unreported lease, nothing for a gang that got fewer steps than GPUs,
   as Gavel counts it), and credits exactly the steps reported. Not checked under Gavel's own
   accounting (the gavel preset charges a round from the previous round's end).
I5 after the faults stop, every pending job makes progress within ``progress_rounds`` rounds.
I6 every dead letter has a reason, and only injected poison is dead-lettered.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from common.codec import DEFAULT_CODEC
from common.errors import DecodeError
from common.messages import JobProgress, JobSubmitted, WorkerFenced, WorkerRegistered
from mechanism_service.core import audit

INVARIANTS = ("I1", "I2", "I3", "I4", "I5", "I6")
TOLERANCE_S = 1e-6  # charges are sums of floats: equal within this, relative to the charge
Row = tuple[int, str, bytes, "float | None"]  # a journal event: (seq, kind, body, at_s)


@dataclass(frozen=True, slots=True)
class Violation:
    invariant: str
    subject: str  # the job, GPU, lease or dead letter it is about
    detail: str


@dataclass(frozen=True, slots=True)
class WorkerLease:
    """The workers' side: a GPU ran a lease from ``start_s`` to ``end_s`` (its own clock)."""

    worker_id: str
    gpu_index: int
    lease_id: str
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class DeadLetterFact:
    queue: str
    reason: str
    injected: bool  # published by the fault injector as poison


@dataclass(frozen=True, slots=True)
class CheckReport:
    violations: tuple[Violation, ...]
    checked: Mapping[str, int]  # invariant -> facts checked
    skipped: Mapping[str, str]  # invariant -> why it was not checked
    notes: Mapping[str, int] = field(default_factory=dict)  # counts worth knowing (ends absorbed, ...)

    @property
    def ok(self) -> bool:
        return not self.violations

    def as_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "violations": [{"invariant": v.invariant, "subject": v.subject, "detail": v.detail} for v in self.violations],
            "checked": dict(self.checked),
            "skipped": dict(self.skipped),
            "notes": dict(self.notes),
        }


@dataclass
class _Journal:
    """The journal's rows, decoded once, in order."""

    submitted: list[tuple[int, str, float | None]] = field(default_factory=list)  # (seq, job id, arrival)
    ends: list[tuple[int, audit.EndRecord]] = field(default_factory=list)
    boundaries: list[tuple[int, audit.BoundaryRecord]] = field(default_factory=list)
    reports: dict[str, dict[str, JobProgress]] = field(default_factory=dict)  # lease -> job -> first accepted
    registered: list[tuple[int, str]] = field(default_factory=list)  # (seq, worker id)
    lost: list[tuple[int, str, float]] = field(default_factory=list)  # (seq, worker id, at)
    unreadable: list[Violation] = field(default_factory=list)


def check(
    rows: Iterable[Row],
    *,
    worker_leases: Sequence[WorkerLease] | None = None,
    dead_letters: Sequence[DeadLetterFact] | None = None,
    finished: bool = False,
    progress_rounds: int | None = None,
    quiet_from_s: float = 0.0,
) -> CheckReport:
    """``finished``: the run is over, so a job with no end is a violation (a live journal's
    running jobs are not). ``progress_rounds``: I5's bound (policy-dependent: FIFO starves by
    design), None to skip it; counted from ``quiet_from_s``, when the faults stopped."""
    journal = _read(rows)
    violations: list[Violation] = list(journal.unreadable)
    checked: dict[str, int] = {}
    skipped: dict[str, str] = {}
    notes: dict[str, int] = {}
    checked["I1"] = _terminal_states(journal, finished, violations, notes)
    checked["I2"] = _one_lease_per_gpu(journal, worker_leases, violations)
    if worker_leases is None:
        notes["I2_worker_side_unchecked"] = 1
    checked["I3"] = _no_leaks(journal, worker_leases, violations)
    if any(record.charges_from_previous_end for _, record in journal.boundaries):
        skipped["I4"] = "Gavel's accounting (the gavel preset) charges a round from the previous round's end"
    else:
        checked["I4"] = _charges(journal, violations)
    if progress_rounds is None:
        skipped["I5"] = "no bound given (it depends on the policy: FIFO starves by design)"
    else:
        checked["I5"] = _progress(journal, progress_rounds, quiet_from_s, violations)
    if dead_letters is None:
        skipped["I6"] = "no dead letters given (they are the broker's, not the journal's)"
    else:
        checked["I6"] = _dead_letters(dead_letters, violations)
    return CheckReport(tuple(violations), checked, skipped, notes)


def _read(rows: Iterable[Row]) -> _Journal:
    journal = _Journal()
    workers: tuple[tuple[str, str, int], ...] = ()
    pool: tuple[audit.GPU, ...] = ()
    for seq, kind, body, at_s in rows:
        try:
            if kind == audit.BOUNDARY:
                record = audit.decode_boundary(body)
                # a record says the workers and the pool when they changed: carried forward
                workers = record.workers if record.workers is not None else workers
                pool = record.pool if record.pool is not None else pool
                journal.boundaries.append((seq, dataclasses.replace(record, workers=workers, pool=pool)))
            elif kind == audit.ENDED:
                journal.ends.append((seq, audit.decode_end(body)))
            elif kind in ("submitted", "progress", "worker", "lost"):
                message = DEFAULT_CODEC.decode(body).message
                if isinstance(message, JobSubmitted):
                    journal.submitted.append((seq, message.spec.job_id, at_s))
                elif isinstance(message, JobProgress):
                    journal.reports.setdefault(message.lease_id, {}).setdefault(message.job_id, message)
                elif isinstance(message, WorkerRegistered):
                    journal.registered.append((seq, message.worker_id))
                elif isinstance(message, WorkerFenced) and at_s is not None:
                    journal.lost.append((seq, message.worker_id, at_s))
        except (DecodeError, ValueError, KeyError, TypeError) as e:
            journal.unreadable.append(Violation("journal", f"event {seq}", f"a {kind} event cannot be read: {e}"))
    return journal


def _terminal_states(journal: _Journal, finished: bool, out: list[Violation], notes: dict[str, int]) -> int:
    """I1. Per job id, in journal order: a submission opens it; a refusal on receipt closes it as
    never accepted; the first terminal end closes it; a later end is a repeat (absorbed when it
    is the same end under a later epoch) or a violation."""
    timeline: dict[str, list[tuple[int, str, audit.EndRecord | None]]] = collections.defaultdict(list)
    for seq, job_id, _ in journal.submitted:
        timeline[job_id].append((seq, "submitted", None))
    for seq, end in journal.ends:
        timeline[end.job_id].append((seq, "end", end))
    accepted = absorbed = 0
    for job_id, events in timeline.items():
        events.sort(key=lambda e: e[0])
        open_submissions = 0
        last_end: audit.EndRecord | None = None
        for _, what, end in events:
            if what == "submitted":
                open_submissions += 1
                continue
            assert end is not None
            if end.outcome == audit.REFUSED:
                if open_submissions == 0:
                    out.append(Violation("I1", job_id, f"refused at {end.at_s:g} s with no submission to refuse"))
                open_submissions = max(0, open_submissions - 1)
                continue
            if open_submissions > 0:
                accepted += 1
                open_submissions = 0  # a repeat of an accepted submission is absorbed, not journaled
                last_end = end
                continue
            if last_end is not None and last_end.outcome == end.outcome and end.epoch > last_end.epoch:
                absorbed += 1  # the same end, re-done by a restarted mechanism
                last_end = end
            elif last_end is not None:
                out.append(Violation(
                    "I1", job_id,
                    f"a second terminal state: {end.outcome} at {end.at_s:g} s (epoch {end.epoch}) after "
                    f"{last_end.outcome} at {last_end.at_s:g} s (epoch {last_end.epoch})",
                ))
            else:
                out.append(Violation("I1", job_id, f"{end.outcome} at {end.at_s:g} s but never accepted"))
        if open_submissions > 0:
            accepted += 1
            if finished:
                out.append(Violation("I1", job_id, "accepted, and never reached a terminal state"))
    notes["ends_absorbed"] = absorbed
    return accepted


def _one_lease_per_gpu(journal: _Journal, worker_leases: Sequence[WorkerLease] | None, out: list[Violation]) -> int:
    """I2."""
    count = 0
    for _, record in journal.boundaries:
        holder: dict[audit.GPU, str] = {}
        for lease in record.leases:
            for gpu in lease.gpus:
                count += 1
                other = holder.setdefault(gpu, lease.lease_id)
                if other != lease.lease_id:
                    out.append(Violation(
                        "I2", _gpu(gpu), f"round {record.round_id} leases it twice: {other} and {lease.lease_id}"
                    ))
    by_gpu: dict[audit.GPU, list[WorkerLease]] = collections.defaultdict(list)
    for held in worker_leases or ():
        by_gpu[(held.worker_id, held.gpu_index)].append(held)
    for gpu, spans in by_gpu.items():
        spans.sort(key=lambda h: (h.start_s, h.end_s))
        for before, after in zip(spans, spans[1:]):
            count += 1
            if after.start_s < before.end_s - TOLERANCE_S and after.lease_id != before.lease_id:
                out.append(Violation(
                    "I2", _gpu(gpu),
                    f"ran {before.lease_id} until {before.end_s:g} s and {after.lease_id} from {after.start_s:g} s",
                ))
    return count


def _no_leaks(journal: _Journal, worker_leases: Sequence[WorkerLease] | None, out: list[Violation]) -> int:
    """I3."""
    count = 0
    for seq, record in journal.boundaries:
        assert record.workers is not None and record.pool is not None  # carried forward by _read
        live = {(w, k) for w, _, gpus in record.workers for k in range(gpus)}
        pool = set(record.pool)
        leased = {gpu for lease in record.leases for gpu in lease.gpus}
        count += 1
        where = f"at the boundary of {record.at_s:g} s"
        for gpu in sorted(leased - pool):
            out.append(Violation("I3", _gpu(gpu), f"leased {where} but not in the pool"))
        for gpu in sorted(pool - live):
            out.append(Violation("I3", _gpu(gpu), f"in the pool {where}, and no live worker has it"))
        for gpu in sorted(live - pool):
            out.append(Violation("I3", _gpu(gpu), f"a live worker's GPU neither leased nor free {where} (leaked)"))
        if len(record.pool) != len(pool):
            out.append(Violation("I3", f"boundary {record.at_s:g} s", "a GPU is in the pool twice"))
        for lost_seq, worker_id, lost_at_s in journal.lost:
            if lost_seq >= seq or record.at_s <= lost_at_s + record.worker_grace_s + record.round_s:
                continue
            back = any(lost_seq < s < seq and w == worker_id for s, w in journal.registered)
            if not back and any(w == worker_id for w, _, _ in record.workers or ()):
                out.append(Violation(
                    "I3", worker_id, f"lost at {lost_at_s:g} s and still in the cluster {where}, past its grace and a round"
                ))
    if worker_leases is not None and journal.lost:
        limits = {  # the grace and round in force when each worker was lost
            (worker_id, lost_at_s): _limit_s(journal, lost_seq) for lost_seq, worker_id, lost_at_s in journal.lost
        }
        for held in worker_leases:
            for (worker_id, lost_at_s), limit_s in limits.items():
                if held.worker_id != worker_id or held.start_s > lost_at_s:
                    continue
                count += 1
                if held.end_s > lost_at_s + limit_s + TOLERANCE_S:
                    out.append(Violation(
                        "I3", _gpu((held.worker_id, held.gpu_index)),
                        f"its worker was lost at {lost_at_s:g} s and it ran {held.lease_id} until {held.end_s:g} s, "
                        f"past its grace and a round ({limit_s:g} s)",
                    ))
    return count


def _limit_s(journal: _Journal, seq: int) -> float:
    """The grace plus a round of the boundary nearest before ``seq`` (or the first one)."""
    record = next((r for s, r in reversed(journal.boundaries) if s < seq), None)
    if record is None and journal.boundaries:
        record = journal.boundaries[0][1]
    return 0.0 if record is None else record.worker_grace_s + record.round_s


def _charges(journal: _Journal, out: list[Violation]) -> int:
    """I4."""
    dispatched = {lease.lease_id: lease for _, record in journal.boundaries for lease in record.leases}
    count = 0
    for _, record in journal.boundaries:
        for settled in record.settled:
            lease = dispatched.get(settled.lease_id)
            if lease is None:
                out.append(Violation("I4", settled.lease_id, "settled, and no boundary dispatched it"))
                continue
            reports = journal.reports.get(settled.lease_id, {})
            ran_s = max((reports[j].elapsed_s for j in settled.job_ids if j in reports), default=0.0)
            reported = [reports[j].steps_done if j in reports else 0 for j in settled.job_ids]
            # a gang that got fewer steps than GPUs is charged and credited nothing (Gavel, 8.3),
            # unless they were every step it had left (the settle then credits them: the
            # default preset's finishing_gang_fails=False)
            short = ran_s <= 0 or any(s < settled.gpus for s in reported)
            gang_failed = not settled.ended and short and not any(settled.steps)
            share_gpu_s = 0.0 if gang_failed else ran_s * settled.gpus / len(lease.job_ids)
            for job_id, steps, charged, reported_steps in zip(
                settled.job_ids, settled.steps, settled.charged_gpu_s, reported, strict=True
            ):
                count += 1
                if abs(charged - share_gpu_s) > TOLERANCE_S * max(1.0, share_gpu_s):
                    how = "its accepted reports say it ran " + (f"{ran_s:g} s" if reports else "nothing")
                    out.append(Violation(
                        "I4", job_id,
                        f"lease {settled.lease_id} charged {charged:g} GPU-s; {how}, so {share_gpu_s:g} GPU-s"
                        + (" (a gang with fewer steps than GPUs: nothing)" if gang_failed else ""),
                    ))
                expected_steps = 0 if gang_failed else reported_steps
                if steps != expected_steps:
                    out.append(Violation(
                        "I4", job_id, f"lease {settled.lease_id} credited {steps} steps; its reports say {expected_steps}"
                    ))
    return count


def _progress(journal: _Journal, bound_rounds: int, quiet_from_s: float, out: list[Violation]) -> int:
    """I5: from the first dispatched round after ``quiet_from_s``, no job that is waiting (accepted,
    arrived, not ended) goes more than ``bound_rounds`` dispatched rounds in a row without steps."""
    arrivals = {job_id: (seq, at_s) for seq, job_id, at_s in journal.submitted}
    ended = {}
    for seq, end in journal.ends:
        ended.setdefault(end.job_id, seq)
    waited: dict[str, int] = collections.Counter()
    flagged: set[str] = set()
    count = 0
    credited_since: set[str] = set()
    for seq, record in journal.boundaries:
        credited_since.update(j for s in record.settled for j, steps in zip(s.job_ids, s.steps) if steps > 0)
        if record.round_id < 0 or record.at_s < quiet_from_s:
            continue
        running = {j for lease in record.leases for j in lease.job_ids}
        for job_id, (submitted_seq, arrival_s) in arrivals.items():
            if submitted_seq > seq or ended.get(job_id, seq + 1) < seq or job_id in flagged:
                continue
            if arrival_s is not None and arrival_s > record.at_s:
                continue
            count += 1
            if job_id in credited_since or job_id in running:
                waited[job_id] = 0
                continue
            waited[job_id] += 1
            if waited[job_id] > bound_rounds:
                flagged.add(job_id)
                out.append(Violation(
                    "I5", job_id, f"waited {waited[job_id]} rounds without progress by {record.at_s:g} s (bound {bound_rounds})"
                ))
        credited_since.clear()
    return count


def _dead_letters(dead_letters: Sequence[DeadLetterFact], out: list[Violation]) -> int:
    """I6."""
    for k, letter in enumerate(dead_letters):
        if not letter.reason.strip():
            out.append(Violation("I6", f"dead letter {k} on {letter.queue}", "dead-lettered without a reason"))
        if not letter.injected:
            out.append(Violation("I6", f"dead letter {k} on {letter.queue}", f"not injected poison: {letter.reason}"))
    return len(dead_letters)


def _gpu(gpu: audit.GPU) -> str:
    return f"{gpu[0]}/gpu{gpu[1]}"
