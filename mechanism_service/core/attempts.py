"""A job's attempts on real workers, and the consecutive failures that end it. Pure: plain values
in and out (JSON-ready, since `gavel job ID` shows them as they are); the shell keeps them in
its memory (``Observations.attempts``, snapshotted).

An attempt is one process launch: a RunJobs starts one, an ExtendLease continues it. Each ends
one way, said as `gavel job` prints it:

    running          its lease is under way
    lease ended      it ran its lease's time (and, if extended, runs on: "running" again)
    finished         it did all its steps
    killed           it was stopped (cancelled)
    crashed (exit N) its process failed: a failed attempt
    worker lost      a worker of its lease was declared lost: not the job's doing
    no report        its lease ended without a report (timed out): not counted either

``max_failed_attempts`` crashes in a row end the job as failed; any attempt that ends otherwise,
except the two that say nothing about the job, starts the count again. A crash with exit code 2
ends it at once: by convention (argparse, the shells, the workload catalog's runner) the command
was used wrongly (an unknown job type, a misspelt flag), and every attempt would fail the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

from common.messages import JobProgress

ATTEMPTS_KEPT = 50  # per job, the newest; older ones are counted
ERROR_CHARS = 2000  # of the last crash's stderr tail, for `gavel job`
SUMMARY_CHARS = 200  # of a crash's one-line summary

RUNNING = "running"
LEASE_ENDED = "lease ended"
FINISHED = "finished"
KILLED = "killed"
WORKER_LOST = "worker lost"
NO_REPORT = "no report"

Attempts = dict[str, dict[str, object]]  # job id -> its record (see ``_record``)


def ended_label(report: JobProgress | None, *, worker_lost: bool) -> str:
    """How a job's lease ended, from its report (None: none came)."""
    if report is None:
        return WORKER_LOST if worker_lost else NO_REPORT
    if report.outcome == "crashed":
        return "crashed" if report.exit_code is None else f"crashed (exit {report.exit_code})"
    if report.outcome == "killed":
        return KILLED
    if report.outcome == "finished" or report.finished:
        return FINISHED
    return LEASE_ENDED


def crashed(label: str) -> bool:
    return label.startswith("crashed")


def failed_in_a_row(count: int, label: str) -> int:
    """The count of consecutive failed attempts after a lease ended as ``label``."""
    if crashed(label):
        return count + 1
    if label in (WORKER_LOST, NO_REPORT):
        return count  # the worker's or the network's doing, not the job's: neither a failure nor a success
    return 0


def crash_summary(report: JobProgress) -> str:
    """One line: ``exit code 1: ValueError: bad value`` (the last line of the stderr tail, which
    for a Python traceback is the exception)."""
    code = report.exit_code
    how = "no exit code" if code is None else (f"killed by signal {-code}" if code < 0 else f"exit code {code}")
    lines = [line.strip() for line in report.error.strip().splitlines() if line.strip()]
    detail = lines[-1] if lines else ""
    if detail.startswith(how):  # a worker that already said how (worker_service says "exit code 1: ...")
        detail = detail[len(how) :].lstrip(": ")
    return (f"{how}: {detail}" if detail else how)[:SUMMARY_CHARS]


USAGE_ERROR_EXIT = 2


def usage_error(report: JobProgress | None) -> bool:
    """The command itself is wrong: trying it again cannot help."""
    return report is not None and report.outcome == "crashed" and report.exit_code == USAGE_ERROR_EXIT


def failure_reason(count: int, report: JobProgress | None) -> str:
    """``failed 5 times in a row; last: exit code 1: ValueError: ...`` (JobFailed's reason)."""
    last = crash_summary(report) if report is not None else "no error reported"
    if usage_error(report):
        return f"its command was used wrongly (exit code 2, which the next attempt would repeat): {last}"
    return f"failed {count} times in a row; last: {last}"


def _record(attempts: Attempts, job_id: str) -> dict[str, object]:
    return attempts.setdefault(job_id, {"total": 0, "failed_in_a_row": 0, "last_error": "", "kept": []})


def _kept(attempts: Attempts, job_id: str) -> list[dict[str, object]]:
    return _record(attempts, job_id)["kept"]  # type: ignore[return-value]


def start_attempt(
    attempts: Attempts,
    job_id: str,
    *,
    round_id: int,
    now_s: float,
    accelerator_type: str,
    workers: Sequence[str],
) -> None:
    """A RunJobs launched the job: a new attempt (the oldest kept one goes past ATTEMPTS_KEPT)."""
    record = _record(attempts, job_id)
    record["total"] = int(record["total"]) + 1  # type: ignore[call-overload]
    kept = _kept(attempts, job_id)
    kept.append({
        "attempt": record["total"], "round": round_id, "last_round": round_id, "started_s": now_s,
        "on": accelerator_type, "workers": list(workers), "ended": RUNNING, "error": "", "steps": 0,
    })
    del kept[:-ATTEMPTS_KEPT]


def continue_attempt(attempts: Attempts, job_id: str, *, round_id: int, now_s: float, accelerator_type: str, workers: Sequence[str]) -> None:
    """An ExtendLease: the same process runs on (a job with no attempt yet, from a memory written
    before attempts were kept, gets one)."""
    kept = _kept(attempts, job_id)
    if not kept:
        start_attempt(attempts, job_id, round_id=round_id, now_s=now_s, accelerator_type=accelerator_type, workers=workers)
        return
    kept[-1]["ended"] = RUNNING
    kept[-1]["last_round"] = round_id


def end_lease(attempts: Attempts, job_id: str, label: str, steps: int, report: JobProgress | None) -> int:
    """A lease of the job's current attempt ended as ``label`` with ``steps`` done: note it, and
    return the consecutive failed attempts now."""
    record = _record(attempts, job_id)
    kept = _kept(attempts, job_id)
    if kept:
        attempt = kept[-1]
        attempt["ended"] = label
        attempt["steps"] = int(attempt["steps"]) + steps  # type: ignore[call-overload]
        if crashed(label) and report is not None:
            attempt["error"] = crash_summary(report)
    if crashed(label) and report is not None:
        record["last_error"] = report.error[-ERROR_CHARS:]
    count = failed_in_a_row(int(record["failed_in_a_row"]), label)  # type: ignore[call-overload]
    record["failed_in_a_row"] = count
    return count


def measured(report: JobProgress) -> dict[str, float] | None:
    """What a report measured (None when it measured no stepping, e.g. a crash before any step):
    steps/s while stepping, and the time around it."""
    if report.throughput_steps_per_s <= 0:
        return None
    return {
        "round": report.round_id, "throughput_steps_per_s": report.throughput_steps_per_s,
        "startup_s": report.startup_s, "restore_s": report.restore_s, "stepping_s": report.stepping_s,
        "checkpoint_s": report.checkpoint_s,
    }


def attempts_view(attempts: Attempts, job_id: str) -> dict[str, object]:
    """The attempts part of `gavel job ID`."""
    record = attempts.get(job_id)
    if record is None:
        return {"attempts_total": 0, "attempts": []}
    kept = list(record["kept"])  # type: ignore[call-overload]
    view: dict[str, object] = {
        "attempts_total": record["total"],
        "attempts_older": int(record["total"]) - len(kept),  # type: ignore[call-overload]
        "failed_in_a_row": record["failed_in_a_row"],
        "attempts": [dict(a) for a in kept],
    }
    if record["last_error"]:
        view["last_error"] = record["last_error"]
    return view
