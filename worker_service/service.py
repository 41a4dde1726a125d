"""The worker service: one per server, owning that server's accelerators of one type.

It speaks the protocol of the simulated fleet (sim/fleet.py), so the same mechanism drives either:
it registers and heartbeats, obeys ``worker.cmd.<id>.run|extend|kill`` (refusing commands of an
older mechanism incarnation than one it obeyed), and reports ``job.progress`` for every lease.

A lease, as the shell runs it (the decisions are worker_service/core.py's):

1. ``run``: start the job's process (one per rank for a gang, after the gang's rendezvous), with
   its lease file; GPUs still held by a paused job that was not extended are freed first.
2. The job steps until its lease's end or its step budget, saves a checkpoint and pauses
   (worker_service/training.py); its progress file says so and the worker reports the lease.
3. ``extend``: the lease file gets the next lease and the same process goes on. A job not extended
   by the next round (``round.started`` does not list it here), or not within ``hold_s``, is told
   to stop; it has checkpointed already, so it exits at once.
4. ``kill``, a fence, or the worker's own shutdown: SIGTERM (checkpoint at the end of the step,
   exit), SIGKILL after ``kill_grace_s``.
5. A process that fails is reported as crashed, with its exit code and the tail of its output,
   and its lease ends.

The lease bookkeeping (a run's record, each lease reported once, a repeated command answered with
its reports) is worker_service/leases.py's, a gang's rendezvous worker_service/rendezvous.py's and
serving job logs worker_service/log_desk.py's; this shell owns the bus, the commands and the job
processes.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

import structlog

from common.bus import Bus, Delivery
from common.errors import ConfigError, NameClaimedError
from common.metrics import CollectorRegistry, WorkerMetrics
from common.messages import (
    ExtendLease,
    GangRendezvous,
    KillJobs,
    RoundStarted,
    RunJobs,
    WorkerFenced,
    WorkerHeartbeat,
    WorkerIdInUse,
    WorkerRefused,
    WorkerRegistered,
)
from worker_service import core, logbook, processes
from worker_service.core import Launch, LeaseTerms, Rendezvous, WorkerConfig
from worker_service.job_logs import AttemptLog, LogStore
from worker_service.leases import JobRun, LeaseReports
from worker_service.log_desk import LogDesk
from worker_service.logbook import LogLimits
from worker_service.rendezvous import GangMeeting
from worker_service.training import write_json_atomic

log = structlog.get_logger("gavel.worker")

WATCH_EVERY_S = 0.05  # how often a job's progress file and process are looked at (a paused job waits this long at most)


class WorkerService:
    def __init__(
        self,
        *,
        config: WorkerConfig,
        heartbeat_s: float = 2.0,
        kill_grace_s: float = 30.0,
        hold_s: float = 60.0,
        rendezvous_timeout_s: float = 60.0,
        now_unix_s: Callable[[], float] = time.time,
        base_env: Mapping[str, str] | None = None,
        server_id: str = "",
        instance: str | None = None,
        log_limits: LogLimits = LogLimits(),
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.name = f"worker-{config.worker_id}"
        self.config = config
        self._logs = LogStore(config.log_dir or f"{config.run_dir}/logs", config.worker_id, log_limits, now_unix_s)
        self._log_desk = LogDesk(self._logs, config.worker_id)
        self.metrics = WorkerMetrics(registry, "worker", lambda: [(config.worker_id, len(self._runs))])
        # This process among every one that ever ran as this worker id (WorkerRegistered.instance)
        self.instance = instance if instance is not None else uuid.uuid4().hex[:12]
        # Set when this process must stop on its own: another process took its worker id
        self.crashed = asyncio.Event()
        self.stop_reason = ""
        self._server_id = server_id or config.worker_id
        self._heartbeat_s = heartbeat_s
        self._kill_grace_s = kill_grace_s
        self._hold_s = hold_s
        self._now = now_unix_s
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._newest_epoch = 0
        self._round_seen = -1  # the newest round started, and its jobs here (a lease of an earlier one is stale)
        self._continuing: set[str] = set()
        self._runs: dict[str, JobRun] = {}  # job id -> run
        self._tasks: set[asyncio.Task[None]] = set()
        self._bus: Bus | None = None
        self._log = log.bind(worker_id=config.worker_id, accelerator_type=config.accelerator_type)
        self._leases = LeaseReports(config, self.metrics, now_unix_s, self._log)
        self._gang = GangMeeting(config, rendezvous_timeout_s)

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self, bus: Bus) -> None:
        self._bus = self._leases.bus = self._gang.bus = bus
        for directory in (self.config.run_dir, self.config.checkpoint_dir, self.config.work_dir):
            Path(directory).mkdir(parents=True, exist_ok=True)
        await self._claim_id(bus)
        await asyncio.to_thread(self._logs.open)
        # Commands and round starts share one queue, so a round's start comes after its commands.
        await bus.subscribe(
            f"worker.{self.config.worker_id}",
            [f"worker.cmd.{self.config.worker_id}.*", RoundStarted.ROUTING_KEY],
            self.on_message,
            prefetch=64,
        )
        await self._log_desk.start(bus)
        await self._announce()
        self._spawn(self._heartbeats())
        self._log.info("worker_started", gpus=self.config.gpus, device=self.config.device, checkpoint_dir=self.config.checkpoint_dir)

    async def _claim_id(self, bus: Bus) -> None:
        """One process per worker id: two would compete for its commands (each taking every other
        one) and the mechanism would count GPUs that are not there. The broker holds the claim, so
        it is refused while the other process lives and free as soon as it dies."""
        c = self.config
        try:
            await bus.claim(f"worker.{c.worker_id}")
        except NameClaimedError:
            reason = (
                f"worker id {c.worker_id!r} is in use by another live worker process on this cluster: give this "
                "one its own --worker-id, or stop the other first (a restart of the same worker takes its place "
                "as soon as the old process has exited)"
            )
            # The mechanism records the attempt where an operator looks (`gavel cluster`).
            attempt = WorkerIdInUse(c.worker_id, c.accelerator_type, c.gpus, socket.gethostname(), reason)
            await bus.publish(attempt, mandatory=False)
            raise ConfigError(reason) from None

    async def stop(self) -> None:
        """Stop every job (each checkpoints and is reported as killed), then the tasks."""
        runs = list(self._runs.values())
        await asyncio.gather(*(self._stop_run(run, "the worker is shutting down") for run in runs), return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coroutine) -> asyncio.Task[None]:  # noqa: ANN001
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _announce(self) -> None:
        assert self._bus is not None
        c = self.config
        registration = WorkerRegistered(
            c.worker_id, c.accelerator_type, c.gpus, self._server_id, clock="wall", instance=self.instance
        )
        # Not mandatory: a worker may start before the mechanism; it re-announces itself.
        await self._bus.publish(registration, mandatory=False)
        heartbeat = WorkerHeartbeat(
            c.worker_id, tuple(sorted({r.lease_id for r in self._runs.values()})), self._newest_epoch, self.instance
        )
        await self._bus.publish(heartbeat, mandatory=False)

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_s)
            try:
                await self._announce()
            except Exception as e:  # noqa: BLE001 - a broker hiccup must not end the heartbeats
                self._log.warning("heartbeat_failed", error=repr(e))

    # -- commands ----------------------------------------------------------------------------------

    async def on_message(self, d: Delivery) -> None:
        message = d.message
        if isinstance(message, RoundStarted):
            await self._on_round_started(message)
            return
        if isinstance(message, GangRendezvous):
            self._gang.heard(message)
            return
        epoch = getattr(message, "epoch", 0)
        if core.stale_epoch(epoch, self._newest_epoch):
            self._log.warning(
                "command_refused", command=type(message).__name__, lease_id=getattr(message, "lease_id", ""),
                reason=f"epoch {epoch} is older than {self._newest_epoch}, already obeyed",
            )
            return
        self._newest_epoch = max(self._newest_epoch, epoch)
        if isinstance(message, WorkerRefused):
            self._log.error("worker_refused_by_mechanism", reason=message.reason, action="it keeps announcing itself")
        elif isinstance(message, WorkerFenced):
            await self._on_fenced(message)
        elif isinstance(message, KillJobs):
            await self._on_kill(message)
        elif isinstance(message, (RunJobs, ExtendLease)):
            await self._on_lease(message)

    async def _on_lease(self, command: RunJobs | ExtendLease) -> None:
        if await self._leases.seen_before(command):
            return  # seen before (redelivered, or republished by a restarted mechanism): its reports went again
        received_unix_s = self._now()
        if isinstance(command, ExtendLease):
            running = [self._runs.get(j) for j in command.job_ids]
            if all(run is not None and not run.stopping and run.procs and not any(p.finished for p in run.procs) for run in running):
                for index, run in enumerate(running):
                    assert run is not None
                    # the lease before, if its pause was not reported yet (the process runs: no exit)
                    await self._leases.maybe_report(run, run.progress(), [], all_exited=False)
                    run.terms = core.lease_terms(command, index, received_unix_s)
                    run.packed_with = core.packed_with(command, run.job_id)
                    run.received_unix_s = received_unix_s
                    run.write_terms()
                self._log.info("lease_extended", lease_id=command.lease_id, job_ids=list(command.job_ids), round_id=command.round_id)
                return
            # Not running here (this worker restarted, or the job crashed): start it anew.
        self._spawn(self._launch(command, received_unix_s))

    async def _launch(self, command: RunJobs | ExtendLease, received_unix_s: float) -> None:
        gpu_ids = command.gpu_ids
        # GPUs still held by jobs that are not part of this lease (paused, not extended) are freed first.
        holders = [r for r in self._runs.values() if r.job_id not in command.job_ids and set(r.gpu_ids) & set(gpu_ids)]
        holders += [self._runs[j] for j in command.job_ids if j in self._runs]  # an earlier attempt of the same job
        await asyncio.gather(*(self._stop_run(run, "its GPUs are leased to another job") for run in holders))
        rendezvous: Rendezvous | None = None
        try:
            if core.needs_rendezvous(command):
                rendezvous = await self._gang.meet(command)
            launches = core.launches(self.config, command, received_unix_s, rendezvous, self._base_env)
        except Exception as e:  # noqa: BLE001 - reported as the lease's failure
            await self._leases.failure(command, received_unix_s, f"could not start: {e}")
            return
        by_job: dict[str, list[Launch]] = {}
        for launch in launches:
            by_job.setdefault(launch.job_id, []).append(launch)
        for index, job_id in enumerate(command.job_ids):
            terms = core.lease_terms(command, index, received_unix_s)
            job_launches = by_job.get(job_id, [])
            run = JobRun(
                job_id=job_id, job_type=job_launches[0].job_type if job_launches else "", gpu_ids=gpu_ids, procs=[],
                terms=terms, received_unix_s=received_unix_s, reports=any(launch.reports for launch in job_launches),
                packed_with=core.packed_with(command, job_id),
            )
            self._runs[job_id] = run
            run.output = self._logs.begin(
                job_id, ranks=[launch.rank for launch in job_launches], lease_id=command.lease_id, started_unix_s=received_unix_s
            )
            try:
                for launch in job_launches:
                    Path(launch.lease_file).parent.mkdir(parents=True, exist_ok=True)
                    write_json_atomic(Path(launch.lease_file), terms.as_json())
                    run.procs.append(await processes.start(launch, self._output(run.output, launch, command.scale_factor > 1)))
            except OSError as e:
                for p in run.procs:
                    await p.stop(0.0)
                self._runs.pop(job_id, None)
                await asyncio.to_thread(self._logs.end, run.output, f"could not start: {e}")
                await self._leases.failure(command, received_unix_s, f"could not start {core.describe_argv(job_launches[0].argv)!r}: {e}", only=job_id)
                continue
            self._log.info(
                "job_started", job_id=job_id, lease_id=command.lease_id, round_id=command.round_id, gpu_ids=list(gpu_ids),
                ranks=[launch.rank for launch in job_launches], pids=[p.pid for p in run.procs],
                resume_step=command.resume_steps[index] if index < len(command.resume_steps) else None,
            )
            run.task = self._spawn(self._watch(run))
            # A restarted worker reads from its queue a lease of an earlier round and then the
            # start of the next one, which does not continue it. That start may come while the
            # processes start (its stop found none to stop) or before (it found no run): either
            # way they stop now, or they would pause for ever, holding their GPUs.
            if run.stopping:
                run.write_terms()
                self._spawn(self._stop_started(run))
            elif command.round_id < self._round_seen and job_id not in self._continuing:
                self._spawn(self._stop_run(run, f"not continued here in round {self._round_seen}"))

    @staticmethod
    def _output(attempt: AttemptLog, launch: Launch, gang: bool):  # noqa: ANN205
        rank = launch.rank if gang else None  # a gang's lines say their rank
        return lambda data: attempt.write(logbook.mark_lines(data, rank))

    async def _on_round_started(self, started: RoundStarted) -> None:
        """A job paused here that the new round does not continue here is told to stop (it has
        checkpointed already)."""
        continuing = {
            job_id for a in started.assignments if a.worker_id == self.config.worker_id for job_id in a.job_ids
        }
        if started.round_id > self._round_seen:
            self._round_seen, self._continuing = started.round_id, continuing
        for run in list(self._runs.values()):
            if run.terms.round_id < started.round_id and run.job_id not in continuing and not run.stopping:
                self._spawn(self._stop_run(run, f"not continued here in round {started.round_id}"))

    async def _on_kill(self, command: KillJobs) -> None:
        for run in [r for r in self._runs.values() if r.lease_id == command.lease_id]:
            self._spawn(self._stop_run(run, command.reason or "killed by the mechanism", killed=True))

    async def _on_fenced(self, message: WorkerFenced) -> None:
        """Declared lost: our leases were ended without us; stop everything, report nothing (the
        mechanism refuses it), and announce ourselves again to rejoin. A fence for another process
        of this worker id (the one this process replaced) is not ours; a fence that says another
        process replaced this one ends this one (it must not take the id back)."""
        if message.instance and message.instance != self.instance:
            self._log.info("fence_for_another_instance", instance=message.instance, reason=message.reason)
            return
        self._log.warning("worker_fenced", reason=message.reason, jobs=len(self._runs))
        runs = list(self._runs.values())
        for run in runs:
            run.reported.add(run.lease_id)  # no report: the lease is over for the mechanism
        await asyncio.gather(*(self._stop_run(run, "fenced") for run in runs), return_exceptions=True)
        if message.replaced_by and message.replaced_by != self.instance:
            self.stop_reason = f"another process ({message.replaced_by}) took worker id {self.config.worker_id!r}: {message.reason}"
            self._log.error("worker_replaced", reason=self.stop_reason, action="this process stops")
            self.crashed.set()
            return
        await self._announce()

    async def _stop_started(self, run: JobRun) -> None:
        await asyncio.gather(*(p.stop(self._kill_grace_s) for p in run.procs))

    async def _stop_run(self, run: JobRun, reason: str, *, killed: bool = False) -> None:
        if run.stopping:
            if run.task is not None:
                await asyncio.gather(run.task, return_exceptions=True)
            return
        run.stopping = True
        run.killed = run.killed or killed
        run.stop_reason = reason
        run.terms = LeaseTerms(run.terms.lease_id, run.terms.round_id, run.terms.lease_end_unix_s, run.terms.step_budget, stop=True)
        try:
            run.write_terms()
        except OSError:
            pass
        self._log.info("job_stopping", job_id=run.job_id, lease_id=run.lease_id, reason=reason)
        await asyncio.gather(*(p.stop(self._kill_grace_s) for p in run.procs))
        if run.task is not None:
            await asyncio.gather(run.task, return_exceptions=True)

    # -- watching a job ------------------------------------------------------------------------------

    async def _watch(self, run: JobRun) -> None:
        """Report each lease of ``run`` when it is settled; end when its processes are gone."""
        try:
            paused_since: float | None = None
            while True:
                exited = [p for p in run.procs if p.finished]
                failed = [p for p in exited if p.exit_code != 0]
                if failed and len(exited) < len(run.procs) and not run.stopping:
                    # A rank failed: the others would wait for it in a collective for ever.
                    self._spawn(self._stop_run(run, f"rank {failed[0].launch.rank} failed"))
                progress = run.progress()  # read once per look: the report and the hold both use it
                await self._leases.maybe_report(run, progress, failed, all_exited=len(exited) == len(run.procs))
                if len(exited) == len(run.procs):
                    break
                if progress.get("state") == "paused" and progress.get("lease_id") == run.lease_id:
                    paused_since = paused_since or time.monotonic()
                    if time.monotonic() - paused_since > self._hold_s and not run.stopping:
                        self._spawn(self._stop_run(run, f"not extended within {self._hold_s:g} s"))
                else:
                    paused_since = None
                await asyncio.sleep(WATCH_EVERY_S)
            self._log.info("job_exited", job_id=run.job_id, exit_codes=[p.exit_code for p in run.procs], killed=run.killed)
        finally:
            if self._runs.get(run.job_id) is run:
                del self._runs[run.job_id]
            if run.output is not None:
                await asyncio.gather(*(p.drained() for p in run.procs))
                ended = logbook.ending(outcome=run.outcome, exit_codes=[p.exit_code for p in run.procs], stop_reason=run.stop_reason)
                run.output.close()  # here, where its writes happen; the rest in a thread
                await asyncio.to_thread(self._logs.end, run.output, ended)
