"""What the mechanism did, for the journal's audit trail (issue 13): the journal's other events
are inputs, replayed after a restart; these are outputs, never replayed, kept so that the
invariants (mechanism_service/core/invariants.py) can be checked over a run afterwards.

Two kinds, each one msgpack map:
- ``boundary``: appended with a boundary's snapshot (in its transaction: both or neither are
  durable), saying which leases the boundary dispatched (on which GPUs), how the leases of the
  round it closed were settled (steps credited, GPU-seconds charged to each member), and the pool
  of GPUs the cluster had then;
- ``ended``: a job reached a terminal state (or a submission was refused on receipt), appended
  where its event is published.

A crash between an ``ended`` and the boundary's commit re-does the boundary after the restart,
and the same end is written again under the next epoch: the checker absorbs such a repeat, as
the event's consumers do (same message id), and flags only a second, different end.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

BOUNDARY = "boundary"
ENDED = "ended"
AUDIT_KINDS = frozenset({BOUNDARY, ENDED})

# Terminal outcomes of an accepted job, and "refused": a submission refused on receipt, which was
# never accepted (its id stays free).
TERMINAL = ("completed", "failed", "cancelled", "rejected")
REFUSED = "refused"

GPU = tuple[str, int]  # (worker id, GPU index on that worker)


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """A lease a boundary dispatched."""

    lease_id: str
    job_ids: tuple[str, ...]
    accelerator_type: str
    gpus: tuple[GPU, ...]
    extended: bool


@dataclass(frozen=True, slots=True)
class SettledLease:
    """How a lease of the round that just closed was settled: per member (``job_ids`` order) the
    steps credited and the GPU-seconds charged (what the job's ledger of GPU time grew by)."""

    lease_id: str
    job_ids: tuple[str, ...]
    gpus: int
    ended: str  # "" (ran its course), "crashed", "lost", "unreported"
    steps: tuple[int, ...]
    charged_gpu_s: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class BoundaryRecord:
    epoch: int
    at_s: float
    round_id: int  # the round dispatched here; -1 when none was
    leases: tuple[LeaseRecord, ...]
    settled: tuple[SettledLease, ...]
    # The live workers, (id, accelerator type, GPUs), and the GPUs the mechanism may lease (leased
    # ones included); None when unchanged since the boundary before (written after every start)
    workers: tuple[tuple[str, str, int], ...] | None
    pool: tuple[GPU, ...] | None
    # Gavel's accounting (the gavel preset) charges a round from the previous round's end, not
    # from its dispatch: charges then include idle gaps, and I4 is not checked.
    charges_from_previous_end: bool = False
    round_s: float = 0.0
    worker_grace_s: float = 0.0  # 0: workers are not watched


@dataclass(frozen=True, slots=True)
class Settling:
    """A closed round's leases as the settle found them, in flat columns (the audit's cost at
    10,000 GPUs is a few list passes, not objects per lease, which also kept the cyclic collector
    busy): per lease its id, GPUs, how it ended and its member count; per member, in lease order,
    the job, its steps and GPU-seconds before the settle."""

    lease_ids: list[str]
    gpus: list[int]
    ended: list[str]
    counts: list[int]
    jobs: list[Any]  # JobState objects (anything with job_id, steps_done, gpu_seconds_by_type)
    steps_before: list[int]
    gpu_s_before: list[float]


def settling(lease_ids: Sequence[str], results: Sequence[Any], job_of: Callable[[int], Any]) -> Settling:
    """Before the settle: ``results`` are LeaseResults, ``job_of`` finds an admitted job (None
    when it is gone)."""
    jobs: list[Any] = []
    counts = []
    for r in results:
        before = len(jobs)
        jobs.extend(job for i in r.entry if (job := job_of(i)) is not None)
        counts.append(len(jobs) - before)
    return Settling(
        list(lease_ids), [len(r.placement.worker_ids) for r in results], [r.ended for r in results], counts, jobs,
        [job.steps_done for job in jobs], [sum(job.gpu_seconds_by_type.values()) for job in jobs],
    )


def settled_leases(before: Settling) -> list[list[Any]]:
    """After the settle, the wire form of the SettledLeases: the lease columns, then per member
    its job id, the steps credited and the GPU-seconds charged (what its ledgers grew by)."""
    jobs = before.jobs
    return [
        before.lease_ids, before.gpus, before.ended, before.counts,
        [job.job_id for job in jobs],
        [job.steps_done - steps for job, steps in zip(jobs, before.steps_before)],
        [sum(job.gpu_seconds_by_type.values()) - gpu_s for job, gpu_s in zip(jobs, before.gpu_s_before)],
    ]


def encode_boundary(record: BoundaryRecord) -> bytes:
    """A record as its wire form (tests, tools); the mechanism writes the same with
    ``encode_boundary_columns``."""
    assignments = [
        (lease.lease_id, lease.job_ids, lease.accelerator_type, worker_id, (index,), lease.extended)
        for lease in record.leases for worker_id, index in lease.gpus
    ]
    x = record.settled
    settled = [
        [s.lease_id for s in x], [s.gpus for s in x], [s.ended for s in x], [len(s.job_ids) for s in x],
        [j for s in x for j in s.job_ids], [n for s in x for n in s.steps], [c for s in x for c in s.charged_gpu_s],
    ]
    return _pack(record, [list(column) for column in zip(*assignments)] if assignments else [[]] * 6, settled)


def encode_boundary_columns(record: BoundaryRecord, assignments: Sequence[Any], settled: list[list[Any]]) -> bytes:
    """What the mechanism writes: ``record`` without its leases and settled leases, which come
    as the boundary's Assignments (one per worker of a lease) and ``settled_leases``' rows."""
    columns = [
        [a.lease_id for a in assignments], [a.job_ids for a in assignments], [a.accelerator_type for a in assignments],
        [a.worker_id for a in assignments], [a.gpu_ids for a in assignments], [a.extended for a in assignments],
    ]
    return _pack(record, columns, settled)


def _pack(record: BoundaryRecord, assignments: list[list[Any]], settled: list[list[Any]]) -> bytes:
    body: dict[str, Any] = {
        "epoch": record.epoch,
        "at_s": record.at_s,
        "round_id": record.round_id,
        "assignments": assignments,
        "settled": settled or [[]] * 7,
        "charges_from_previous_end": record.charges_from_previous_end,
        "round_s": record.round_s,
        "worker_grace_s": record.worker_grace_s,
    }
    if record.workers is not None:
        body["workers"] = [list(w) for w in record.workers]
    if record.pool is not None:
        body["pool"] = [list(g) for g in record.pool]
    return msgpack.packb(body, use_bin_type=True)


def decode_boundary(body: bytes) -> BoundaryRecord:
    m: Mapping[str, Any] = msgpack.unpackb(body, raw=False)
    leases: dict[str, LeaseRecord] = {}
    for lease_id, job_ids, accelerator_type, worker_id, gpu_ids, extended in zip(*m["assignments"]):
        gpus = tuple((str(worker_id), int(k)) for k in gpu_ids)
        known = leases.get(lease_id)
        leases[lease_id] = LeaseRecord(
            lease_id, tuple(job_ids), accelerator_type, (known.gpus if known else ()) + gpus, bool(extended)
        )
    return BoundaryRecord(
        epoch=int(m["epoch"]),
        at_s=float(m["at_s"]),
        round_id=int(m["round_id"]),
        leases=tuple(leases.values()),
        settled=_settled(m["settled"]),
        workers=tuple((str(w), str(t), int(g)) for w, t, g in m["workers"]) if "workers" in m else None,
        pool=tuple((str(w), int(k)) for w, k in m["pool"]) if "pool" in m else None,
        charges_from_previous_end=bool(m.get("charges_from_previous_end", False)),
        round_s=float(m.get("round_s", 0.0)),
        worker_grace_s=float(m.get("worker_grace_s", 0.0)),
    )


@dataclass(frozen=True, slots=True)
class EndRecord:
    job_id: str
    outcome: str  # one of TERMINAL, or REFUSED
    reason: str
    at_s: float
    epoch: int


def _settled(columns: list[list[Any]]) -> tuple[SettledLease, ...]:
    lease_ids, gpus, ended, counts, job_ids, steps, charged = columns
    out = []
    at = 0
    for lease_id, n, how, count in zip(lease_ids, gpus, ended, counts):
        members = slice(at, at + count)
        out.append(SettledLease(
            lease_id, tuple(job_ids[members]), int(n), how, tuple(int(s) for s in steps[members]),
            tuple(float(c) for c in charged[members]),
        ))
        at += count
    return tuple(out)


def encode_end(record: EndRecord) -> bytes:
    return msgpack.packb(
        {"job_id": record.job_id, "outcome": record.outcome, "reason": record.reason, "at_s": record.at_s, "epoch": record.epoch},
        use_bin_type=True,
    )


def decode_end(body: bytes) -> EndRecord:
    m: Mapping[str, Any] = msgpack.unpackb(body, raw=False)
    return EndRecord(str(m["job_id"]), str(m["outcome"]), str(m["reason"]), float(m["at_s"]), int(m["epoch"]))
