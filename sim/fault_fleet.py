"""The simulated fleet with faults: workers that heartbeat, crash, hang, run slow, lose a job's
process, and obey WorkerFenced and KillJobs as a real worker does (worker_service/service.py).
Used instead of sim/fleet.py's SimulatedFleet when a run has faults (that one stays as it is, so a
run without faults keeps its schedule to the bit).

Per worker: "up", "hung" (its commands wait in its queue, its reports wait, no heartbeats) or
"down" (crashed: what reaches it is gone, and a fresh process registers later). A gang's lease is
run once, when the commands of all its workers have arrived; a member that crashes ends it with no
report, a hung member holds its reports back. Each worker keeps its own account of which lease held
which of its GPUs, from when to when (``FaultLog.occupancy``), for the invariant "no GPU holds two
leases at once" to be checked from the workers' side.

Handlers never sleep on the clock (a delivery in flight stops virtual time): leases, heartbeats and
the scheduled faults run in tasks of their own.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from common.bus import Bus, Delivery
from common.clock import Clock
from common.messages import ExtendLease, JobProgress, KillJobs, RunJobs, WorkerFenced, WorkerHeartbeat, WorkerRegistered
from common.messages.base import Message
from common.throughputs import ThroughputTable
from sim.derived_rates import TableReference, lease_rates
from sim.faults import FaultLog, FaultSchedule, GpuOccupancy
from sim.learning import measurement_factor
from sim.physics import lease_outcome


@dataclass
class _Run:
    command: RunJobs | ExtendLease
    gpus: dict[str, tuple[int, ...]] = field(default_factory=dict)  # worker id -> its GPUs in the gang
    started_s: float = 0.0
    rates: tuple[float, ...] = ()
    task: asyncio.Task[None] | None = None
    assembled: bool = False
    finished_s: float | None = None  # when its processes exited (its GPUs were free from then)


class FaultyFleet:
    name = "fleet"

    def __init__(
        self,
        *,
        clock: Clock,
        table: ThroughputTable,
        cluster: dict[str, int],
        gpus_per_server: int,
        schedule: FaultSchedule,
        log: FaultLog,
        measurement_noise: float = 0.0,
        seed: int = 0,
    ) -> None:
        self._clock = clock
        self._reference = TableReference(table)  # the table, and the rule for jobs beyond it
        self._schedule = schedule
        self._log = log
        self._heartbeat_s = schedule.timing.heartbeat_s
        self._noise = measurement_noise
        self._seed = seed
        self._servers: dict[str, tuple[str, int]] = {}  # worker id -> (type, GPUs)
        for accelerator_type in sorted(cluster):
            for s in range(cluster[accelerator_type] // gpus_per_server):
                self._servers[f"{accelerator_type}-{s}"] = (accelerator_type, gpus_per_server)
        self._down: dict[str, list[tuple[Message, str]]] = {}  # crashed worker -> what waits in its queue
        self._hung: dict[str, list[tuple[Message, str]]] = {}  # hung worker -> what waits in its queue
        self._epoch: dict[str, int] = dict.fromkeys(self._servers, 0)  # newest epoch obeyed
        self._fences_seen: set[str] = set()  # message ids (a redelivered fence is obeyed once)
        self._runs: dict[str, _Run] = {}  # lease id -> assembling or running
        self._reported: dict[str, list[JobProgress]] = {}  # lease id -> its reports (repeated on a repeat)
        self._job_crashes = list(schedule.job_crashes)
        self._tasks: set[asyncio.Task[None]] = set()
        self._bus: Bus | None = None

    @property
    def worker_ids(self) -> tuple[str, ...]:
        return tuple(self._servers)

    # -- lifecycle -------------------------------------------------------------------------------------

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        await bus.subscribe(
            f"{self.name}.commands", [f"worker.cmd.{w}.*" for w in self._servers], self.on_command, prefetch=256
        )
        for worker_id in self._servers:
            await self._register(worker_id)
        self._spawn(self._heartbeats())
        for crash in self._schedule.worker_crashes:
            self._spawn(self._crash_worker(crash.at_s, crash.worker_id, crash.down_s))
        for hang in self._schedule.hangs:
            self._spawn(self._hang(hang.at_s, hang.worker_id, hang.duration_s))
        for slow in self._schedule.slow_gpus:
            self._spawn(self._note_slow(slow.at_s, slow.worker_id, slow.factor))

    async def stop(self) -> None:
        now_s = self._clock.now_s()
        for lease_id, run in list(self._runs.items()):
            if run.assembled:
                self._occupied(run, lease_id, now_s, "unfinished")
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coroutine) -> asyncio.Task[None]:  # noqa: ANN001
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _register(self, worker_id: str) -> None:
        accelerator_type, gpus = self._servers[worker_id]
        assert self._bus is not None
        # not mandatory: the mechanism may not be up yet (its queue keeps what it ever bound)
        await self._bus.publish(WorkerRegistered(worker_id, accelerator_type, gpus, worker_id), mandatory=False)
        await self._bus.publish(self._heartbeat(worker_id), mandatory=False)  # watched from now on

    def _heartbeat(self, worker_id: str) -> WorkerHeartbeat:
        leases = tuple(sorted(lid for lid, run in self._runs.items() if run.assembled and worker_id in run.gpus))
        return WorkerHeartbeat(worker_id, leases, self._epoch[worker_id])

    async def _heartbeats(self) -> None:
        assert self._bus is not None
        while True:
            await self._clock.sleep(self._heartbeat_s)
            for worker_id in self._servers:
                if worker_id not in self._down and worker_id not in self._hung:  # silent while down or hung
                    await self._bus.publish(self._heartbeat(worker_id), mandatory=False)

    # -- scheduled worker faults ------------------------------------------------------------------------

    async def _crash_worker(self, at_s: float, worker_id: str, down_s: float) -> None:
        """Its leases die with it. A gang's surviving lead reports the gang crashed at once (its
        collective fails); a lease it led is reported crashed by its fresh process, which finds the
        lease's file (the mechanism refuses the report if it declared the worker lost meanwhile,
        and needs it if not: a mechanism restarted during the downtime gave the worker a fresh
        grace, so the fresh registration may come first and be taken for a re-announcement).
        Commands sent meanwhile wait in its durable queue, for the fresh process."""
        await self._clock.sleep_until(at_s)
        if worker_id in self._down:
            return  # down already (two crashes drawn close together): one is enough
        now_s = self._clock.now_s()
        self._log.injected("worker-crash", now_s, worker_id)
        self._down[worker_id] = self._hung.pop(worker_id, [])  # a hung process that dies: its queue stays
        died = []
        for lease_id, run in list(self._runs.items()):
            if worker_id not in run.gpus:
                continue
            assembled = run.assembled
            self._end(lease_id, run, now_s, "worker-crash")
            if not assembled:
                continue  # its other commands had not come: nothing ran
            if min(run.gpus) == worker_id:
                died.append((lease_id, run))
            else:
                await self._fail(lease_id, run, now_s - run.started_s, f"worker {worker_id} of this gang died", every=True)
        await self._clock.sleep(down_s)
        waiting = self._down.pop(worker_id)
        self._epoch[worker_id] = 0  # a fresh process
        await self._register(worker_id)
        for lease_id, run in died:
            await self._fail(lease_id, run, now_s - run.started_s, "the worker process died with its jobs", every=True)
        for message, message_id in waiting:
            await self._obey(message, message_id)

    async def _hang(self, at_s: float, worker_id: str, duration_s: float) -> None:
        await self._clock.sleep_until(at_s)
        if worker_id in self._down or worker_id in self._hung:
            return
        self._log.injected("hang", self._clock.now_s(), f"{worker_id} for {duration_s:.0f} s")
        self._hung[worker_id] = []
        await self._clock.sleep(duration_s)
        waiting = self._hung.pop(worker_id, None)
        if waiting is None:
            return  # crashed meanwhile
        for message, message_id in waiting:  # what arrived meanwhile, in order (a fence among them)
            await self._obey(message, message_id)
        assert self._bus is not None
        await self._bus.publish(self._heartbeat(worker_id), mandatory=False)

    async def _note_slow(self, at_s: float, worker_id: str, factor: float) -> None:
        await self._clock.sleep_until(at_s)
        self._log.injected("slow-gpu", self._clock.now_s(), f"{worker_id} at {factor:.2f}x")

    def _slowdown(self, worker_id: str, now_s: float) -> float:
        factor = 1.0
        for slow in self._schedule.slow_gpus:
            if slow.worker_id == worker_id and slow.at_s <= now_s < slow.at_s + slow.duration_s:
                factor = min(factor, slow.factor)
        return factor

    # -- commands -------------------------------------------------------------------------------------

    async def on_command(self, d: Delivery) -> None:
        worker_id = getattr(d.message, "worker_id", "")
        waiting = self._hung.get(worker_id, self._down.get(worker_id))
        if waiting is not None:
            waiting.append((d.message, d.envelope.message_id))  # read when the worker resumes or restarts
            return
        await self._obey(d.message, d.envelope.message_id)

    async def _obey(self, command: Message, message_id: str) -> None:
        worker_id = getattr(command, "worker_id", "")
        epoch = getattr(command, "epoch", 0)
        if epoch < self._epoch.get(worker_id, 0):
            return  # from a mechanism that has been replaced (the real worker refuses it too)
        self._epoch[worker_id] = max(self._epoch.get(worker_id, 0), epoch)
        if isinstance(command, WorkerFenced):
            await self._on_fenced(command, message_id)
        elif isinstance(command, KillJobs):
            await self._stop_lease(command.lease_id, worker_id, "killed")
        elif isinstance(command, (RunJobs, ExtendLease)):
            await self._on_lease(command)

    async def _on_fenced(self, fence: WorkerFenced, message_id: str) -> None:
        """Declared lost: stop every lease, and register again (a new server to the mechanism).
        Each stopped lease is reported killed with its steps so far: the mechanism refuses the
        report when it ended the lease with the loss (the usual case), and takes it when the fence
        was a stale copy that reached a worker already registered again, which would otherwise
        leave the lease unreported for ever (the real worker reports nothing here and relies on
        the live round timeout)."""
        if message_id in self._fences_seen:
            return  # a duplicate of a fence obeyed already
        self._fences_seen.add(message_id)
        for lease_id, run in list(self._runs.items()):
            if fence.worker_id in run.gpus:
                await self._stop_lease(lease_id, fence.worker_id, "fenced")
        await self._register(fence.worker_id)

    async def _on_lease(self, command: RunJobs | ExtendLease) -> None:
        assert self._bus is not None
        if command.lease_id in self._reported:
            for report in self._reported[command.lease_id]:  # seen before: the same reports again
                await self._bus.publish(report, mandatory=False)
            return
        run = self._runs.setdefault(command.lease_id, _Run(command))
        if run.assembled or command.worker_id in run.gpus:
            return  # running, or a duplicate of a member's command
        run.gpus[command.worker_id] = tuple(command.gpu_ids)
        if sum(len(g) for g in run.gpus.values()) >= command.scale_factor:
            run.assembled = True
            run.started_s = self._clock.now_s()
            run.task = self._spawn(self._run(command.lease_id, run))

    async def _stop_lease(self, lease_id: str, worker_id: str, how: str) -> None:
        run = self._runs.get(lease_id)
        if run is None or worker_id not in run.gpus:
            return  # over already (a kill that crossed the report)
        now_s = self._clock.now_s()
        if not run.assembled:
            del self._runs[lease_id]
            return
        self._end(lease_id, run, now_s, how)
        ran_s = (now_s if run.finished_s is None else run.finished_s) - run.started_s
        rates = run.rates or (0.0,) * len(run.command.job_ids)
        steps, _ = lease_outcome(rates, run.command.max_steps, ran_s, _restore_s(run.command))
        await self._report(run, lease_id, steps, ran_s, outcome="killed")

    def _end(self, lease_id: str, run: _Run, now_s: float, how: str) -> None:
        """The lease leaves its GPUs now (its task, if running, is stopped)."""
        if self._runs.get(lease_id) is not run:
            return  # ended already
        del self._runs[lease_id]
        if run.task is not None and run.task is not asyncio.current_task():
            run.task.cancel()
        if run.assembled:
            self._occupied(run, lease_id, now_s, how)

    def _occupied(self, run: _Run, lease_id: str, end_s: float, how: str) -> None:
        if run.finished_s is not None:
            end_s = min(end_s, run.finished_s)
        for worker_id, gpus in sorted(run.gpus.items()):
            for gpu in gpus:
                self._log.occupancy.append(
                    GpuOccupancy(worker_id, gpu, lease_id, run.command.round_id, run.started_s, end_s, how)
                )

    # -- a lease --------------------------------------------------------------------------------------

    async def _run(self, lease_id: str, run: _Run) -> None:
        command = run.command
        accelerator_type = self._servers[command.worker_id][0]
        now_s = self._clock.now_s()
        factor = min(self._slowdown(w, now_s) for w in run.gpus)
        rates = lease_rates(
            self._reference, command.job_types, command.scale_factor, accelerator_type, command.throughput_estimates_steps_per_s
        )
        run.rates = tuple(r * factor for r in rates)
        steps, duration_s = lease_outcome(run.rates, command.max_steps, command.lease_duration_s, _restore_s(command))
        crash = next((c for c in self._job_crashes if c.at_s <= now_s), None)
        if crash is not None:
            self._job_crashes.remove(crash)
            self._log.injected("job-crash", now_s, f"{command.job_ids[0]} in lease {lease_id}")
            await self._clock.sleep(duration_s * crash.after_fraction)
            await self._fail(
                lease_id, run, duration_s * crash.after_fraction,
                "injected fault: the job's process exited with an error (sim/faults.py job-crash)",
            )
            return
        await self._clock.sleep(duration_s)
        run.finished_s = self._clock.now_s()  # its processes exit now; a hung worker tells it later
        await self._until_responsive(run)
        self._end(lease_id, run, self._clock.now_s(), "reported")
        await self._report(run, lease_id, steps, duration_s, outcome="")

    async def _until_responsive(self, run: _Run) -> None:
        """A hung member holds the gang's reports until it resumes (or is fenced meanwhile)."""
        while any(w in self._hung for w in run.gpus):
            now_s = self._clock.now_s()
            ends = [h.at_s + h.duration_s for h in self._schedule.hangs if h.worker_id in run.gpus and h.at_s <= now_s]
            await self._clock.sleep(min([t - now_s for t in ends if t > now_s], default=self._heartbeat_s))

    async def _fail(self, lease_id: str, run: _Run, elapsed_s: float, error: str, *, every: bool = False) -> None:
        """The lease's processes exit with an error: the first member's (``every``: all of them); a
        packed partner is stopped with it ("killed": it loses the lease, no attempt)."""
        command = run.command
        accelerator_type = self._servers[command.worker_id][0]
        self._end(lease_id, run, self._clock.now_s(), "crashed")
        assert self._bus is not None
        lead = min(run.gpus)
        reports = []
        for k, job_id in enumerate(command.job_ids):
            failed = every or k == 0
            reports.append(JobProgress(
                job_id=job_id, worker_id=lead, lease_id=lease_id, round_id=command.round_id, steps_done=0,
                elapsed_s=elapsed_s, throughput_steps_per_s=0.0, outcome="crashed" if failed else "killed",
                exit_code=1 if failed else None, error=error if failed else "", accelerator_type=accelerator_type,
                packed_with=tuple(other for other in command.job_ids if other != job_id),
            ))
        self._reported[lease_id] = reports
        for report in reports:
            await self._bus.publish(report)

    async def _report(self, run: _Run, lease_id: str, steps: tuple[int, ...], elapsed_s: float, *, outcome: str) -> None:
        command = run.command
        accelerator_type = self._servers[command.worker_id][0]
        assert self._bus is not None
        lead = min(run.gpus)
        rates = run.rates or (0.0,) * len(command.job_ids)
        reports = [
            JobProgress(
                job_id=job_id, worker_id=lead, lease_id=lease_id, round_id=command.round_id, steps_done=done,
                elapsed_s=elapsed_s,
                throughput_steps_per_s=rate * measurement_factor(self._seed, job_id, run.started_s, self._noise),
                finished=done >= remaining, outcome=outcome, accelerator_type=accelerator_type,
                packed_with=tuple(other for other in command.job_ids if other != job_id),
            )
            for job_id, done, rate, remaining in zip(command.job_ids, steps, rates, command.max_steps, strict=True)
        ]
        self._reported[lease_id] = reports
        for report in reports:
            await self._bus.publish(report)
        # a command older than the last couple of rounds will not be repeated: forget its reports
        stale = [lid for lid, rs in self._reported.items() if rs and rs[0].round_id < command.round_id - 2]
        for stale_id in stale:
            del self._reported[stale_id]


def _restore_s(command: RunJobs | ExtendLease) -> float:
    return command.restore_s if isinstance(command, RunJobs) else 0.0
