"""What a live cluster went through, read from its mechanism's journal (common/journal.py): the
jobs it accepted, what became of them, the leases it dispatched and what its workers reported of
them, the estimates it held, its fleet and the settings its rounds ran under. Pure: the journal's
events in, one ``History`` out (``read_history`` below is the thin reader of a file).

Where each figure comes from (mechanism_service/core/audit.py for the audit trail):

- a job's arrival: the time the mechanism stamped on its ``submitted`` event (its own clock, as
  `gavel jobs` shows it), or in lockstep, which stamps none, the trace's ``submit_time_s``;
- its end: the ``ended`` record; a completed job's completion time is its last lease's end (the
  dispatching boundary's time plus the lease's reported elapsed time), which is what the mechanism
  published as the completion (JobCompleted), not the later boundary that recorded the end;
- a lease: dispatched at its ``boundary`` (the record's time, its type and GPUs), with the last
  report of each member (``progress``: steps, elapsed time, steps/s while stepping);
- the fleet: the workers each boundary record lists when they changed;
- the policy: the one named by the allocations it received; the preset: the one whose accounting
  the boundary records say (``charges_from_previous_end``); the round length: the records' own.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from common.codec import DEFAULT_CODEC
from common.errors import DecodeError, JournalError
from common.messages import (
    AllocationComputed,
    AllocationFailed,
    JobProgress,
    JobSubmitted,
    ThroughputEstimated,
    WorkerRegistered,
)
from mechanism_service.core import audit

Event = tuple[int, str, bytes, float | None]  # (seq, kind, body, at_s): common.journal.read_events


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job the mechanism accepted, as it was submitted."""

    job_id: str
    job_type: str
    scale_factor: int
    total_steps: int
    arrival_s: float  # the mechanism's clock
    priority_weight: float
    slo_s: float | None
    entity: str | None
    user_estimate_steps_per_s: Mapping[str, float] | None  # gavel submit --throughput


@dataclass(frozen=True, slots=True)
class JobEnd:
    outcome: str  # completed | failed | cancelled | rejected (audit.TERMINAL)
    at_s: float  # the boundary (or handler) that recorded it
    completion_s: float | None  # completed: its last lease's end (JobCompleted's time)


@dataclass(frozen=True, slots=True)
class LeaseRun:
    """A dispatched lease and what its workers reported of it (per member, in ``job_ids`` order)."""

    lease_id: str
    job_ids: tuple[str, ...]
    accelerator_type: str
    gpus: int
    dispatched_at_s: float
    extended: bool
    steps: tuple[int, ...]  # steps reported done under the lease (0: no report)
    steps_per_s: tuple[float, ...]  # the reported steps/s while stepping (0: no report)
    elapsed_s: float  # the longest member's elapsed time (0: no report)
    reported: bool
    crashed: bool

    @property
    def end_s(self) -> float:
        return self.dispatched_at_s + self.elapsed_s


@dataclass(frozen=True, slots=True)
class History:
    jobs: tuple[JobRecord, ...]  # accepted (refused and rejected submissions left out), in order
    ends: Mapping[str, JobEnd]
    leases: tuple[LeaseRun, ...]  # in dispatch order
    credited: tuple[tuple[float, str, int], ...]  # (boundary time, job id, steps credited there)
    estimates: Mapping[str, Mapping[str, float]]  # job id -> the estimator's latest steps/s per type
    fleets: tuple[tuple[float, Mapping[str, int]], ...]  # (time, accelerator type -> GPUs) at each change
    gpus_per_worker: tuple[int, ...]  # each worker's GPU count in the last fleet
    round_s: float | None  # None: no boundary recorded it
    charges_from_previous_end: bool | None  # None: not recorded
    policies: Mapping[str, int]  # policy name -> allocations received under it
    last_policy: str | None
    clocks: tuple[str, ...]  # what the workers said their leases ran on ("wall", "scaled x100", "lockstep")
    starts: int  # the mechanism's starts (epochs): restarts beyond the first
    workers_lost: int
    packed_leases: int


PROGRESS_EVERY = 100_000  # events between two calls of history_of's progress


def history_of(events: Iterable[Event], progress: Callable[[int], None] | None = None) -> History:
    """Read the journal's events, in order; ``progress(events read)`` every PROGRESS_EVERY (a long
    history takes ~0.1 ms an event). A body that does not decode is a ``JournalError`` naming the
    event."""
    jobs: dict[str, JobRecord] = {}
    ends: dict[str, tuple[str, float]] = {}
    dispatched: dict[str, tuple[audit.LeaseRecord, float]] = {}
    reports: dict[tuple[str, str], JobProgress] = {}
    credited: list[tuple[float, str, int]] = []
    estimates: dict[str, dict[str, float]] = {}
    fleets: list[tuple[float, dict[str, int]]] = []
    workers_last: tuple[tuple[str, str, int], ...] = ()
    registered: dict[str, tuple[str, int]] = {}
    round_s: float | None = None
    charges: bool | None = None
    policies: collections.Counter[str] = collections.Counter()
    last_policy = None
    clocks: set[str] = set()
    starts = lost = 0
    for count, (seq, kind, body, at_s) in enumerate(events, 1):
        if progress is not None and count % PROGRESS_EVERY == 0:
            progress(count)
        try:
            if kind == audit.BOUNDARY:
                record = audit.decode_boundary(body)
                for lease in record.leases:
                    dispatched[lease.lease_id] = (lease, record.at_s)
                for s in record.settled:
                    credited.extend((record.at_s, job_id, n) for job_id, n in zip(s.job_ids, s.steps))
                if record.workers is not None:
                    workers_last = record.workers
                    fleet = _fleet(record.workers)
                    if not fleets or fleets[-1][1] != fleet:
                        fleets.append((record.at_s, fleet))
                if record.round_s > 0:
                    round_s = record.round_s
                charges = record.charges_from_previous_end
            elif kind == audit.ENDED:
                end = audit.decode_end(body)
                if end.outcome in ("refused", "rejected"):
                    jobs.pop(end.job_id, None)  # nothing of it was accepted (or ever ran)
                    ends.pop(end.job_id, None)
                else:
                    ends[end.job_id] = (end.outcome, end.at_s)
            elif kind == "epoch":
                starts += 1
            elif kind == "lost":
                lost += 1
            elif kind in ("submitted", "progress", "allocation", "estimate", "worker"):
                message = DEFAULT_CODEC.decode(body).message
                if isinstance(message, JobSubmitted):
                    spec = message.spec
                    jobs[spec.job_id] = JobRecord(
                        spec.job_id, spec.job_type, spec.scale_factor, spec.total_steps,
                        spec.submit_time_s if at_s is None else float(at_s), spec.priority_weight, spec.slo_s,
                        spec.entity, spec.throughput_estimate_steps_per_s,
                    )
                elif isinstance(message, JobProgress):
                    key = (message.lease_id, message.job_id)
                    known = reports.get(key)
                    if known is None or (message.elapsed_s, message.steps_done) >= (known.elapsed_s, known.steps_done):
                        reports[key] = message  # cumulative within a lease: the last says it all
                elif isinstance(message, (AllocationComputed, AllocationFailed)):
                    policies[message.policy] += 1
                    last_policy = message.policy
                elif isinstance(message, ThroughputEstimated):
                    for row in message.jobs:
                        estimates[row.job_id] = dict(row.throughputs_steps_per_s)
                elif isinstance(message, WorkerRegistered):
                    registered[message.worker_id] = (message.accelerator_type, message.gpu_count)
                    if message.clock:
                        clocks.add(message.clock)
        except (DecodeError, KeyError, TypeError, ValueError) as e:
            raise JournalError(f"event {seq} ({kind}) cannot be read: {e}") from None
    if not fleets and registered:  # a journal without the boundaries' worker lists: who registered
        workers_last = tuple((w, t, g) for w, (t, g) in registered.items())
        fleets.append((0.0, _fleet(workers_last)))
    leases = tuple(_lease_run(lease, at_s, reports) for lease, at_s in dispatched.values())
    return History(
        jobs=tuple(jobs.values()),
        ends={job_id: JobEnd(outcome, at_s, None) for job_id, (outcome, at_s) in ends.items()} | _completions(ends, leases),
        leases=leases,
        credited=tuple(credited),
        estimates=estimates,
        fleets=tuple((at_s, fleet) for at_s, fleet in fleets),
        gpus_per_worker=tuple(g for _, _, g in workers_last),
        round_s=round_s,
        charges_from_previous_end=charges,
        policies=dict(policies),
        last_policy=last_policy,
        clocks=tuple(sorted(clocks)),
        starts=starts,
        workers_lost=lost,
        packed_leases=sum(len(lease.job_ids) > 1 for lease in leases),
    )


def _fleet(workers: Iterable[tuple[str, str, int]]) -> dict[str, int]:
    fleet: dict[str, int] = {}
    for _, accelerator_type, gpus in workers:
        fleet[accelerator_type] = fleet.get(accelerator_type, 0) + gpus
    return dict(sorted(fleet.items()))


def _lease_run(lease: audit.LeaseRecord, at_s: float, reports: Mapping[tuple[str, str], JobProgress]) -> LeaseRun:
    got = [reports.get((lease.lease_id, job_id)) for job_id in lease.job_ids]
    return LeaseRun(
        lease_id=lease.lease_id,
        job_ids=lease.job_ids,
        accelerator_type=lease.accelerator_type,
        gpus=len(lease.gpus),
        dispatched_at_s=at_s,
        extended=lease.extended,
        steps=tuple(r.steps_done if r is not None else 0 for r in got),
        steps_per_s=tuple(r.throughput_steps_per_s if r is not None else 0.0 for r in got),
        elapsed_s=max((r.elapsed_s for r in got if r is not None), default=0.0),
        reported=any(r is not None for r in got),
        crashed=any(r is not None and r.outcome == "crashed" for r in got),
    )


def _completions(ends: Mapping[str, tuple[str, float]], leases: Iterable[LeaseRun]) -> dict[str, JobEnd]:
    """A completed job's completion time: the end of the last lease that credited it steps before
    its end was recorded (the mechanism's JobCompleted time)."""
    last_end: dict[str, float] = {}
    for lease in leases:
        for job_id, steps in zip(lease.job_ids, lease.steps):
            end = ends.get(job_id)
            if steps > 0 and end is not None and end[0] == "completed" and lease.dispatched_at_s <= end[1]:
                last_end[job_id] = max(last_end.get(job_id, lease.end_s), lease.end_s)
    return {
        job_id: JobEnd("completed", ends[job_id][1], min(completion_s, ends[job_id][1]))
        for job_id, completion_s in last_end.items()
    }


def read_history(path: str, progress: Callable[[int], None] | None = None) -> History:
    """A journal file's history, read-only (a running mechanism's journal may be read)."""
    from common.journal import read_events

    return history_of(read_events(path), progress)
