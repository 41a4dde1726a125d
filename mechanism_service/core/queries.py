"""A status query (`gavel jobs|job|workers|cluster`, and the clock they are read with) answered from the memory. Pure: the reports
themselves are core/status.py's."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from common.messages import StatusRequested

from mechanism_service.core import eta as eta_core
from mechanism_service.core import status as status_core
from mechanism_service.core import why
from mechanism_service.core.memory import Memory
from mechanism_service.core.rates import Rates

ENDED_CODES = {"completed": why.COMPLETED, "failed": why.FAILED, "cancelled": why.CANCELLED, "rejected": why.REJECTED}


def answer(
    memory: Memory, request: StatusRequested, now_s: float, *, policy: str, estimates: bool, rates: Rates,
    clock: Mapping[str, object] | None = None, seed_s: float = 0.0,
) -> object:
    """The body of the answer (a JSON value): the report asked for, or an error. ``clock`` (the
    desk's: its kind, scale, the mechanism's now and the wall's) goes with `gavel job` and
    `gavel cluster`, and is the whole answer to the ``clock`` query: the command line turns
    mechanism times into dates and wall durations with it."""
    obs = dataclasses.replace(
        memory.observations,
        waiting=[status_core.pending_row(j, "submitted") for j in memory.submitted],
        held=[status_core.pending_row(j, "held", why) for j, why in memory.held]
        + [status_core.pending_row(j, "admission", why) for j, why in memory.queued],
        cancelling=dict(memory.cancelling),
        workers_refused=dict(memory.refused_workers),
        workers_lost=dict(memory.lost_workers),
        owners={job_id: o.name for job_id, o in memory.owners.items()},
    )
    clock_block = dict(clock) if clock is not None else {"kind": "", "scale": None, "now_s": now_s, "wall_s": None}
    if request.query == "jobs":
        return with_reasons(status_core.jobs_report(memory.state, now_s, obs), memory, now_s)
    if request.query == "job":
        body = status_core.job_report(memory.state, request.job_id, now_s, obs)
        if isinstance(body, dict) and "error" not in body:
            # one job's code and ETA alone (with_reasons reads every job's: a `gavel jobs`)
            detail = why.explain(memory, request.job_id, now_s, seed_s=seed_s)
            state_name = str(body.get("state", ""))
            code = ENDED_CODES.get(state_name) or (str(detail["code"]) if detail is not None else "")
            body["reason_code"] = code
            if not body.get("reason") and code in SHORT_REASONS:
                body["reason"] = SHORT_REASONS[code]
            if state_name not in ENDED_CODES:
                body.update(job_eta(memory, request.job_id, now_s))
            body["why"] = detail or {"code": code, "reason": body.get("reason", "")}
            body["throughputs"] = throughput_report(memory, request.job_id, estimates=estimates, rates=rates)
            body["clock"] = clock_block
        return body
    if request.query == "clock":
        return clock_block
    if request.query == "workers":
        return status_core.workers_report(
            memory.state, memory.servers, memory.lost_workers, memory.last_heard_s, now_s, memory.book.stragglers,
            memory.refused_workers,
        )
    if request.query == "cluster":
        return {**status_core.cluster_report(memory.state, memory.servers, policy, now_s, obs, memory.round_id), "clock": clock_block}
    return {"error": f"unknown query {request.query!r} (jobs, job, workers, cluster, clock)"}


SHORT_REASONS = {  # `gavel jobs`' why column for the codes whose row has no reason of its own
    why.BEGIN_TIME: "its arrival is ahead",
    why.NO_ALLOCATION: "no share in the allocation in force yet (new since the last solve, or the policy does not answer)",
    why.PRIORITY: "its share is on GPUs that jobs ahead of it hold",
    why.RESOURCES: "a gang that does not fit in the GPUs free on its types",
    why.PROFILING: "runs to measure its speed for the estimator",
}


def with_reasons(rows: list[dict[str, object]], memory: Memory, now_s: float) -> list[dict[str, object]]:
    """The rows with ``reason_code`` (core/why.py), ``reason`` where the row has none of its own
    (a held, failed, retrying, cancelled, rejected job keeps its own), and ``eta_s`` for the jobs
    the allocation gives a rate (mechanism time; None otherwise: core/eta.py)."""
    codes = why.reason_codes(memory)
    finish = eta_core.finish_times(memory.state, now_s, steps_counted_at(memory))
    out = []
    for row in rows:
        job_id = str(row["id"])
        state = str(row.get("state", ""))
        code = ENDED_CODES.get(state) or codes.get(job_id, "")
        extra: dict[str, object] = {"reason_code": code}
        if not row.get("reason") and code in SHORT_REASONS:
            extra["reason"] = SHORT_REASONS[code]
        if state not in ENDED_CODES:
            extra["eta_s"] = round(finish[job_id], 3) if job_id in finish else None
        out.append({**row, **extra})
    return out


def job_eta(memory: Memory, job_id: str, now_s: float) -> dict[str, object]:
    """`gavel job`'s ETA fields (core/eta.py); for a job not admitted (or ended), why there is none."""
    state = memory.state
    index = state.jobs.index_of.get(job_id) if state is not None else None
    if state is None or index is None:
        return {"eta_s": None, "eta_range_s": [None, None], "eta_basis": "no estimate: it is not admitted yet (its arrival is ahead, it is held, or it is in the admission queue)"}
    return eta_core.as_fields(eta_core.job_eta(state, state.jobs[index], now_s, since_s=steps_counted_at(memory)))


def steps_counted_at(memory: Memory) -> float | None:
    """When the jobs' steps done were last counted: the running round's start (its leases report
    at its end); None when no round runs (then they are as of now)."""
    return memory.running[0] if memory.running is not None else None


def throughput_report(memory: Memory, job_id: str, *, estimates: bool, rates: Rates) -> list[dict[str, object]]:
    """What `gavel job` shows of a job's speed: per type the steps/s the mechanism schedules
    on, where it came from, and the estimator's confidence (a prior of its own has none)."""
    state = memory.state
    job = next((j for j in state.jobs.values() if j.job_id == job_id), None) if state is not None else None
    if state is None or job is None:
        return []
    book = memory.book
    out: list[dict[str, object]] = []
    for w in state.gpus:
        if not estimates:
            provenance, confidence = "oracle", 1.0
        elif w in book.rows.get(job_id, {}):
            provenance, confidence = book.provenance[job_id].get(w), book.confidence[job_id].get(w)
        else:  # the mechanism's own prior (core/rates.py)
            provenance, confidence = ("user" if w in memory.user_estimates.get(job_id, {}) else "prior"), None
        out.append({
            "type": w, "steps_per_s": round(rates.isolated(job, w), 6), "provenance": provenance,
            "confidence": confidence,
        })
    return out
