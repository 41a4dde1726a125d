"""The mechanism service: realises the policy's allocation in rounds over the bus.

It owns the MechanismState and changes it only through the core (mechanism_service/core); this
module turns messages into core calls and core results into messages. The round loop, as
numbered steps (the same steps, in the same order, as the simulator's bus-free path):

1. wait until every lease of the running round has reported (or, when nothing runs, until a
   job is submitted), then for everything else due at this instant;
2. settle the round: credit steps and time, publish completions;
3. admit the jobs submitted meanwhile;
4. if the allocation is due: reset the ledgers, ask the policy service, install its answer
   (degraded mode: keep the last allocation when no answer comes in time);
5. priorities, pick, place; send run / extend commands to the workers; publish the round.

Lockstep: a round ends when its last lease reports, which in the simulator is the virtual
instant its slowest job stops (docs/gavel-semantics.md section 2).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from common.bus import Bus, Delivery
from common.clock import Clock
from common.messages import (
    AllocationComputed,
    AllocationFailed,
    AllocationRequested,
    Assignment,
    ExtendLease,
    JobCompleted,
    JobFailed,
    JobProgress,
    JobRejected,
    JobSubmitted,
    RoundEnded,
    RoundStarted,
    RunJobs,
    WorkerRegistered,
)
from common.messages.base import Message
from mechanism_service.core.model import Entry, JobState, MechanismState, Placement, new_state
from mechanism_service.core.policy_input import allocation_fractions, allocation_request
from mechanism_service.core.reducers import IsolatedLookup, LeaseResult, NewJob, PairLookup, apply_allocation
from mechanism_service.core.rounds import (
    RoundClock,
    RoundPlan,
    RoundReport,
    Shuffle,
    admit_arrivals,
    begin_reset,
    close_round,
    force_reset_when_idle,
    open_round,
    round_report,
)
from mechanism_service.core.settings import MechanismSettings

log = structlog.get_logger("gavel.mechanism")


@dataclass(frozen=True, slots=True)
class Lease:
    lease_id: str
    entry: Entry
    placement: Placement
    dispatched_at_s: float


class MechanismService:
    name = "mechanism"

    def __init__(
        self,
        *,
        clock: Clock,
        settings: MechanismSettings,
        policy: str,
        isolated: IsolatedLookup,
        pair: PairLookup,
        shuffle: Shuffle,
        seed: int = 0,
        solver: str | None = None,
        allocation_timeout_s: float = 60.0,
        stop_when: Callable[[MechanismState], bool] | None = None,
        more_arrivals: Callable[[], bool] | None = None,
    ) -> None:
        self._clock = clock
        self._settings = settings
        self._policy = policy
        self._isolated = isolated
        self._pair = pair
        self._shuffle = shuffle
        self._seed = seed
        self._solver = solver
        self._allocation_timeout_s = allocation_timeout_s
        self._stop_when = stop_when
        # Whether more jobs are known to be on their way (a trace replay knows; a live cluster
        # does not, and then an idle boundary re-solves at once).
        self._more_arrivals = more_arrivals or (lambda: False)
        self.state: MechanismState | None = None
        self._bus: Bus | None = None
        self._servers: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)  # type -> (worker, gpus)
        self._submitted: list[NewJob] = []
        self._submission_arrived = asyncio.Event()
        self._reports: dict[str, list[JobProgress]] = {}
        self._expected: dict[str, Lease] = {}
        self._round_over = asyncio.Event()
        self._pending_request: tuple[str, asyncio.Future[Message]] | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._round_id = 0
        self.reports: list[RoundReport] = []  # one per dispatched round, when it has ended
        self.solve_times_s: list[float] = []
        self.last_boundary_s = 0.0  # the last round boundary handled (the run's end when stopped)
        self.rejected: list[str] = []
        self._running: tuple[float, RoundPlan, bool] | None = None  # (start, plan, reset)
        self.stopped = asyncio.Event()

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        await bus.subscribe("mechanism.workers", [WorkerRegistered.ROUTING_KEY], self.on_worker)
        await bus.subscribe("mechanism.submissions", [JobSubmitted.ROUTING_KEY], self.on_submitted)
        await bus.subscribe("mechanism.progress", [JobProgress.ROUTING_KEY], self.on_progress)
        await bus.subscribe(
            "mechanism.allocations", [AllocationComputed.ROUTING_KEY, AllocationFailed.ROUTING_KEY], self.on_allocation
        )
        self._loop_task = asyncio.get_running_loop().create_task(self._round_loop(), name="mechanism-rounds")

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)

    # -- handlers: record what arrived, wake the loop ---------------------------------------------

    async def on_worker(self, d: Delivery) -> None:
        w = d.message
        assert isinstance(w, WorkerRegistered)
        if self.state is not None:
            log.warning("worker_ignored_after_start", worker_id=w.worker_id)  # elastic clusters: issue 5
            return
        self._servers[w.accelerator_type].append((w.worker_id, w.gpu_count))

    async def on_submitted(self, d: Delivery) -> None:
        spec = d.message.spec  # type: ignore[attr-defined]
        self._submitted.append(
            NewJob(
                spec.job_id, spec.job_type, spec.scale_factor, spec.total_steps, spec.submit_time_s,
                spec.priority_weight, spec.slo_s, spec.entity,
            )
        )
        self._submission_arrived.set()

    async def on_progress(self, d: Delivery) -> None:
        report = d.message
        assert isinstance(report, JobProgress)
        if report.lease_id not in self._expected:
            return  # a stale or duplicate report (at-least-once delivery): already settled
        reports = self._reports.setdefault(report.lease_id, [])
        if any(r.job_id == report.job_id for r in reports):
            return
        reports.append(report)
        if all(len(self._reports.get(lid, [])) == len(lease.entry) for lid, lease in self._expected.items()):
            self._round_over.set()

    async def on_allocation(self, d: Delivery) -> None:
        reply = d.message
        pending = self._pending_request
        if pending is None or getattr(reply, "request_id", None) != pending[0] or pending[1].done():
            return  # an answer to a request we gave up on
        pending[1].set_result(reply)

    # -- the round loop ---------------------------------------------------------------------------

    async def _round_loop(self) -> None:
        settings = self._settings
        clock = RoundClock()
        results: list[LeaseResult] = []
        try:
            while True:
                # 0. stop (checked where Gavel checks it: before the next boundary is handled);
                # the round already dispatched still runs and is reported, not settled
                if self.state is not None and self._stop_when is not None and self._stop_when(self.state):
                    if self._expected:
                        await self._round_over.wait()
                        self._collect_results()
                    break
                # 1. wait for the running round to end, or for work
                if self._expected:
                    await self._round_over.wait()
                    self._round_over.clear()
                    results = self._collect_results()
                else:
                    idle_with_jobs = self.state is not None and bool(self.state.jobs)
                    if idle_with_jobs and not self._submitted and not self._more_arrivals():
                        force_reset_when_idle(self.state)  # type: ignore[arg-type]
                    elif not self._submitted:
                        self._submission_arrived.clear()
                        await self._submission_arrived.wait()
                await self._clock.sleep(0)  # everything else due at this instant first
                now_s = self._clock.now_s()
                self.last_boundary_s = now_s
                state = self._ensure_state()
                # 2. settle
                round_start_s = clock.close(max(r.finish_s for r in results), settings) if results else now_s
                finished = close_round(state, results, round_start_s, settings)
                for job in finished:
                    await self._publish_end(job)
                if results:
                    ended = RoundEnded(self._round_id - 1, now_s, tuple(j.job_id for j in finished))
                    await self._bus.publish(ended, mandatory=False)  # type: ignore[union-attr]
                results = []
                # 3. admit
                arrived, self._submitted = self._submitted, []
                for job, reason in admit_arrivals(state, arrived, settings, self._isolated, self._pair):
                    self.rejected.append(job.job_id)
                    await self._bus.publish(JobRejected(job.job_id, reason), mandatory=False)  # type: ignore[union-attr]
                # 4. allocation
                reset = begin_reset(state, now_s, settings)
                if reset:
                    await self._reallocate(state, now_s)
                # 5. plan and dispatch
                plan = open_round(state, now_s, settings, self._shuffle)
                clock.dispatched_at_s = now_s
                await self._dispatch(state, plan, now_s, reset)
        finally:
            self.stopped.set()

    def _ensure_state(self) -> MechanismState:
        if self.state is None:
            gpus = {w: sum(g for _, g in servers) for w, servers in self._servers.items()}
            self.state = new_state(gpus, self._settings.gpus_per_server)
        return self.state

    def _collect_results(self) -> list[LeaseResult]:
        results = []
        for lease_id, lease in self._expected.items():
            by_job = {r.job_id: r for r in self._reports.pop(lease_id, [])}
            assert self.state is not None
            members = [self.state.jobs.get(i) for i in lease.entry]
            steps = tuple(by_job[m.job_id].steps_done if m is not None else 0 for m in members)
            elapsed = max(r.elapsed_s for r in by_job.values())
            results.append(LeaseResult(lease.entry, lease.placement, steps, lease.dispatched_at_s + elapsed))
        self._expected = {}
        if self._running is not None:
            start_s, plan, reset = self._running
            self.reports.append(round_report(self.state, len(self.reports), start_s, plan, results, reset))
            self._running = None
        return results

    async def _publish_end(self, job: JobState) -> None:
        assert self._bus is not None
        if job.steps_remaining <= 0 and job.last_finish_s is not None:
            message: Message = JobCompleted(job.job_id, job.last_finish_s, job.last_finish_s - job.arrival_s, job.steps_done)
        else:
            message = JobFailed(job.job_id, "a gang got fewer steps than GPUs too many times", self._clock.now_s())
        await self._bus.publish(message, mandatory=False)

    async def _reallocate(self, state: MechanismState, now_s: float) -> None:
        assert self._bus is not None
        request_id = f"{self._seed}-{state.resets}"
        request = allocation_request(
            state,
            now_s,
            request_id=request_id,
            policy=self._policy,
            deadline_s=now_s + self._allocation_timeout_s,
            preset=self._settings.preset,
            seed=self._seed if self._settings.preset == "gavel" else self._seed + state.resets,
            solver=self._solver,
            packing=self._settings.packing,
        )
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending_request = (request_id, future)
        try:
            await self._bus.publish(request)
            reply = await asyncio.wait_for(future, self._allocation_timeout_s)
        except (asyncio.TimeoutError, Exception) as e:  # noqa: BLE001 - degraded mode, said once
            log.warning("allocation_unavailable", request_id=request_id, error=repr(e), action="keep last allocation")
            state.needs_allocation = False
            return
        finally:
            self._pending_request = None
        if isinstance(reply, AllocationComputed):
            apply_allocation(
                state, allocation_fractions(reply), reply.isolated_throughputs_steps_per_s or {}, self._settings,
                reply.policy_state,
            )
            self.solve_times_s.append(reply.solve_time_s)
        else:
            log.warning("allocation_failed", request_id=request_id, reason=getattr(reply, "reason", ""))
            state.needs_allocation = False

    async def _dispatch(self, state: MechanismState, plan: RoundPlan, now_s: float, reset: bool) -> None:
        assert self._bus is not None
        assignment = plan.assignment
        if not assignment:
            return
        round_id = self._round_id
        self._round_id += 1
        self._running = (now_s, plan, reset)
        assignments = []
        commands: list[Message] = []
        for entry, placement in assignment.items():
            lease_id = f"{round_id}:{'+'.join(str(i) for i in entry)}"
            self._expected[lease_id] = Lease(lease_id, entry, placement, now_s)
            jobs = [state.jobs[i] for i in entry]
            extended = entry in plan.kept
            for worker_id, gpu_ids in self._workers_of(placement):
                common = dict(
                    worker_id=worker_id, round_id=round_id, lease_id=lease_id, epoch=1,
                    lease_duration_s=self._settings.round_s,
                )
                job_fields = dict(
                    job_ids=tuple(j.job_id for j in jobs),
                    max_steps=tuple(j.steps_remaining for j in jobs),
                    job_types=tuple(j.job_type for j in jobs),
                    scale_factor=jobs[0].scale_factor,
                )
                if extended:
                    commands.append(ExtendLease(**common, **job_fields))
                else:
                    commands.append(
                        RunJobs(**common, gpu_ids=gpu_ids, restore_s=self._settings.restore_s, **job_fields)
                    )
                assignments.append(
                    Assignment(tuple(j.job_id for j in jobs), worker_id, placement.accelerator_type, gpu_ids, lease_id, extended)
                )
        for command in commands:
            await self._bus.publish(command)
        await self._bus.publish(
            RoundStarted(round_id, now_s, self._settings.round_s, tuple(assignments)), mandatory=False
        )

    def _workers_of(self, placement: Placement) -> list[tuple[str, tuple[int, ...]]]:
        """Core worker ids -> (server worker id, GPU indices on it), in the core's numbering:
        types in sorted order, servers in registration order, consecutive ids."""
        assert self.state is not None
        offset = 0
        for w in self.state.gpus:
            if w == placement.accelerator_type:
                break
            offset += self.state.gpus[w]
        by_server: dict[str, list[int]] = {}
        per_server = self._settings.gpus_per_server
        servers = self._servers[placement.accelerator_type]
        for core_id in placement.worker_ids:
            local = core_id - offset
            worker_id = servers[local // per_server][0]
            by_server.setdefault(worker_id, []).append(local % per_server)
        return [(worker_id, tuple(gpus)) for worker_id, gpus in by_server.items()]
