"""A status query (`gavel jobs|job|workers|cluster`) answered from the memory. Pure: the reports
themselves are core/status.py's."""

from __future__ import annotations

import dataclasses

from common.messages import StatusRequested
from mechanism_service.core import status as status_core
from mechanism_service.core.memory import Memory
from mechanism_service.core.rates import Rates


def answer(memory: Memory, request: StatusRequested, now_s: float, *, policy: str, estimates: bool, rates: Rates) -> object:
    """The body of the answer (a JSON value): the report asked for, or an error."""
    obs = dataclasses.replace(
        memory.observations,
        waiting=[status_core.pending_row(j, "submitted") for j in memory.submitted],
        held=[status_core.pending_row(j, "held", why) for j, why in memory.held],
        cancelling=dict(memory.cancelling),
        workers_refused=dict(memory.refused_workers),
        workers_lost=dict(memory.lost_workers),
        owners={job_id: o.name for job_id, o in memory.owners.items()},
    )
    if request.query == "jobs":
        return status_core.jobs_report(memory.state, now_s, obs)
    if request.query == "job":
        body = status_core.job_report(memory.state, request.job_id, now_s, obs)
        if isinstance(body, dict) and "error" not in body:
            body["throughputs"] = throughput_report(memory, request.job_id, estimates=estimates, rates=rates)
        return body
    if request.query == "workers":
        return status_core.workers_report(
            memory.state, memory.servers, memory.lost_workers, memory.last_heard_s, now_s, memory.book.stragglers,
            memory.refused_workers,
        )
    if request.query == "cluster":
        return status_core.cluster_report(memory.state, memory.servers, policy, now_s, obs, memory.round_id)
    return {"error": f"unknown query {request.query!r} (jobs, job, workers, cluster)"}


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
