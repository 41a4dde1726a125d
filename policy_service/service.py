"""The policy service: AllocationRequested in, AllocationComputed or AllocationFailed out.

Stateless: every request carries its whole problem, so replicas share one queue
(``policy.allocation-requests``, prefetch 1: a replica takes the next request only when it is
free) and a logged request can be replayed. Handling a request, as numbered steps:

1. a request received after its deadline is answered as expired, not solved (the mechanism has
   moved on; solving it would only delay the next one);
2. the problem is solved off the event loop (``solving="process"``: a worker process, so the
   loop keeps answering while a 2048-job problem solves; ``"inline"`` for the simulator, where
   determinism and no extra process matter more);
3. the answer is published with the request's message id as its correlation id; bad input
   (unknown policy, unknown job type, NaN throughputs, ...) is answered with AllocationFailed and
   the reason. A crashed worker process is replaced and the request answered as failed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import multiprocessing
from importlib import resources
from typing import Literal

import structlog

from common.bus import Bus, Delivery
from common.clock import Clock
from common.messages import AllocationComputed, AllocationFailed, AllocationRequested
from common.throughputs import throughput_table_from_json
from common.topics import POLICY_REQUEST_QUEUE
from policy_service.answer import SolveContext, answer
from policy_service.core import prices_from_json

log = structlog.get_logger("gavel.policy")

REQUEST_QUEUE = POLICY_REQUEST_QUEUE
Solving = Literal["inline", "process"]


def shipped_context() -> SolveContext:
    """The Gavel throughput table and the prices shipped with the project (common/data)."""
    data = resources.files("common") / "data"
    table = throughput_table_from_json(json.loads((data / "simulation_throughputs.json").read_text()))
    prices = prices_from_json(json.loads((data / "prices.json").read_text()))
    return SolveContext(table, prices)


# -- the worker process: the context is loaded once, then each request is a pure call -----------

_worker_context: SolveContext | None = None


def _init_worker(context: SolveContext) -> None:
    global _worker_context
    _worker_context = context


def _answer_in_worker(request: AllocationRequested) -> AllocationComputed | AllocationFailed:
    assert _worker_context is not None, "worker not initialised"
    return answer(request, _worker_context)


class PolicyService:
    def __init__(
        self,
        *,
        clock: Clock,
        context: SolveContext | None = None,
        solving: Solving = "process",
        name: str = "policy",
    ) -> None:
        self.name = name
        self._clock = clock
        self._context = context if context is not None else shipped_context()
        self._solving = solving
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._bus: Bus | None = None
        self._log = log.bind(replica=name)

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        if self._solving == "process":
            self._pool = self._new_pool()
        await bus.subscribe(REQUEST_QUEUE, [AllocationRequested.ROUTING_KEY], self.on_request, prefetch=1)

    async def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def _new_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        # spawn, not fork: forking a process that runs an event loop and broker I/O threads is
        # unsafe; the worker imports the core once and keeps the table for every request.
        return concurrent.futures.ProcessPoolExecutor(
            max_workers=1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(self._context,),
        )

    async def on_request(self, delivery: Delivery) -> None:
        request = delivery.message
        if not isinstance(request, AllocationRequested):
            raise TypeError(f"{type(request).__name__} arrived on {delivery.routing_key}")
        assert self._bus is not None
        log_ = self._log.bind(request_id=request.request_id, policy=request.policy, jobs=len(request.problem.jobs))
        # 1. expired requests are answered, not solved
        late_s = self._clock.now_s() - request.deadline_s
        if late_s > 0:
            reply: AllocationComputed | AllocationFailed = AllocationFailed(
                request.request_id, request.policy, f"expired: received {late_s:.3f} s after its deadline", expired=True
            )
            log_.warning("allocation_request_expired", late_s=round(late_s, 3))
        else:
            # 2. solve off the event loop
            reply = await self._solve(request)
            if isinstance(reply, AllocationComputed):
                log_.info("allocation_computed", status=str(reply.status), solve_time_s=round(reply.solve_time_s, 4))
            else:
                log_.warning("allocation_failed", reason=reply.reason)
        # 3. answer, correlated with the request
        await self._bus.publish(reply, correlation_id=delivery.envelope.message_id)

    async def _solve(self, request: AllocationRequested) -> AllocationComputed | AllocationFailed:
        try:
            if self._pool is None:
                return answer(request, self._context)
            return await asyncio.get_running_loop().run_in_executor(self._pool, _answer_in_worker, request)
        except concurrent.futures.process.BrokenProcessPool:
            # The worker died (out of memory, killed): start a new one for the next request.
            self._pool = self._new_pool()
            return AllocationFailed(request.request_id, request.policy, "the solver process died; retry the request")
        except Exception as e:  # a bug in a policy must cost one answer, not the service
            self._log.exception("solver_crashed", request_id=request.request_id)
            return AllocationFailed(request.request_id, request.policy, f"solver crashed: {type(e).__name__}: {e}")

