"""The cluster's events (`gavel events`, `gavel top`) derived from what the mechanism already has:
a boundary's assignments against the last round's, a job's end, a worker that joins or is lost, a
start. Pure: the shell publishes what these return (outbox.py) and keeps the recent ones in an
EventRing, which the status query ``events`` answers from.

Each event's id is derived from what it says (``placed:12:job-3``, ``completed:job-3``), so the
same event said twice (a cancel repeated, a restarted mechanism) is recognisably the same and a
reader drops the second. The ring is not snapshotted: it is a window for people watching, and
after a restart it opens with ``mechanism_started`` (the journal and the logs keep the history).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass

from common.messages import Assignment, ClusterEvent

RECENT_EVENTS = 1_000  # kept for the status query: about a screenful per round for many rounds


@dataclass(frozen=True, slots=True)
class Placed:
    """Where one lease runs: its jobs, their type, the workers of its gang in rank order."""

    job_ids: tuple[str, ...]
    accelerator_type: str
    workers: tuple[str, ...]
    gpus: int
    extended: bool


def placements(assignments: Iterable[Assignment]) -> dict[str, Placed]:
    """Job id -> where it runs, from a round's assignments (a gang's lease has one per worker)."""
    by_lease: dict[str, list[Assignment]] = {}
    for a in assignments:
        parts = by_lease.get(a.lease_id)
        if parts is None:
            by_lease[a.lease_id] = [a]
        else:
            parts.append(a)
    out: dict[str, Placed] = {}
    for parts in by_lease.values():
        first = parts[0]
        if len(parts) == 1:  # most leases: one worker
            workers, gpus = (first.worker_id,), len(first.gpu_ids)
        else:
            workers, gpus = tuple(dict.fromkeys(a.worker_id for a in parts)), sum(len(a.gpu_ids) for a in parts)
        placed = Placed(first.job_ids, first.accelerator_type, workers, gpus, first.extended)
        for job_id in first.job_ids:
            out[job_id] = placed
    return out


def _where(p: Placed) -> str:
    gpus = f"{p.gpus} GPU{'s' if p.gpus != 1 else ''}"
    return f"{p.accelerator_type} on {', '.join(p.workers)} ({gpus})"


def round_events(
    round_id: int, now_s: float, previous: Sequence[Assignment], current: Sequence[Assignment], active: Container[str],
    history: Mapping[str, Sequence[Mapping[str, object]]] | None = None,
) -> list[ClusterEvent]:
    """A boundary's events: the round's start (when it runs anything), then each job that starts
    or moves (``placed``: a new lease somewhere else than the last round's; "resumed" when its
    placements in ``history``, core/status.py's, show it ran before), then each job that ran in the
    last round, is still active and does not run in this one (``preempted``). A job that keeps its
    place (an extended lease, or a new one on the same workers) says nothing."""
    before, now = placements(previous), placements(current)
    events: list[ClusterEvent] = []
    if current:
        leases = len({a.lease_id for a in current})
        events.append(ClusterEvent(
            f"round_started:{round_id}", "round_started", now_s, round_id,
            detail=f"{leases} lease{'s' if leases != 1 else ''}, {len(now)} job{'s' if len(now) != 1 else ''} running",
        ))
    for job_id, p in now.items():
        last = before.get(job_id)
        if p.extended or (last is not None and (last.accelerator_type, last.workers) == (p.accelerator_type, p.workers)):
            continue
        packed = [j for j in p.job_ids if j != job_id]
        if last is not None:
            detail = "moved to "
        else:
            detail = "resumed on " if _ran_before(history, job_id, round_id) else "started on "
        detail += _where(p)
        if last is not None and last.accelerator_type != p.accelerator_type:
            detail += f", from {last.accelerator_type}"
        if packed:
            detail += f", packed with {', '.join(packed)}"
        events.append(ClusterEvent(
            f"placed:{round_id}:{job_id}", "placed", now_s, round_id, job_id=job_id, worker_id=p.workers[0],
            accelerator_type=p.accelerator_type, detail=detail,
        ))
    for job_id, last in before.items():
        if job_id not in now and job_id in active:
            events.append(ClusterEvent(
                f"preempted:{round_id}:{job_id}", "preempted", now_s, round_id, job_id=job_id, worker_id=last.workers[0],
                accelerator_type=last.accelerator_type, detail=f"was on {_where(last)}; waits for a later round",
            ))
    return events


def _ran_before(history: Mapping[str, Sequence[Mapping[str, object]]] | None, job_id: str, round_id: int) -> bool:
    spans = history.get(job_id) if history is not None else None
    return bool(spans) and int(spans[0]["first_round"]) < round_id  # type: ignore[call-overload, index]


def round_ended(round_id: int, now_s: float, jobs_ended: int) -> ClusterEvent:
    return ClusterEvent(
        f"round_ended:{round_id}", "round_ended", now_s, round_id,
        detail=f"{jobs_ended} job{'s' if jobs_ended != 1 else ''} ended" if jobs_ended else "",
    )


def job_ended(outcome: str, job_id: str, reason: str, now_s: float, round_id: int, accelerator_type: str = "") -> ClusterEvent | None:
    """A job's end as an event (``completed``, ``failed``, ``cancelled``); None for a refusal or a
    rejection, which never ran (JobRejected says those, and `gavel jobs` lists them)."""
    if outcome not in ("completed", "failed", "cancelled"):
        return None
    return ClusterEvent(
        f"{outcome}:{job_id}", outcome, now_s, round_id, job_id=job_id, accelerator_type=accelerator_type, detail=reason,
    )


def worker_joined(worker_id: str, accelerator_type: str, gpus: int, instance: str, now_s: float, round_id: int) -> ClusterEvent:
    return ClusterEvent(
        f"worker_joined:{worker_id}:{instance}:{now_s:.3f}", "worker_joined", now_s, round_id, worker_id=worker_id,
        accelerator_type=accelerator_type, detail=f"{gpus} GPU{'s' if gpus != 1 else ''}",
    )


def worker_lost(worker_id: str, accelerator_type: str, gpus: int, reason: str, now_s: float, round_id: int) -> ClusterEvent:
    return ClusterEvent(
        f"worker_lost:{worker_id}:{now_s:.3f}", "worker_lost", now_s, round_id, worker_id=worker_id,
        accelerator_type=accelerator_type, detail=f"{gpus} GPU{'s' if gpus != 1 else ''}: {reason}",
    )


def mechanism_started(epoch: int, now_s: float, round_id: int, *, recovered: bool) -> ClusterEvent:
    """A start: the first (epoch 1, or a journal-less one), or a restart or fail-over that took up
    the journal where the last incarnation left it."""
    how = f"from its journal at round {round_id}" if recovered else "afresh"
    return ClusterEvent(
        f"mechanism_started:{epoch}", "mechanism_started", now_s, round_id, detail=f"epoch {epoch}, started {how}",
    )


def current_round(memory_round_id: int) -> int:
    """The round events between boundaries belong to: the one running (the memory's round id is
    the next one's)."""
    return max(0, memory_round_id - 1)


def last_type(history: dict[str, list[dict[str, object]]], job_id: str) -> str:
    """The type a job ran on last ("" if it never ran), from its placements (core/status.py)."""
    spans = history.get(job_id)
    return str(spans[-1]["accelerator_type"]) if spans else ""


def as_dict(event: ClusterEvent) -> dict[str, object]:
    """An event as JSON (the status query's answer, `gavel events --json`): "" fields as null."""
    return {
        "id": event.event_id, "kind": event.kind, "time_s": event.time_s, "round_id": event.round_id,
        "job_id": event.job_id or None, "worker_id": event.worker_id or None,
        "accelerator_type": event.accelerator_type or None, "detail": event.detail,
    }


class EventRing:
    """The last ``size`` events, in the order they were said, each id once."""

    def __init__(self, size: int = RECENT_EVENTS) -> None:
        self.size = size
        self._events: OrderedDict[str, ClusterEvent] = OrderedDict()
        self.dropped = 0  # said, and pushed out since by newer ones

    def add(self, event: ClusterEvent) -> bool:
        """Keep ``event``; False if it was kept already (said again)."""
        if event.event_id in self._events:
            return False
        self._events[event.event_id] = event
        if len(self._events) > self.size:
            self._events.popitem(last=False)
            self.dropped += 1
        return True

    def recent(self, *, job_id: str = "", limit: int = 0) -> list[ClusterEvent]:
        """Oldest first; ``limit``: only the newest that many (0: all)."""
        events = self._events.values()
        chosen = [e for e in events if e.job_id == job_id] if job_id else list(events)
        return chosen[-limit:] if limit > 0 else chosen


def events_report(ring: EventRing, now_s: float, round_id: int, *, job_id: str = "", limit: int = 0) -> dict[str, object]:
    """The status query ``events``: the recent events (of one job), oldest first, with the
    mechanism's time, so a reader can say "N s ago" and filter by age on the same clock."""
    return {
        "now_s": now_s, "round_id": round_id, "kept": ring.size, "dropped": ring.dropped,
        "events": [as_dict(e) for e in ring.recent(job_id=job_id, limit=limit)],
    }
