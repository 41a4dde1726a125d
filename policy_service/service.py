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
import time
from importlib import resources
from typing import Literal

import structlog

from common.bus import Bus, Delivery
from common.children import die_with_parent
from common.clock import Clock
from common.messages import AllocationComputed, AllocationFailed, AllocationRequested
from common.metrics import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    build_info,
    registry_or_private,
)
from common.plugins import installed
from common.throughputs import throughput_table_from_json
from common.topics import POLICY_REQUEST_QUEUE
from policy_service.answer import SolveContext, answer
from policy_service.core import prices_from_json
from policy_service.core.catalog import policy_names

log = structlog.get_logger("gavel.policy")

REQUEST_QUEUE = POLICY_REQUEST_QUEUE
Solving = Literal["inline", "process"]
SOLVE_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, float("inf"))


class PolicyMetrics:
    """docs/metrics.md, "Policy". A request's policy is a label only when it is a policy this
    service knows: a request is any publisher's, and a label set must stay bounded."""

    def __init__(self, registry: CollectorRegistry | None, plugins: tuple[str, ...] = ()) -> None:
        r = registry_or_private(registry)
        build_info(r, "policy")  # "policy" whatever the replica's name: one series per kind of service
        # the built-ins, the plug-ins it was started with and those installed: a bounded set
        self._known = frozenset(policy_names()) | frozenset(plugins) | frozenset(installed("policy"))
        self.solve_duration = Histogram(
            "gavel_policy_solve_duration_seconds", "wall time of a solve", ("policy",), buckets=SOLVE_BUCKETS_S, registry=r
        )
        self.solves = Counter("gavel_policy_solves", "solves, per outcome: ok, failed, expired", ("policy", "outcome"), registry=r)
        self.in_flight = Gauge("gavel_policy_requests_in_flight", "requests taken and not answered", registry=r)

    def policy(self, name: str) -> str:
        return name if name in self._known else "unknown"


def shipped_context() -> SolveContext:
    """The Gavel throughput table and the prices shipped with the project (common/data)."""
    data = resources.files("common") / "data"
    table = throughput_table_from_json(json.loads((data / "simulation_throughputs.json").read_text()))
    prices = prices_from_json(json.loads((data / "prices.json").read_text()))
    return SolveContext(table, prices)


# -- the worker process: the context is loaded once, then each request is a pure call -----------

_worker_context: SolveContext | None = None


def _init_worker(context: SolveContext) -> None:
    die_with_parent()  # a replica killed with SIGKILL leaves no solver behind
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
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.name = name
        self._context = context if context is not None else shipped_context()
        self.metrics = PolicyMetrics(registry, self._context.plugins)
        self._clock = clock
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
        metrics = self.metrics
        policy = metrics.policy(request.policy)
        metrics.in_flight.inc()
        try:
            await self._answer(delivery, request, log_, policy)
        finally:
            metrics.in_flight.dec()

    async def _answer(self, delivery: Delivery, request: AllocationRequested, log_: structlog.stdlib.BoundLogger, policy: str) -> None:
        assert self._bus is not None
        # 1. expired requests are answered, not solved
        late_s = self._clock.now_s() - request.deadline_s
        if late_s > 0:
            reply: AllocationComputed | AllocationFailed = AllocationFailed(
                request.request_id, request.policy, f"expired: received {late_s:.3f} s after its deadline", expired=True
            )
            log_.warning("allocation_request_expired", late_s=round(late_s, 3))
            self.metrics.solves.labels(policy, "expired").inc()
        else:
            # 2. solve off the event loop
            began = time.perf_counter()
            reply = await self._solve(request)
            self.metrics.solve_duration.labels(policy).observe(time.perf_counter() - began)
            self.metrics.solves.labels(policy, "ok" if isinstance(reply, AllocationComputed) else "failed").inc()
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

