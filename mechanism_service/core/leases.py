"""The running round's leases: which reports count, when the round is complete, and its leases as
results to settle, each job's attempt noted with how its lease ended. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from common.messages import JobProgress
from mechanism_service.core import attempts as attempts_core
from mechanism_service.core.migration import note_move_cost
from mechanism_service.core.model import Placement
from mechanism_service.core.rounds import round_report
from mechanism_service.core.settle import LeaseResult

if TYPE_CHECKING:
    from mechanism_service.core.memory import Memory


def fenced(memory: Memory, report: JobProgress) -> bool:
    """From a worker declared lost, or for a lease that ended with it: its steps are not
    counted (the lease was settled without them, and the job may run elsewhere already)."""
    return report.worker_id in memory.lost_workers or report.lease_id in memory.ended_leases


def accepts(memory: Memory, report: JobProgress) -> bool:
    """A report for a lease of the running round, not fenced, and the first for its job (a
    stale or duplicate report, at-least-once delivery, was counted already)."""
    if report.lease_id not in memory.expected or fenced(memory, report):
        return False
    return not any(r.job_id == report.job_id for r in memory.reports.get(report.lease_id, []))


def apply_progress(memory: Memory, report: JobProgress) -> bool:
    """Keep an accepted report (and what it measured); whether the round is complete now."""
    memory.reports.setdefault(report.lease_id, []).append(report)
    measured = attempts_core.measured(report)
    if measured is not None:
        memory.observations.measured[report.job_id] = measured
    return round_complete(memory)


def round_complete(memory: Memory) -> bool:
    """Every lease of the running round reported for each of its jobs, or ended early."""
    return all(
        len(memory.reports.get(lid, [])) == len(lease.entry) or lid in memory.ended_leases
        for lid, lease in memory.expected.items()
    )


def unreported(memory: Memory) -> list[str]:
    """The running round's leases still short of a report."""
    return [lid for lid, lease in memory.expected.items() if len(memory.reports.get(lid, [])) < len(lease.entry)]


def crashed_to_retry(memory: Memory) -> list[str]:
    """The jobs whose process crashed in the round that just ended and that will be tried
    again (not a usage error, which fails the job at once)."""
    return [
        r.job_id for lease_id in memory.expected for r in memory.reports.get(lease_id, [])
        if r.outcome == "crashed" and not attempts_core.usage_error(r)
    ]


def workers_of(worker_of: Mapping[int, tuple[str, int]], placement: Placement) -> list[tuple[str, tuple[int, ...]]]:
    """GPU ids -> (worker id, GPU indices on that worker), in placement order."""
    by_server: dict[str, list[int]] = {}
    for gpu in placement.worker_ids:
        worker_id, index = worker_of[gpu]
        by_server.setdefault(worker_id, []).append(index)
    return [(worker_id, tuple(gpus)) for worker_id, gpus in by_server.items()]


def collect_results(memory: Memory, max_failed_attempts: int) -> tuple[list[LeaseResult], list[tuple[str, str]]]:
    """The running round's leases as results to settle, each job's attempt noted with how its
    lease ended; and the jobs whose attempts failed too many times in a row (with why). The
    round's report is kept and its leases are over."""
    state = memory.state
    assert state is not None
    results = []
    failing = []
    attempts = memory.observations.attempts
    kept = memory.running[1].kept if memory.running is not None else frozenset()
    for lease_id, lease in memory.expected.items():
        by_job = {r.job_id: r for r in memory.reports.pop(lease_id, [])}
        members = [state.jobs.get(i) for i in lease.entry]
        steps = tuple(by_job[m.job_id].steps_done if m is not None and m.job_id in by_job else 0 for m in members)
        lost = lease_id in memory.ended_leases
        # A lease counts the time its reports account for, and none beyond (invariant I4,
        # docs/reliability.md): one that lost its worker, or whose reports never came, got its
        # job nothing credited after that, and must not cost it priority.
        elapsed = max((r.elapsed_s for r in by_job.values()), default=0.0)
        ended = "lost" if lost else ("crashed" if any(r.outcome == "crashed" for r in by_job.values()) else "")
        if not ended and any(m is not None and m.job_id not in by_job for m in members):
            # No report by the round's timeout: the job may still be running on its worker,
            # past the steps credited. Launching it afresh (never extending it) makes the worker
            # restart it from the credited checkpoint, so its steps and its model agree.
            ended = "unreported"
        results.append(LeaseResult(lease.entry, lease.placement, steps, lease.dispatched_at_s + elapsed, ended))
        for member, done in zip(members, steps, strict=True):
            if member is None:
                continue
            report = by_job.get(member.job_id)
            if report is not None and lease.entry not in kept:  # a fresh start: what it cost
                note_move_cost(state, member.job_type, report.startup_s + report.restore_s)
            label = attempts_core.ended_label(report, worker_lost=lost)
            in_a_row = attempts_core.end_lease(attempts, member.job_id, label, done, report)
            if in_a_row >= max_failed_attempts or attempts_core.usage_error(report):
                failing.append((member.job_id, attempts_core.failure_reason(in_a_row, report)))
    memory.expected = {}
    memory.ended_leases = {}
    if memory.running is not None:
        start_s, plan, reset = memory.running
        round_id = memory.rounds_forgotten + len(memory.round_reports)
        memory.round_reports.append(round_report(state, round_id, start_s, plan, results, reset))
        memory.running = None
    return results, failing
