"""A job's run on a real worker (JobRun: its processes and the lease they run under) and the
reports of its leases (LeaseReports): each lease reported once, by the worker that has rank 0;
a lease the worker has seen before (a redelivered or republished command) answered with the
reports it got, which are kept a few rounds. What a report says is worker_service/core.py's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from common.bus import Bus
from common.messages import ExtendLease, JobProgress, RunJobs
from common.metrics import WorkerMetrics
from worker_service import core
from worker_service.core import LeaseTerms, Observed, WorkerConfig
from worker_service.job_logs import AttemptLog
from worker_service.processes import JobProcess
from worker_service.training import read_json, write_json_atomic

REPORTS_KEPT_ROUNDS = 3  # a command repeated within this many rounds gets its report again
STOP_SIGNALS = (-15, -9)  # a process we stopped that died of these was killed, not crashed
SEEN_LEASES_KEPT = 4096  # leases remembered as seen (repeats come within a round or two)


@dataclass
class JobRun:
    """One job on this worker: its processes (one per local rank) and the lease they run under."""

    job_id: str
    job_type: str
    gpu_ids: tuple[int, ...]
    procs: list[JobProcess]
    terms: LeaseTerms
    received_unix_s: float
    reports: bool  # rank 0 is here: this worker reports the job's leases
    packed_with: tuple[str, ...] = ()  # the other job on the same GPUs under the current lease
    killed: bool = False
    stopping: bool = False
    reported: set[str] = field(default_factory=set)  # lease ids
    task: asyncio.Task[None] | None = None
    output: AttemptLog | None = None  # this attempt's output (gavel logs)
    outcome: str = ""  # its last lease's, as reported
    stop_reason: str = ""  # why the worker stopped it, if it did

    @property
    def lease_id(self) -> str:
        return self.terms.lease_id

    @property
    def lead(self) -> JobProcess:
        """The process whose progress is the job's (rank 0 when it is here)."""
        return next((p for p in self.procs if p.launch.reports), self.procs[0])

    def progress(self) -> Mapping[str, object]:
        return read_json(Path(self.lead.launch.progress_file)) or {}

    def write_terms(self) -> None:
        for p in self.procs:
            write_json_atomic(Path(p.launch.lease_file), self.terms.as_json())


class LeaseReports:
    """The leases this worker has seen and the reports it sent for them."""

    def __init__(self, config: WorkerConfig, metrics: WorkerMetrics, now_unix_s: Callable[[], float], log) -> None:  # noqa: ANN001
        self.config = config
        self.metrics = metrics
        self._now = now_unix_s
        self._log = log
        self._reports: dict[str, list[JobProgress]] = {}  # lease id -> reports sent
        self._seen_leases: dict[str, int] = {}  # lease id -> its round (a repeat is answered, not run)
        self.bus: Bus | None = None

    async def seen_before(self, command: RunJobs | ExtendLease) -> bool:
        """Whether this lease was seen before (redelivered, or republished by a restarted
        mechanism): then its reports go again. Else it is remembered as seen."""
        if command.lease_id in self._seen_leases:
            assert self.bus is not None
            for report in self._reports.get(command.lease_id, []):
                await self.bus.publish(report, mandatory=False)
            return True
        self._seen_leases[command.lease_id] = command.round_id
        if len(self._seen_leases) > SEEN_LEASES_KEPT:  # a long-lived worker: forget the oldest
            oldest = sorted(self._seen_leases, key=self._seen_leases.__getitem__)[: SEEN_LEASES_KEPT // 2]
            for lease_id in oldest:
                del self._seen_leases[lease_id]
        return False

    async def failure(self, command: RunJobs | ExtendLease, received_unix_s: float, error: str, only: str = "") -> None:
        """A lease whose jobs could not start (``only``: that job of it) is reported crashed."""
        self._log.error("job_start_failed", lease_id=command.lease_id, error=error)
        leader = core.is_gang_leader(command, self.config.worker_id)
        for job_id in command.job_ids:
            if only and job_id != only:
                continue
            if leader:
                await self.publish(JobProgress(
                    job_id=job_id, worker_id=self.config.worker_id, lease_id=command.lease_id, round_id=command.round_id,
                    steps_done=0, elapsed_s=self._now() - received_unix_s, throughput_steps_per_s=0.0,
                    outcome="crashed", exit_code=None, error=error,
                    accelerator_type=self.config.accelerator_type, packed_with=core.packed_with(command, job_id),
                ))

    async def maybe_report(
        self, run: JobRun, progress: Mapping[str, object], failed: list[JobProcess], *, all_exited: bool
    ) -> None:
        """Report ``run``'s lease if it is settled and not reported yet."""
        if run.lease_id in run.reported:
            return
        culprit = failed[0] if failed and not run.killed else run.lead
        exit_code = culprit.exit_code if (failed or all_exited) else None
        seen = Observed(
            progress=progress,
            exit_code=exit_code,
            output_tail=culprit.output_tail(core.OUTPUT_TAIL_CHARS) if exit_code is not None else "",
            # stopped by us, it died of our signal (before its handler, while it started): killed
            killed=run.killed or (run.stopping and all(p.exit_code in STOP_SIGNALS for p in failed)),
        )
        report = core.lease_report(
            job_id=run.job_id, worker_id=self.config.worker_id, lease_id=run.lease_id, round_id=run.terms.round_id,
            seen=seen, elapsed_s=self._now() - run.received_unix_s,
            accelerator_type=self.config.accelerator_type, packed_with=run.packed_with,
        )
        if report is None:
            return
        run.reported.add(run.lease_id)
        run.outcome = report.outcome
        if report.outcome == "crashed":
            self._log.error("job_crashed", job_id=run.job_id, lease_id=run.lease_id, exit_code=report.exit_code, error=core.last_line(report.error))
        if run.reports:
            await self.publish(report)

    async def publish(self, report: JobProgress) -> None:
        assert self.bus is not None
        self._reports.setdefault(report.lease_id, []).append(report)
        # Forget reports of leases older than a few rounds: no mechanism repeats those commands.
        stale = [lid for lid, rs in self._reports.items() if rs and rs[0].round_id < report.round_id - REPORTS_KEPT_ROUNDS]
        for lease_id in stale:
            del self._reports[lease_id]
        await self.bus.publish(report)
        self.metrics.lease_ended(report.worker_id, report.outcome)
        self._log.info(
            "lease_reported", job_id=report.job_id, lease_id=report.lease_id, steps=report.steps_done,
            outcome=report.outcome, steps_per_s=round(report.throughput_steps_per_s, 3), startup_s=round(report.startup_s, 2),
        )

