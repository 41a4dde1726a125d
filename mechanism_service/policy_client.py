"""The policy client: the allocation request in flight, its answer, the degraded state (the last
allocation kept while no answer comes, said once when it begins and once when it ends), and the
retries while no policy replica is there. No single job can stop a solve (issue 9): when the
policy refuses the problem because of particular jobs, they are set aside and the rest is solved
again at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from common.bus import Delivery
from common.codec import DEFAULT_CODEC
from common.errors import UnroutableError
from common.messages import AllocationComputed, AllocationFailed, SolveStatus
from common.messages.base import Message
from common.topics import POLICY_REQUEST_QUEUE
from mechanism_service.config import MechanismConfig
from mechanism_service.core.allocation import apply_allocation
from mechanism_service.core.memory import MemoryCell
from mechanism_service.core.model import MechanismState
from mechanism_service.core.policy_input import allocation_fractions, allocation_request
from mechanism_service.journaling import MechanismJournal
from mechanism_service.outbox import Outbox

NO_DEADLINE_S = 1e18  # finite (the wire refuses infinities), and far beyond any clock
# Solves at one boundary: each one after the first sets aside at least one job the policy refused
# the problem because of, so this bounds a boundary's time, not the jobs that can be set aside
# (the rest go at the next boundary).
SOLVES_PER_BOUNDARY = 8
NO_ANSWER_GRACE_S = 2.0  # a policy replica answers in milliseconds; after this, ask who listens

SetAside = Callable[[MechanismState, list[str], str, float], Awaitable[None]]


class PolicyClient:
    def __init__(
        self, cell: MemoryCell, config: MechanismConfig, *, journal: MechanismJournal, outbox: Outbox,
        log: structlog.stdlib.BoundLogger,
    ) -> None:
        self._cell = cell
        self._config = config
        self._journal = journal
        self._outbox = outbox
        self.log = log
        self._pending: tuple[str, asyncio.Future[Message]] | None = None  # the request in flight

    async def on_allocation(self, d: Delivery) -> None:
        reply = d.message
        pending = self._pending
        if pending is None or getattr(reply, "request_id", None) != pending[0] or pending[1].done():
            return  # an answer to a request we gave up on
        self._journal.record("allocation", d)
        await self._journal.durable()
        if not pending[1].done():
            pending[1].set_result(reply)

    def replayed(self, message: Message, body: bytes) -> None:
        """An answer journaled before a restart: taken when its request is asked again."""
        self._cell.memory.allocations[getattr(message, "request_id", "")] = body

    async def reallocate(self, state: MechanismState, now_s: float, set_aside: SetAside) -> None:
        """Ask the policy for a new allocation and install it; jobs the policy refuses to solve
        with are set aside (``set_aside``) and the rest solved again at once. Any other failure
        keeps the last allocation for this round (degraded) and asks again at the next boundary."""
        config, memory = self._config, self._cell.memory
        for attempt in range(SOLVES_PER_BOUNDARY):
            request_id = f"{config.seed}-{state.resets}" + (f".{attempt}" if attempt else "")
            reply = await self._ask(state, now_s, request_id)
            self._note_solve(reply, request_id, now_s)
            if isinstance(reply, AllocationComputed) and reply.status in (SolveStatus.OPTIMAL, SolveStatus.OPTIMAL_INACCURATE):
                apply_allocation(
                    state, allocation_fractions(reply), reply.isolated_throughputs_steps_per_s or {}, config.settings,
                    reply.policy_state, reply.valid_for_s,
                )
                memory.solve_times_s.append(reply.solve_time_s)
                memory.observations.last_solve_s = reply.solve_time_s
                return
            reason = getattr(reply, "reason", "") or ""
            if reply is not None:
                self.log.warning("allocation_failed", request_id=request_id, reason=reason)
            refused = [j for j in getattr(reply, "refused_job_ids", ()) if j in state.jobs.index_of]
            if not refused:
                break
            await set_aside(state, refused, f"the policy cannot allocate with this job: {reason}", now_s)
            if not state.jobs:
                state.needs_allocation = False
                return
        # Degraded: keep the last allocation this round, and ask again at the next boundary.
        state.needs_allocation = True

    async def _ask(self, state: MechanismState, now_s: float, request_id: str) -> Message | None:
        """The policy's answer to this state, or None when none came (said in the log)."""
        config = self._config
        settings = config.settings
        request = allocation_request(
            state,
            now_s,
            request_id=request_id,
            policy=config.policy,
            # A deadline compares the policy service's clock with ours: only wall time is shared.
            deadline_s=now_s + config.allocation_timeout_s if config.deadlines_on else NO_DEADLINE_S,
            preset=settings.preset,
            seed=config.seed if settings.preset == "gavel" else config.seed + state.resets,
            solver=config.solver,
            packing=settings.packing,
            rates=self._cell.rates,
        )
        replayed = self._cell.memory.allocations.pop(request_id, None)
        if replayed is not None:
            return DEFAULT_CODEC.decode(replayed).message  # answered before a restart
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending = (request_id, future)
        try:
            await self._send(request)
            return await self._await_reply(future, request_id)
        except asyncio.TimeoutError:
            self.log.warning(
                "allocation_unavailable", request_id=request_id, action="keep last allocation",
                error=f"no answer from a policy service within {config.allocation_timeout_s:g} s",
            )
        except Exception as e:  # noqa: BLE001 - degraded mode, said once
            self.log.warning("allocation_unavailable", request_id=request_id, error=repr(e), action="keep last allocation")
        finally:
            self._pending = None
        return None

    def _note_solve(self, reply: Message | None, request_id: str, now_s: float) -> None:
        """What `gavel cluster` shows as the last solve, and whether the allocation in force is
        kept past its time (degraded: said once when it begins and once when it ends)."""
        obs = self._cell.memory.observations
        if isinstance(reply, AllocationComputed):
            status, error = str(reply.status), reply.reason
        elif isinstance(reply, AllocationFailed):
            status, error = ("expired" if reply.expired else "failed"), reply.reason
        else:
            status, error = "unavailable", "no answer from a policy service"
        if status in (SolveStatus.OPTIMAL, SolveStatus.OPTIMAL_INACCURATE):
            if obs.degraded_since_s is not None:
                self.log.info("allocation_restored", degraded_s=now_s - obs.degraded_since_s, request_id=request_id)
            obs.degraded_since_s = None
            obs.allocation_solved_at_s = now_s
        elif obs.degraded_since_s is None and not getattr(reply, "refused_job_ids", ()):
            # (a refusal because of particular jobs sets them aside and solves again at once)
            obs.degraded_since_s = now_s
            self.log.warning(
                "allocation_degraded", request_id=request_id, status=status, error=error,
                allocation_solved_at_s=obs.allocation_solved_at_s,
                action="keeping the last allocation; jobs it does not include run on the GPUs it leaves idle",
            )
        obs.last_solve = {
            "request_id": request_id, "at_s": now_s, "status": status, "error": error,
            "solve_time_s": getattr(reply, "solve_time_s", None),
            "refused_job_ids": list(getattr(reply, "refused_job_ids", ())),
        }

    async def _send(self, request: Message) -> None:
        """Publish an allocation request; while no policy service has ever attached (nothing
        is bound to receive it), say so and keep trying."""
        waited_s = 0.0
        while True:
            try:
                await self._outbox.bus.publish(request)
                if waited_s:
                    self.log.info("policy_service_found", waited_s=waited_s)
                return
            except UnroutableError:
                if waited_s == 0.0 or waited_s % 30.0 < 1.0:
                    self.log.warning("policy_service_missing", waited_s=waited_s, action="waiting for a policy replica")
                if not self._config.lockstep and waited_s >= self._config.allocation_timeout_s:
                    raise
                await asyncio.sleep(1.0)  # real time: a process has to start
                waited_s += 1.0

    async def _await_reply(self, future: asyncio.Future[Message], request_id: str) -> Message:
        """Wait for the policy service. In lockstep and virtual time a round never passes without
        an answer; on a live cluster the round goes on with the last allocation. A request to a
        queue that exists but that nobody consumes (every replica stopped) waits there silently:
        when no answer came within a grace, ask the broker, and say so at once if so (asking
        on every request would cost a broker round trip on the common, prompt path)."""
        # asyncio.wait, not wait_for: Python 3.11's wait_for swallows a cancellation that comes as
        # the answer does (a mechanism stopped then kept running, and its stop() never returned).
        lockstep, timeout_s = self._config.lockstep, self._config.allocation_timeout_s
        grace_s = NO_ANSWER_GRACE_S if lockstep else min(NO_ANSWER_GRACE_S, timeout_s)
        if (await asyncio.wait({future}, timeout=grace_s))[0]:
            return future.result()
        await self._say_if_nobody_listens()
        if lockstep:
            waiting_s = grace_s
            while not (await asyncio.wait({future}, timeout=10.0))[0]:
                waiting_s += 10.0
                self.log.warning("waiting_for_policy_service", request_id=request_id, waited_s=waiting_s)
            return future.result()
        if (await asyncio.wait({future}, timeout=timeout_s - grace_s))[0]:
            return future.result()
        future.cancel()
        raise asyncio.TimeoutError

    async def _say_if_nobody_listens(self) -> None:
        if await self._outbox.bus.consumer_count(POLICY_REQUEST_QUEUE) == 0:
            self.log.warning(
                "policy_service_missing", queue=POLICY_REQUEST_QUEUE,
                reason="the policy queue has no consumer: is `gavel serve policy` running?",
                action=f"the request waits there; keeping the last allocation after {self._config.allocation_timeout_s:g} s",
            )
