"""Answers to status queries (``gavel jobs``, ``gavel job ID``, ``gavel workers``, ``gavel cluster``)
as plain JSON-ready values, computed from the mechanism's state. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from common.messages import StragglerFlag
from mechanism_service.core.attempts import attempts_view
from mechanism_service.core.model import Entry, JobState, MechanismState, Placement
from mechanism_service.core.reducers import WAITS_FOR_WORKERS, NewJob


@dataclass
class Observations:
    """What the shell remembers beyond the core state, for status answers."""

    # job id -> its placements, one span per run of rounds in one place (a job that runs for a
    # thousand rounds on the same GPUs is one entry, not a thousand: this is snapshotted)
    history: dict[str, list[dict[str, object]]] = field(default_factory=dict)
    # job id -> (spans, rounds, lease extensions) of its spans dropped beyond SPANS_KEPT: a job
    # that moves every round for a year keeps its newest spans, and its totals stay true
    history_dropped: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)  # job id -> reason
    last_solve_s: float | None = None
    # the last allocation request's outcome: request_id, at_s, status, error, refused_job_ids
    last_solve: dict[str, object] | None = None
    # Degraded mode: when the allocation in force was solved, and since when solves fail (None:
    # the last one succeeded)
    allocation_solved_at_s: float | None = None
    degraded_since_s: float | None = None
    failed: dict[str, str] = field(default_factory=dict)  # job id -> why it failed
    cancelled: dict[str, dict[str, object]] = field(default_factory=dict)  # job id -> its final row
    # job id -> its attempts on real workers, bounded (core/attempts.py), and the last report that
    # measured its stepping (steps/s, start-up, restore, checkpoint times)
    attempts: dict[str, dict[str, object]] = field(default_factory=dict)
    measured: dict[str, dict[str, float]] = field(default_factory=dict)
    forgotten_jobs: int = 0  # finished jobs forgotten under the retention rule (core/retention.py)
    # Filled in by the shell when it answers (not kept): jobs not admitted yet (pending_row)
    waiting: Sequence[dict[str, object]] = ()  # submitted, arrival still ahead
    held: Sequence[dict[str, object]] = ()  # arrived, the cluster cannot run them yet (with why)
    cancelling: Mapping[str, str] = field(default_factory=dict)  # active, leaving at the next boundary
    workers_refused: Mapping[str, str] = field(default_factory=dict)  # worker id -> why
    owners: Mapping[str, str] = field(default_factory=dict)  # job id -> who submitted it (core/ownership.py)
    workers_lost: Mapping[str, Mapping[str, object]] = field(default_factory=dict)  # worker id -> when, why


SPANS_KEPT = 100  # per job, the newest; the older ones are counted (Observations.history_dropped)


def record_placement(
    obs: Observations,
    job_id: str,
    round_id: int,
    now_s: float,
    accelerator_type: str,
    workers: Sequence[str],  # worker ids, as `gavel workers` names them
    *,
    extended: bool,
    packed_with: Sequence[str],
) -> None:
    """Note that ``job_id`` runs in ``round_id``: a lease extension, or the same place again in the
    very next round, lengthens the last span; anything else starts one."""
    spans = obs.history.setdefault(job_id, [])
    last = spans[-1] if spans else None
    same_place = (
        last is not None
        and last["accelerator_type"] == accelerator_type
        and last["workers"] == list(workers)
        and last["packed_with"] == list(packed_with)
        and last["last_round"] == round_id - 1
    )
    if last is not None and (extended or same_place):
        last["last_round"] = round_id
        last["rounds"] = int(last["rounds"]) + 1  # type: ignore[call-overload]
        last["lease_extensions"] = int(last["lease_extensions"]) + int(extended)  # type: ignore[call-overload]
        return
    spans.append({
        "first_round": round_id, "last_round": round_id, "rounds": 1, "from_s": now_s,
        "accelerator_type": accelerator_type, "workers": list(workers), "packed_with": list(packed_with),
        "lease_extensions": int(extended),
    })
    if len(spans) > SPANS_KEPT:
        oldest = spans.pop(0)
        count, rounds, extensions = obs.history_dropped.get(job_id, (0, 0, 0))
        obs.history_dropped[job_id] = (
            count + 1, rounds + int(oldest["rounds"]), extensions + int(oldest["lease_extensions"]),  # type: ignore[call-overload]
        )


def _job_row(job: JobState, now_s: float, running_on: Mapping[int, Placement], status: str) -> dict[str, object]:
    placement = running_on.get(job.index)
    return {
        "id": job.job_id,
        "type": job.job_type,
        "scale_factor": job.scale_factor,
        "state": status,
        "arrival_s": job.arrival_s,
        "accelerator_type": placement.accelerator_type if placement is not None else None,
        "steps_done": job.steps_done,
        "steps_total": job.total_steps,
        "attained_service_gpu_s": round(sum(job.gpu_seconds_by_type.values()), 3),
        "waiting_s": round(max(0.0, (job.first_run_s if job.first_run_s is not None else now_s) - job.arrival_s), 3),
        "jct_s": round(job.last_finish_s - job.arrival_s, 3)
        if status == "completed" and job.last_finish_s is not None
        else None,
    }


def running_placements(assignment: Mapping[Entry, Placement]) -> dict[int, Placement]:
    return {i: placement for entry, placement in assignment.items() for i in entry}


def pending_row(job: NewJob, status: str, reason: str = "") -> dict[str, object]:
    """A job accepted but not admitted: ``submitted`` (its arrival is ahead) or ``held``."""
    row: dict[str, object] = {
        "id": job.job_id, "type": job.job_type, "scale_factor": job.scale_factor, "state": status,
        "arrival_s": job.arrival_s, "steps_done": 0, "steps_total": job.total_steps,
    }
    return {**row, "reason": reason} if reason else row


def cancelled_row(job: JobState, reason: str, now_s: float) -> dict[str, object]:
    """What `gavel jobs` shows of a cancelled job from then on (the job itself is gone)."""
    return {**_job_row(job, now_s, {}, "cancelled"), "reason": reason, "cancelled_at_s": now_s}


def _retrying(row: dict[str, object], attempts: Mapping[str, object] | None) -> dict[str, object]:
    """A job whose last attempt crashed waits for its next round to be tried again (the round
    runs out its length first): say so, with the error, rather than "running"."""
    kept = attempts.get("kept") if attempts else None
    last = kept[-1] if isinstance(kept, list) and kept else None
    if row["state"] != "running" or not isinstance(last, dict) or not str(last.get("ended", "")).startswith("crashed"):
        return row
    failed = attempts.get("failed_in_a_row", 0) if attempts else 0
    why = f"its last attempt crashed ({last.get('error') or last['ended']}); tried again next round ({failed} failed in a row)"
    return {**row, "state": "retrying", "accelerator_type": None, "reason": why}


def jobs_report(state: MechanismState | None, now_s: float, obs: Observations) -> list[dict[str, object]]:
    """One row per job id: completed, failed, running, retrying (its last attempt crashed; it runs
    again next round), queued, cancelling, submitted (its arrival is still ahead), held (cannot run
    on the cluster as it is), rejected, cancelled."""
    rows: list[dict[str, object]] = []
    if state is not None:
        running_on = running_placements(state.previous_assignment)
        for job in state.completed:
            if job.steps_remaining <= 0:
                rows.append(_job_row(job, now_s, running_on, "completed"))
            else:
                rows.append({**_job_row(job, now_s, running_on, "failed"), "reason": obs.failed.get(job.job_id, "")})
        for job in state.jobs.values():
            if job.job_id in obs.cancelling:
                rows.append({**_job_row(job, now_s, running_on, "cancelling"), "reason": obs.cancelling[job.job_id]})
            else:
                row = _job_row(job, now_s, running_on, "running" if job.index in running_on else "queued")
                rows.append(_retrying(row, obs.attempts.get(job.job_id)))
    rows += obs.waiting
    note = refused_note(obs.workers_refused)
    rows += [{**row, "reason": f"{row['reason']}{note}"} if note and WAITS_FOR_WORKERS in str(row.get("reason", "")) else row for row in obs.held]
    rows += [{"id": job_id, "state": "rejected", "reason": reason} for job_id, reason in obs.rejected.items()]
    rows += list(obs.cancelled.values())
    if obs.owners:
        rows = [{**row, "owner": obs.owners.get(str(row["id"]), "")} for row in rows]
    return rows


def job_report(state: MechanismState | None, job_id: str, now_s: float, obs: Observations) -> dict[str, object]:
    row = next((r for r in jobs_report(state, now_s, obs) if r["id"] == job_id), None)
    if row is None:
        if obs.forgotten_jobs:
            return {"error": f"no job {job_id!r} (finished jobs are forgotten a while after they end: it may be one)"}
        return {"error": f"no job {job_id!r}"}
    shares: dict[str, float] = {}
    if state is not None:
        index = next((i for i, j in state.jobs.items() if j.job_id == job_id), None)
        if index is not None:
            for entry, fractions in state.allocation.items():
                if index in entry:
                    for w, f in fractions.items():
                        shares[w] = round(shares.get(w, 0.0) + f, 6)
    spans = obs.history.get(job_id, [])
    dropped, rounds_dropped, extensions_dropped = obs.history_dropped.get(job_id, (0, 0, 0))
    return {
        **row,
        "allocation_share": shares,
        "rounds_run": rounds_dropped + sum(int(h["rounds"]) for h in spans),  # type: ignore[call-overload]
        "lease_extensions": extensions_dropped + sum(int(h["lease_extensions"]) for h in spans),  # type: ignore[call-overload]
        "measured": obs.measured.get(job_id),
        **attempts_view(obs.attempts, job_id),
        "placements": spans,
        **({"placements_not_shown": dropped} if dropped else {}),
    }


def workers_report(
    state: MechanismState | None,
    servers: Mapping[str, Sequence[tuple[str, int]]],
    lost: Mapping[str, Mapping[str, object]] | None = None,
    last_heard_s: Mapping[str, float] | None = None,
    now_s: float | None = None,
    stragglers: Mapping[str, StragglerFlag] | None = None,
    refused: Mapping[str, str] | None = None,
) -> list[dict[str, object]]:
    """The registered workers ("up"; with their last heartbeat and how long ago, None for workers
    that send none, like the in-process simulator's fleet), then the workers declared lost ("lost": when, how long
    ago, and why), then the workers that tried to join and were refused ("refused", and why: a
    clock that differs from the mechanism's, a worker id in use, ...). Times are the mechanism's.
    A worker the estimator flagged as a straggler says so: its measurements over its recent jobs,
    as a share of what their estimates predict."""
    heard = last_heard_s or {}
    slow = stragglers or {}

    def ago(t: object) -> float | None:
        return round(now_s - float(t), 3) if now_s is not None and t is not None else None  # type: ignore[arg-type]

    rows: list[dict[str, object]] = [
        {
            "worker_id": worker_id, "accelerator_type": w, "gpus": gpus, "state": "up",
            "last_heartbeat_s": heard.get(worker_id), "silent_s": ago(heard.get(worker_id)),
            **(
                {"straggler": {"speed_vs_predicted": round(slow[worker_id].ratio, 3), "jobs": slow[worker_id].jobs}}
                if worker_id in slow else {}
            ),
        }
        for w, entries in sorted(servers.items())
        for worker_id, gpus in entries
    ]
    rows += [
        {
            "worker_id": worker_id, "accelerator_type": info["accelerator_type"], "gpus": info["gpus"], "state": "lost",
            "lost_at_s": info["lost_at_s"], "lost_s_ago": ago(info["lost_at_s"]), "reason": info["reason"],
        }
        for worker_id, info in sorted((lost or {}).items())
    ]
    rows += [
        {"worker_id": worker_id, "accelerator_type": None, "gpus": None, "state": "refused", "reason": why}
        for worker_id, why in sorted((refused or {}).items())
    ]
    return rows


def refused_note(refused: Mapping[str, str]) -> str:
    """What a job that waits for workers adds when some tried to join and were refused: the user
    looks at `gavel jobs`, and "waits for workers" would hide that they came (a fleet on another
    clock, say) and why they were turned away."""
    if not refused:
        return ""
    count = f"{len(refused)} worker{'s' if len(refused) != 1 else ''}"
    first_id, first_why = next(iter(sorted(refused.items())))
    return f"; {count} tried to join and {'were' if len(refused) != 1 else 'was'} refused (`gavel workers`), e.g. {first_id}: {first_why}"


def allocation_report(state: MechanismState | None, obs: Observations) -> dict[str, object]:
    """Whether the allocation in force is the policy's latest word, or kept while the policy
    is down or late (degraded), and which active jobs it does not include (they run only on GPUs
    it leaves idle)."""
    allocated = {i for entry in state.allocation for i in entry} if state is not None else set()
    without = [j.job_id for j in state.jobs.values() if j.index not in allocated] if state is not None else []
    if obs.degraded_since_s is not None:
        condition = "degraded"
    else:
        condition = "current" if obs.allocation_solved_at_s is not None else "none yet"
    report: dict[str, object] = {
        "state": condition, "solved_at_s": obs.allocation_solved_at_s, "jobs_without_allocation": len(without),
    }
    if condition == "degraded":
        report["degraded_since_s"] = obs.degraded_since_s
        report["note"] = (
            "no answer from the policy: the last allocation is kept; jobs it does not include run on the GPUs it "
            "leaves idle until the policy answers"
        )
    return report


def cluster_report(
    state: MechanismState | None,
    servers: Mapping[str, Sequence[tuple[str, int]]],
    policy: str,
    now_s: float,
    obs: Observations,
    rounds: int,
) -> dict[str, object]:
    capacity = {w: sum(g for _, g in entries) for w, entries in sorted(servers.items())}
    in_use = dict.fromkeys(capacity, 0)
    if state is not None:
        for placement in state.previous_assignment.values():
            in_use[placement.accelerator_type] += len(placement.worker_ids)
    return {
        "time_s": now_s,
        "policy": policy,
        "capacity_gpus": capacity,
        "in_use_gpus": in_use,
        "jobs_active": len(state.jobs) if state is not None else 0,
        # finished jobs still remembered: done all their steps, or failed (state.completed holds both)
        "jobs_completed": sum(j.steps_remaining <= 0 for j in state.completed) if state is not None else 0,
        "jobs_failed": sum(j.steps_remaining > 0 for j in state.completed) if state is not None else 0,
        "jobs_forgotten": obs.forgotten_jobs,
        "rounds": rounds,
        "jobs_held": sum(row.get("state") == "held" for row in obs.held),
        "jobs_in_admission_queue": sum(row.get("state") == "admission" for row in obs.held),  # core/seams/admission.py
        "jobs_cancelling": len(obs.cancelling),
        # times the allocation was solved anew and every job's time ledgers started over (Gavel's
        # "reset": when jobs arrive or leave, a worker joins or is lost, at most once per interval)
        "allocation_resets": state.resets if state is not None else 0,
        "last_solve_s": obs.last_solve_s,
        "last_solve": obs.last_solve,
        "allocation": allocation_report(state, obs),
        "workers_up": sum(len(entries) for entries in servers.values()),
        "workers_lost": len(obs.workers_lost),
        "workers_refused": dict(obs.workers_refused),
    }
