"""The round loop: one boundary after another, as numbered steps over the collaborators (the same
steps as the simulator's bus-free path, sim/fastpath.py):

1. wait until every lease of the running round has reported (or, when nothing runs, until work
   arrives), then for everything else due at this instant;
2. settle the round: credit steps and time, publish the jobs' ends and the round's;
3. take the estimates heard before the boundary; admit the jobs whose arrival has come;
4. if the allocation is due: reset the ledgers, ask the policy service, install its answer
   (degraded mode: keep the last allocation when no answer comes in time, and say so);
5. forget what is over (retention); priorities, pick, place; journal the boundary; send run /
   extend commands; publish the round.
"""

from __future__ import annotations

import asyncio

import structlog

from common.clock import Clock
from common.messages import Assignment, RoundEnded, RoundStarted
from mechanism_service.config import MechanismConfig
from mechanism_service.core import audit, leases
from mechanism_service.core import commands as commands_core
from mechanism_service.core import events as events_core
from mechanism_service.core import retention as retention_core
from mechanism_service.core.cancel import leaving
from mechanism_service.core.endings import Ending, Outcome, end_job, settled_end
from mechanism_service.core.learning import take_estimate
from mechanism_service.core.memory import MemoryCell
from mechanism_service.core.model import JobState, MechanismState
from mechanism_service.core.profiling import choose as choose_profiling
from mechanism_service.core.receipts import held_reasons, take_due
from mechanism_service.core.rounds import (
    RoundPlan,
    admit_arrivals,
    admit_through,
    begin_reset,
    close_round,
    open_round,
)
from mechanism_service.core.seams.chosen import FailureTally
from mechanism_service.core.settle import LeaseResult
from mechanism_service.journaling import MechanismJournal
from mechanism_service.liveness import LivenessWatch
from mechanism_service.metrics import MechanismMetrics
from mechanism_service.outbox import Outbox
from mechanism_service.plugins import choose
from mechanism_service.policy_client import PolicyClient
from mechanism_service.waits import RoundWaits
from mechanism_service.workers import WorkerPool


class RoundLoop:
    def __init__(
        self, cell: MemoryCell, config: MechanismConfig, clock: Clock, *, waits: RoundWaits, pool: WorkerPool,
        liveness: LivenessWatch, policy: PolicyClient, journal: MechanismJournal, outbox: Outbox,
        log: structlog.stdlib.BoundLogger, metrics: MechanismMetrics,
    ) -> None:
        self._cell = cell
        self._config = config
        self._clock = clock
        self._waits = waits
        self._pool = pool
        self._liveness = liveness
        self._policy = policy
        self._journal = journal
        self._outbox = outbox
        self.log = log
        self._metrics = metrics
        self._crash_point = config.crash_point or (lambda point: None)
        self._chosen = choose(config.settings)  # the seams' plug-ins, resolved once (core/seams/)
        self._failures = FailureTally()  # which of their failures the log says
        # the last round's assignments, for the events of the next boundary (who was preempted);
        # not kept across a restart, as the events are not (core/events.py)
        self._last_assignments: tuple[Assignment, ...] = ()

    async def run(self) -> None:
        config, settings, memory = self._config, self._config.settings, self._cell.memory
        if config.lockstep:
            await self._waits.until(self._waits.ready_for_lockstep)
        while True:
            # 0. stop (checked where Gavel checks it: before the next boundary is handled); the
            # round already dispatched still runs and is reported, not settled
            if memory.state is not None and config.stop_when is not None and config.stop_when(memory.state):
                if memory.expected:
                    await self._waits.until(self._waits.round_complete)
                    leases.collect_results(memory, settings.max_failed_attempts)
                return
            # 1. wait for the running round to end (its leases as results), or for work
            lease_ids, results, failing = await self._wait_for_boundary()
            await self._clock.sleep(0)  # everything else due at this instant first
            # (metrics: the boundary's wall time from here, and when the round it closes was due)
            began_wall = self._metrics.wall()
            due_s = memory.round_clock.dispatched_at_s + settings.round_s if results else None
            heard, memory.pending_estimates = memory.pending_estimates, []  # later ones wait for the next boundary
            now_s = self._clock.now_s()
            memory.last_boundary_s = memory.now_s = now_s
            state = self._pool.state()
            # 2. settle: credit steps and time; the jobs' ends, the round's, the cancelled jobs'
            settled = await self._settle(state, lease_ids, results, failing, now_s)
            # 3. the estimates heard before this boundary; admit the jobs whose arrival has come
            # (and those held until the cluster fits)
            self._take_estimates(state, heard)
            await self._admit(state, now_s)
            # 4. allocation (not for an empty cluster: there is nothing to allocate yet); at once
            # after a worker was lost, whatever the interval (its GPUs are in the allocation)
            reset = sum(state.gpus.values()) > 0 and begin_reset(
                state, now_s, settings, force=memory.resolve_now, rates=self._cell.rates
            )
            if reset:
                memory.resolve_now = False
                await self._policy.reallocate(state, now_s, self._set_aside)
            self._retire(state, now_s)
            # 5. plan, journal, dispatch
            assert memory.shuffle is not None
            plan = open_round(state, now_s, settings, memory.shuffle, self._profiling(state), self._chosen)
            for seam, error in plan.seam_errors:
                if (fields := self._failures.said(self._chosen, seam, error)) is not None:
                    self.log.error("plugin_failed", **fields)
            memory.round_clock.dispatched_at_s = now_s
            await self._dispatch(state, plan, now_s, bool(reset), settled=settled, any_settled=bool(results))
            self._metrics.round_done(began_wall, state, plan, now_s, settings.round_s, due_s)
            if plan.assignment:
                self._waits.idle_boundaries = 0

    async def _wait_for_boundary(self) -> tuple[list[str], list[LeaseResult], list[tuple[str, str]]]:
        """Step 1: the running round's leases (their ids, as results in that order) and the jobs
        whose attempts failed too often, once every lease reported; nothing when idle, once there
        is work."""
        config, memory, waits = self._config, self._cell.memory, self._waits
        if not memory.expected:
            await waits.when_idle()
            if config.admission_batch_s and memory.submitted:
                # a burst of submissions (a trace) is admitted by one boundary, not one each
                await asyncio.sleep(config.admission_batch_s)
            return [], [], []
        await waits.for_round()
        crashed = leases.crashed_to_retry(memory)
        lease_ids = list(memory.expected)  # in the order of the results
        results, failing = leases.collect_results(memory, config.settings.max_failed_attempts)
        await waits.out_a_crash(crashed)  # the attempts say "crashed" meanwhile
        if config.lockstep and results:
            self._clock.advance_to(max(r.finish_s for r in results))  # type: ignore[attr-defined]
        return lease_ids, results, failing

    async def _settle(
        self, state: MechanismState, lease_ids: list[str], results: list[LeaseResult], failing: list[tuple[str, str]],
        now_s: float,
    ) -> list[list[object]]:
        """Step 2: the round settled (what it credited and charged, for the audit record, is
        returned); the jobs it finished end, then those whose attempts failed, then the round
        (RoundEnded), then the jobs cancelled since the last boundary (after their last round was
        settled: a job that completed in it completed, one terminal state each)."""
        memory, settings = self._cell.memory, self._config.settings
        round_start_s = memory.round_clock.close(max(r.finish_s for r in results), settings) if results else now_s
        charging = audit.settling(lease_ids, results, state.jobs.get) if self._journal.kept else None
        finished = close_round(state, results, round_start_s, settings)
        settled = audit.settled_leases(charging) if charging is not None else []
        for job in finished:
            outcome, reason = settled_end(job)
            await self._end(job.job_id, outcome, reason, self._clock.now_s(), settled=job)
        finished += await self._fail_attempts(failing, now_s)
        if results:
            ended = RoundEnded(memory.round_id - 1, now_s, tuple(j.job_id for j in finished))
            await self._outbox.publish(ended, f"round-ended:{ended.round_id}")
            await self._outbox.publish_events([events_core.round_ended(ended.round_id, now_s, len(finished))])
        for job_id, reason in leaving(memory):
            await self._end(job_id, "cancelled", reason, now_s, log_as="job_cancelled")
        return settled

    async def _end(
        self, job_id: str, outcome: Outcome, reason: str, now_s: float, *, settled: JobState | None = None, log_as: str = "",
    ) -> Ending:
        """A job leaves (core/endings.py): journaled in the audit trail, its end published."""
        ending = end_job(self._cell.memory, job_id, outcome, reason, now_s, settled=settled)
        if log_as == "job_cancelled":
            assert ending.job is not None
            self.log.info("job_cancelled", job_id=job_id, reason=reason, admitted=True, steps_done=ending.job.steps_done)
        elif log_as:
            self.log.warning(log_as, job_id=job_id, reason=reason)
        self._journal.record_end(ending.record(self._cell.memory.epoch))
        self._metrics.ended(ending)
        await self._outbox.publish_end(ending)
        await self._outbox.publish_job_ended(self._cell.memory, job_id, outcome, reason, now_s)
        return ending

    async def _fail_attempts(self, failing: list[tuple[str, str]], now_s: float) -> list[JobState]:
        """Jobs whose process crashed ``max_failed_attempts`` leases in a row end as failed (after
        their round was settled: one that completed in it completed)."""
        state = self._cell.memory.state
        assert state is not None
        ended = []
        for job_id, reason in failing:
            if job_id in state.jobs.index_of:
                ending = await self._end(job_id, "failed", reason, now_s, log_as="job_failed")
                assert ending.job is not None
                ended.append(ending.job)
        return ended

    def _take_estimates(self, state: MechanismState, heard: list) -> None:
        """The estimates heard before the boundary, in order; a material change solves again."""
        memory = self._cell.memory
        solve_again = False
        for estimate in heard:
            solve_again |= take_estimate(state, memory.book, estimate, self._cell.rates, memory.ended_jobs)  # type: ignore[arg-type]
        if solve_again:
            self.log.info("estimates_changed", messages=len(heard), action="solving again at this boundary")

    async def _admit(self, state: MechanismState, now_s: float) -> None:
        memory = self._cell.memory
        due, arrived_ids = take_due(memory, now_s, cluster_grew=self._pool.take_grown())
        newly_held = []
        if self._chosen.admission is None:
            # (an admission queue left by a start with an admission policy: accept_all takes it first)
            queued, memory.queued = [job for job, _ in memory.queued], []
            others = admit_arrivals(state, [*queued, *due], self._config.settings, self._cell.rates, self._config.elastic_types)
        else:  # the admission queue's jobs are offered again, before the arrivals
            through = admit_through(
                state, self._chosen.admission, [job for job, _ in memory.queued], due, self._config.settings,
                self._cell.rates, now_s, self._config.elastic_types,
            )
            others, memory.queued = through.others, through.queued
            if through.error and (fields := self._failures.said(self._chosen, "admission", through.error)) is not None:
                self.log.error("plugin_failed", **fields)
        for job, verdict in others:
            if verdict.verdict == "hold":
                memory.held.append((job, verdict.reason))
                if job.job_id in arrived_ids:
                    newly_held.append((job, verdict.reason))
                continue
            await self._end(job.job_id, "rejected", verdict.reason, now_s)
        if newly_held:  # once per boundary, not once per job: a trace can arrive before its fleet
            self.log.warning("jobs_held", count=len(newly_held), held_in_all=len(memory.held), reasons=held_reasons(newly_held))

    async def _set_aside(self, state: MechanismState, job_ids: list[str], reason: str, now_s: float) -> None:
        """Jobs the policy will not solve with leave the cluster: rejected if they never ran
        (nothing of them was used: the id is free again), failed if they did."""
        for job_id in job_ids:
            self.log.warning("job_set_aside", job_id=job_id, reason=reason)
            ran = state.jobs[state.jobs.index_of[job_id]].first_run_s is not None
            await self._end(job_id, "failed" if ran else "rejected", reason, now_s)

    def _retire(self, state: MechanismState, now_s: float) -> None:
        """Forget what is over under the retention rule (core/retention.py), handing it to the
        archive first when there is one."""
        forgotten, workers = retention_core.forget(self._cell.memory, state, now_s, self._config.retention)
        if forgotten is not None and self._config.archive is not None:
            self._config.archive(forgotten)
        self._liveness.forget(workers)

    def _profiling(self, state: MechanismState) -> list:
        """The profiling runs of this round: what the estimator asked for, within its share."""
        book = self._cell.memory.book
        if not self._config.estimates or not book.profiling:
            return []
        return choose_profiling(state, book.profiling, book.profiling_share, packing=self._config.settings.packing)

    async def _dispatch(
        self, state: MechanismState, plan: RoundPlan, now_s: float, reset: bool, *, settled: list[list[object]],
        any_settled: bool,
    ) -> None:
        """The plan's commands (core/commands.py), written ahead in the journal with the
        boundary's whole memory before any goes out, then published."""
        memory, settings = self._cell.memory, self._config.settings
        out = commands_core.dispatch(memory, state, plan, now_s, reset, settings)
        self._crash_point("boundary.before_journal")
        round_id = out.round_id if plan.assignment else -1
        self._journal.write_boundary(
            memory, out.commands, now_s, changed=any_settled or reset or bool(out.commands),
            record=lambda: commands_core.boundary_record(
                memory, state, settings, round_id, now_s, pool_changed=self._pool.take_pool_changed()
            ),
            assignments=out.assignments, settled=settled,
        )
        self._crash_point("boundary.after_journal")
        for command in out.commands:
            if command.worker_id in memory.lost_workers:
                continue  # lost while this boundary was going out: its lease ended with it
            await self._outbox.publish_command(command)
        if plan.assignment:
            started = RoundStarted(out.round_id, now_s, settings.round_s, out.assignments)
            await self._outbox.publish(started, f"round-started:{out.round_id}")
        if self._outbox.events_on:  # what this boundary changed, for people watching: against the last round
            await self._outbox.publish_events(
                events_core.round_events(
                    out.round_id, now_s, self._last_assignments, out.assignments, state.jobs.index_of,
                    memory.observations.history,
                )
            )
            self._last_assignments = out.assignments

