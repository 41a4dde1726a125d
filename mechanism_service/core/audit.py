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

from collections.abc import Mapping
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
    workers: tuple[tuple[str, str, int], ...]  # live workers: (id, accelerator type, GPUs)
    pool: tuple[GPU, ...]  # the GPUs the mechanism may lease, leased ones included
    # Gavel's accounting (the gavel preset) charges a round from the previous round's end, not
    # from its dispatch: charges then include idle gaps, and I4 is not checked.
    charges_from_previous_end: bool = False
    round_s: float = 0.0
    worker_grace_s: float = 0.0  # 0: workers are not watched


@dataclass(frozen=True, slots=True)
class EndRecord:
    job_id: str
    outcome: str  # one of TERMINAL, or REFUSED
    reason: str
    at_s: float
    epoch: int


def encode_boundary(record: BoundaryRecord) -> bytes:
    return msgpack.packb(
        {
            "epoch": record.epoch,
            "at_s": record.at_s,
            "round_id": record.round_id,
            "leases": [[x.lease_id, list(x.job_ids), x.accelerator_type, [list(g) for g in x.gpus], x.extended] for x in record.leases],
            "settled": [
                [x.lease_id, list(x.job_ids), x.gpus, x.ended, list(x.steps), list(x.charged_gpu_s)] for x in record.settled
            ],
            "workers": [list(w) for w in record.workers],
            "pool": [list(g) for g in record.pool],
            "charges_from_previous_end": record.charges_from_previous_end,
            "round_s": record.round_s,
            "worker_grace_s": record.worker_grace_s,
        },
        use_bin_type=True,
    )


def decode_boundary(body: bytes) -> BoundaryRecord:
    m: Mapping[str, Any] = msgpack.unpackb(body, raw=False)
    return BoundaryRecord(
        epoch=int(m["epoch"]),
        at_s=float(m["at_s"]),
        round_id=int(m["round_id"]),
        leases=tuple(
            LeaseRecord(lid, tuple(jobs), w, tuple((str(wk), int(k)) for wk, k in gpus), bool(ext))
            for lid, jobs, w, gpus, ext in m["leases"]
        ),
        settled=tuple(
            SettledLease(lid, tuple(jobs), int(gpus), ended, tuple(int(s) for s in steps), tuple(float(c) for c in charged))
            for lid, jobs, gpus, ended, steps, charged in m["settled"]
        ),
        workers=tuple((str(w), str(t), int(g)) for w, t, g in m["workers"]),
        pool=tuple((str(w), int(k)) for w, k in m["pool"]),
        charges_from_previous_end=bool(m.get("charges_from_previous_end", False)),
        round_s=float(m.get("round_s", 0.0)),
        worker_grace_s=float(m.get("worker_grace_s", 0.0)),
    )


def encode_end(record: EndRecord) -> bytes:
    return msgpack.packb(
        {"job_id": record.job_id, "outcome": record.outcome, "reason": record.reason, "at_s": record.at_s, "epoch": record.epoch},
        use_bin_type=True,
    )


def decode_end(body: bytes) -> EndRecord:
    m: Mapping[str, Any] = msgpack.unpackb(body, raw=False)
    return EndRecord(str(m["job_id"]), str(m["outcome"]), str(m["reason"]), float(m["at_s"]), int(m["epoch"]))
