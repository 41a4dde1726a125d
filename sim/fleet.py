"""The simulated worker fleet: servers that register, obey lease commands and report progress
from a throughput table, speaking the same protocol as real workers (worker_service).

Time: on the simulator's virtual clock, or on a (scaled) wall clock, a lease's report goes out
when the lease ends. In lockstep (``lockstep=True``: a fleet in its own process replaying a trace
with a lockstep mechanism) it goes out at once, with the lease's simulated length; the mechanism
moves time. A command seen before (same lease id, redelivered or re-sent by a restarted mechanism)
gets the same report again.

A lease's progress comes from sim.physics (the same function as the bus-free path), at the rates
of the table, or for a job the table lacks (a user's own type, a size it lacks) at the rates
sim/derived_rates.py states: the submitter's, else derived from the table. A gang
spread over several servers is one lease: the fleet runs it once, when the commands for all its
GPUs have arrived, and its lead server reports each job's progress when the lease ends. Handlers
never sleep on the clock (a delivery in flight would stop virtual time); the lease runs in a
task of its own.
"""

from __future__ import annotations

import asyncio
import collections
import socket
from dataclasses import dataclass, field

import structlog

from common.bus import Bus, Delivery
from common.clock import Clock
from common.errors import ConfigError, NameClaimedError
from common.metrics import CollectorRegistry, WorkerMetrics
from common.messages import (
    ExtendLease,
    JobProgress,
    KillJobs,
    LogsReported,
    LogsRequested,
    RunJobs,
    WorkerFenced,
    WorkerHeartbeat,
    WorkerIdInUse,
    WorkerRefused,
    WorkerRegistered,
)
from common.throughputs import ThroughputTable
from sim.derived_rates import TableReference, lease_rates
from sim.learning import measurement_factor
from sim.physics import lease_outcome


log = structlog.get_logger("gavel.fleet")
RAN_JOBS_KEPT = 100_000  # jobs whose `gavel logs` this fleet answers (the newest)

@dataclass
class _Gang:
    command: RunJobs | ExtendLease
    gpus: int = 0
    workers: list[str] = field(default_factory=list)


class SimulatedFleet:
    name = "fleet"

    def __init__(
        self,
        *,
        clock: Clock,
        table: ThroughputTable,
        cluster: dict[str, int],
        gpus_per_server: int = 1,
        lockstep: bool = False,
        heartbeat_s: float | None = None,
        clock_name: str = "",
        name: str = "fleet",
        measurement_noise: float = 0.0,
        seed: int = 0,
        instance: str = "",
        claim_ids: bool = False,
        answers_logs: bool = False,
        registry: CollectorRegistry | None = None,
    ) -> None:
        # Two fleets on one exchange need two names: each consumes its own queue, <name>.commands.
        self.name = name
        # As a real worker's (WorkerRegistered.instance): `gavel serve fleet` gives each start its
        # own, and claims its worker ids on the broker, so that a fleet and a worker (or two
        # fleets) cannot both run as one id; the in-process simulator needs neither.
        self._instance = instance
        self._claim_ids = claim_ids
        self._clock = clock
        self._clock_name = clock_name  # announced, so a mechanism on another clock can say so
        self._lockstep = lockstep
        self._heartbeat_s = heartbeat_s
        self._reported: dict[str, list[JobProgress]] = {}  # lease id -> its reports
        self._reference = TableReference(table)  # the table, and what the rule beyond it reads of it
        # Measurements are the true rates times a seeded log-normal factor (sim/learning.py); the
        # steps done follow the true rates.
        self._noise = measurement_noise
        self._seed = seed
        self._servers: list[tuple[str, str, int]] = []  # (worker id, type, gpus)
        for accelerator_type in sorted(cluster):
            for s in range(cluster[accelerator_type] // gpus_per_server):
                self._servers.append((f"{accelerator_type}-{s}", accelerator_type, gpus_per_server))
        self._type_of = {worker_id: w for worker_id, w, _ in self._servers}
        self._gangs: dict[str, _Gang] = {}
        # `gavel logs JOB` of a job this fleet ran is told that a simulated job has no output
        # (rather than waiting for a worker that will never answer): job id -> its lead server
        self._answers_logs = answers_logs
        self._ran: dict[str, str] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._bus: Bus | None = None
        self._running: collections.Counter[str] = collections.Counter()  # worker id -> jobs its leases run now
        self.metrics = WorkerMetrics(
            registry, "fleet", lambda: [(worker_id, self._running[worker_id]) for worker_id, _, _ in self._servers]
        )

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        if self._claim_ids:
            await self._claim(bus)
        await bus.subscribe(
            f"{self.name}.commands",
            [f"worker.cmd.{worker_id}.*" for worker_id, _, _ in self._servers],
            self.on_command,
            prefetch=256,
        )
        for worker_id, accelerator_type, gpus in self._servers:
            # not mandatory: a fleet may start before the mechanism (its queue keeps them if it
            # ever ran; a mechanism that starts later learns the fleet from the next heartbeat)
            await bus.publish(self._registration(worker_id, accelerator_type, gpus), mandatory=False)
        if self._answers_logs:
            await bus.subscribe(f"{self.name}.logs", [LogsRequested.ROUTING_KEY], self.on_logs_request, durable=False)
        if self._heartbeat_s:
            self._spawn(self._heartbeats())

    async def _heartbeats(self) -> None:
        assert self._bus is not None and self._heartbeat_s is not None
        while True:
            await self._clock.sleep(self._heartbeat_s)
            for worker_id, accelerator_type, gpus in self._servers:
                # the registration again (a mechanism that starts later, or lost the worker, takes
                # it as a new server), and a heartbeat: watched from it as a real worker is, a fleet
                # stopped past the mechanism's grace is declared lost and fenced
                await self._bus.publish(self._registration(worker_id, accelerator_type, gpus), mandatory=False)
                await self._bus.publish(WorkerHeartbeat(worker_id, instance=self._instance), mandatory=False)

    def _registration(self, worker_id: str, accelerator_type: str, gpus: int) -> WorkerRegistered:
        return WorkerRegistered(worker_id, accelerator_type, gpus, worker_id, clock=self._clock_name, instance=self._instance)

    async def _claim(self, bus: Bus) -> None:
        """Every worker id of the fleet, or none: one line naming the first that another live
        process (a real worker, another fleet) holds."""
        for worker_id, accelerator_type, gpus in self._servers:
            try:
                await bus.claim(f"worker.{worker_id}")
            except NameClaimedError:
                reason = (
                    f"worker id {worker_id!r} of this fleet is in use by another live worker process on this cluster: "
                    "stop that one first (a fleet names its workers <type>-<n>), or run this fleet on another exchange"
                )
                await bus.publish(WorkerIdInUse(worker_id, accelerator_type, gpus, socket.gethostname(), reason), mandatory=False)
                raise ConfigError(reason) from None

    def _spawn(self, coroutine) -> None:  # noqa: ANN001
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def on_command(self, d: Delivery) -> None:
        command = d.message
        if isinstance(command, KillJobs):
            return  # leases end at their own time in the simulator; nothing runs past them
        if isinstance(command, WorkerRefused):
            log.error("worker_refused_by_mechanism", worker_id=command.worker_id, reason=command.reason)
            return
        if isinstance(command, WorkerFenced):
            # Declared lost: its reports are refused from now on, and its next re-announcement
            # (every heartbeat) registers it again as a new server.
            return
        assert isinstance(command, (RunJobs, ExtendLease))
        if command.lease_id in self._reported:
            # Seen before: report the same again (the mechanism absorbs duplicates).
            assert self._bus is not None
            for report in self._reported[command.lease_id]:
                await self._bus.publish(report, mandatory=False)
            return
        gang = self._gangs.setdefault(command.lease_id, _Gang(command))
        gpus = len(command.gpu_ids) if isinstance(command, RunJobs) else None
        gang.gpus += gpus if gpus is not None else self._gpus_of(command.worker_id)
        gang.workers.append(command.worker_id)
        if gang.gpus >= command.scale_factor:
            del self._gangs[command.lease_id]
            self._reported[command.lease_id] = []  # running: a repeat of the command waits for it
            self._spawn(self._run(gang))

    async def on_logs_request(self, d: Delivery) -> None:
        request = d.message
        if not isinstance(request, LogsRequested) or request.job_id not in self._ran or self._bus is None:
            return
        note = "it ran on the simulated fleet, which runs no process"
        reply = LogsReported(request.request_id, request.reply_to, self._ran[request.job_id], request.job_id, note=note)
        await self._bus.publish(reply, mandatory=False)

    def _gpus_of(self, worker_id: str) -> int:
        return next(g for w, _, g in self._servers if w == worker_id)

    async def _run(self, gang: _Gang) -> None:
        command = gang.command
        accelerator_type = self._type_of[command.worker_id]
        rates = lease_rates(
            self._reference, command.job_types, command.scale_factor, accelerator_type, command.throughput_estimates_steps_per_s
        )
        started_s = self._clock.now_s()
        restore_s = command.restore_s if isinstance(command, RunJobs) else 0.0
        steps, duration_s = lease_outcome(rates, command.max_steps, command.lease_duration_s, restore_s)
        lead = min(gang.workers)
        if not self._lockstep:
            self._running.update(dict.fromkeys(gang.workers, len(command.job_ids)))
            try:
                await self._clock.sleep(duration_s)
            finally:
                self._running.subtract(dict.fromkeys(gang.workers, len(command.job_ids)))
        assert self._bus is not None
        self.metrics.lease_ended(lead, "finished" if all(d >= r for d, r in zip(steps, command.max_steps)) else "lease_end")
        if self._answers_logs:
            for job_id in command.job_ids:
                self._ran[job_id] = lead
            while len(self._ran) > RAN_JOBS_KEPT:
                del self._ran[next(iter(self._ran))]
        for job_id, done, rate, remaining in zip(command.job_ids, steps, rates, command.max_steps, strict=True):
            report = JobProgress(
                    job_id=job_id,
                    worker_id=lead,
                    lease_id=command.lease_id,
                    round_id=command.round_id,
                    steps_done=done,
                    elapsed_s=duration_s,
                    throughput_steps_per_s=rate * measurement_factor(self._seed, job_id, started_s, self._noise),
                    finished=done >= remaining,
                    accelerator_type=accelerator_type,
                    packed_with=tuple(other for other in command.job_ids if other != job_id),
            )
            self._reported[command.lease_id].append(report)
            await self._bus.publish(report)
        # A command older than the last couple of rounds will not be repeated: forget its reports.
        stale = [lid for lid, reports in self._reported.items() if reports and reports[0].round_id < command.round_id - 2]
        for lease_id in stale:
            del self._reported[lease_id]
