"""Submissions into the memory: one received (new, known, conflicting or refused: core/intake.py
decides), the jobs of a batch that must wait for workers, and the submissions whose arrival came.
Pure."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.messages import JobSubmitted
from mechanism_service.core import ownership
from mechanism_service.core.admission import NewJob, admission
from mechanism_service.core.endings import Ending, end_job
from mechanism_service.core.intake import Receipt, receive
from mechanism_service.core.pool import gpus_by_type
from mechanism_service.core.rates import Rates

if TYPE_CHECKING:
    from mechanism_service.core.memory import Memory

WAITS_LISTED = 20  # a batch's jobs that wait for workers, named in the answer to its seal


@dataclass(frozen=True, slots=True)
class Received:
    receipt: Receipt
    ending: Ending | None = None  # refused: the job's end (a submission is a job to the audit trail)


def accept(
    memory: Memory, message: JobSubmitted, now_s: float, *, lockstep: bool, rates: Rates, types: Sequence[str],
    rules: ownership.Ownership,
) -> Received:
    """A submission received at ``now_s`` (mechanism time): a new job waits for its arrival with
    what it came with (a command, its submitter's estimate, its owner); a refused one ends."""
    receipt = receive(memory.intake, message, now_s, lockstep=lockstep, rates=rates, types=types)
    job_id = message.spec.job_id
    if receipt.outcome == "new":
        assert receipt.job is not None
        memory.observations.rejected.pop(job_id, None)  # refused before, right this time
        memory.ended_jobs.discard(job_id)  # a refused id is free again
        memory.ended_at_s.pop(job_id, None)
        memory.submitted.append(receipt.job)
        spec = message.spec
        if spec.command or spec.working_dir:  # most jobs run their type's catalog entry: nothing to keep
            memory.launch[job_id] = (spec.command, spec.working_dir)
        if spec.throughput_estimate_steps_per_s:  # the prior until the estimator says more
            memory.user_estimates[job_id] = dict(spec.throughput_estimate_steps_per_s)
        owner = ownership.owner(message.submitted_by, message.broker_user, rules)
        if owner.name:
            memory.owners[job_id] = owner
    elif receipt.outcome == "refused":
        return Received(receipt, end_job(memory, job_id, "refused", receipt.reason, now_s))
    return Received(receipt)


def waits_for_workers(memory: Memory, job_ids: Collection[str], rates: Rates, elastic_types: Sequence[str]) -> dict[str, str]:
    """The jobs of a batch (at most WAITS_LISTED) that the cluster as it is cannot run, with why: a
    gang larger than any type has here is held until workers join, and the submitter hears so at
    once instead of finding it held for ever (issue 23)."""
    gpus = gpus_by_type(memory)
    if not job_ids or not any(gpus.values()):  # no worker yet: every job waits, and that says nothing
        return {}
    waits: dict[str, str] = {}
    for job in memory.submitted:
        if job.job_id in job_ids and len(waits) < WAITS_LISTED:
            verdict = admission(gpus, job, rates, elastic_types=elastic_types)
            if verdict.verdict == "hold":
                waits[job.job_id] = verdict.reason
    return waits


def take_due(memory: Memory, now_s: float, *, cluster_grew: bool) -> tuple[list[NewJob], set[str]]:
    """The submissions whose arrival has come (taken out of the waiting), and the held jobs when
    workers joined since the last boundary (only new workers can change a held job's verdict:
    looking at them at every boundary would make a trace that arrives before its fleet
    quadratic to take in); with the ids of the arrivals among them."""
    arrived = [j for j in memory.submitted if j.arrival_s <= now_s]
    if arrived:
        memory.submitted = [j for j in memory.submitted if j.arrival_s > now_s]
    due = arrived
    if cluster_grew:
        due = [job for job, _ in memory.held] + arrived
        memory.held = []
    return due, {j.job_id for j in arrived}


def held_reasons(newly_held: Sequence[tuple[NewJob, str]]) -> list[dict[str, object]]:
    """The jobs newly held, by reason (the first five reasons, five ids each), for one log line
    per boundary rather than one per job (a trace can arrive before its fleet)."""
    by_reason: dict[str, list[str]] = {}
    for job, why in newly_held:
        by_reason.setdefault(why, []).append(job.job_id)
    return [{"reason": why, "count": len(ids), "job_ids": ids[:5]} for why, ids in list(by_reason.items())[:5]]
