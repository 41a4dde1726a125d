"""The round loop's waits: for the running round's leases to report (or its timeout), for work when
idle, for a crashed process's round to run its length, and for a lockstep replay to be ready. The
loop is woken (``wake``) by whatever may end a wait: a submission, a report, a seal, a join, a
loss, a cancel."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from common.clock import Clock
from common.errors import ServiceError
from mechanism_service.config import MechanismConfig
from mechanism_service.core import leases
from mechanism_service.core.memory import MemoryCell
from mechanism_service.core.rounds import force_reset_when_idle
from mechanism_service.workers import WorkerPool


class RoundWaits:
    def __init__(
        self, cell: MemoryCell, config: MechanismConfig, clock: Clock, pool: WorkerPool, wake: asyncio.Event,
        log: structlog.stdlib.BoundLogger,
    ) -> None:
        self._cell = cell
        self._config = config
        self._clock = clock
        self._pool = pool
        self._wake = wake
        self.log = log
        self._more_arrivals = config.more_arrivals or (lambda: False)
        self.idle_boundaries = 0  # boundaries in a row that ran nothing while jobs waited

    async def until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            self._wake.clear()
            await self._wake.wait()

    def ready_for_lockstep(self) -> bool:
        """A lockstep replay starts when the whole trace is in and the whole fleet registered."""
        memory = self._cell.memory
        gpus = sum(g for servers in memory.servers.values() for _, g in servers)
        enough_gpus = self._config.expected_gpus is None or gpus >= self._config.expected_gpus
        return memory.state is not None or (memory.intake.all_sealed_in() and enough_gpus)

    def round_complete(self) -> bool:
        return leases.round_complete(self._cell.memory)

    async def for_round(self) -> None:
        """Until every lease of the running round reported, or the round's timeout passed (then
        its missing leases count as no progress)."""
        if self._config.round_timeout_s is None:
            await self.until(self.round_complete)
            return
        waiting = asyncio.ensure_future(self.until(self.round_complete))
        try:
            # asyncio.wait: wait_for would swallow a stop that comes as the round completes
            done, _ = await asyncio.wait({waiting}, timeout=self._config.round_timeout_s)
        finally:
            waiting.cancel()
        if not done:
            missing = leases.unreported(self._cell.memory)
            self.log.warning("leases_unreported", leases=missing[:10], count=len(missing), action="count as no progress")

    async def out_a_crash(self, crashed: list[str]) -> None:
        """A live round that ends early because a job's process crashed runs its full length all
        the same: the job's next attempt comes a round later (a command that fails at once was
        otherwise tried --max-failed-attempts times within a second, and failed before anyone
        could look). The simulator's rounds are left as they are."""
        config = self._config
        if config.round_timeout_s is None or config.lockstep:
            return
        left_s = self._cell.memory.round_clock.dispatched_at_s + config.settings.round_s - self._clock.now_s()
        if crashed and left_s > 0:
            self.log.info("round_runs_out_after_crash", jobs=crashed[:10], wait_s=round(left_s, 3))
            await self._clock.sleep(left_s)

    async def when_idle(self) -> None:
        """Nothing runs: wait for an arrival that is due (or for time to reach the next one), for
        a worker that may fit a held job, or re-solve once at once when jobs wait and nothing
        more will arrive; a simulation in which jobs can never run stops, saying why."""
        memory, config = self._cell.memory, self._config
        lockstep = config.lockstep
        future = [j.arrival_s for j in memory.submitted if j.arrival_s > self._clock.now_s()]
        if lockstep and future:
            self._clock.advance_to(min(future))  # type: ignore[attr-defined]
            return
        if len(future) < len(memory.submitted):
            return  # jobs due now
        if memory.held and self._pool.cluster_grew:
            return  # a worker joined: held jobs may fit now
        if memory.queued and not (memory.state is not None and memory.state.jobs):
            # the admission queue waits while nothing is scheduled: its policy decides at once; one
            # that still admits none (a plug-in) stops a simulation, as jobs that can never run do
            self.idle_boundaries += 1
            if self.idle_boundaries <= 2:
                return
            if config.round_timeout_s is None and not future and not self._more_arrivals():
                raise ServiceError(
                    f"t={self._clock.now_s():.1f} s: {len(memory.queued)} jobs wait in the admission queue with "
                    f"nothing scheduled, and the admission policy admits none (first: {memory.queued[0][0].job_id})"
                )
        if future:
            # Submitted with an arrival still ahead (a replayed trace, a skewed client clock):
            # wait for it, or for anything else that comes meanwhile.
            await self.sleep_or_wake(min(future) - self._clock.now_s())
            return
        more = self._more_arrivals() or (lockstep and bool(future))
        if memory.state is not None and memory.state.jobs and not more:
            self.idle_boundaries += 1
            if self.idle_boundaries == 1:
                force_reset_when_idle(memory.state)  # re-solve once, at once
                return
            if config.round_timeout_s is not None:
                # A live cluster: still nothing can run (no worker fits, no allocation yet). Wait
                # for something to change, or a round, rather than spin.
                await self.sleep_or_wake(config.settings.round_s)
                force_reset_when_idle(memory.state)
                return
            if self.idle_boundaries > 3:
                stuck = ", ".join(j.job_id for j in list(memory.state.jobs.values())[:5])
                failed = (memory.observations.last_solve or {}).get("error")
                if failed:  # not the cluster's fault: say what the policy said (a solver not installed)
                    raise ServiceError(f"t={self._clock.now_s():.1f} s: jobs {stuck} were never scheduled: the policy failed: {failed}")
                raise ServiceError(f"t={self._clock.now_s():.1f} s: jobs {stuck} can never be scheduled on this cluster")
            force_reset_when_idle(memory.state)
            return
        await self.until(lambda: bool(memory.submitted) or (bool(memory.held) and self._pool.cluster_grew))

    async def sleep_or_wake(self, duration_s: float) -> None:
        """Wait ``duration_s`` on the clock, or less if an input arrives meanwhile."""
        self._wake.clear()
        sleeper = asyncio.ensure_future(self._clock.sleep(duration_s))
        waker = asyncio.ensure_future(self._wake.wait())
        await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        for task in (sleeper, waker):
            task.cancel()
