"""Service crashes in a simulation (issue 13): the mechanism dying at a boundary's crash points,
the policy service dying in the middle of a solve; each replaced by a new instance, as a process
supervisor would.

MechanismSupervisor: the mechanism calls its crash point before and after it journals a boundary
(mechanism_service/service.py ``crash_point``); raising there ends its round loop, as a SIGKILL
would. The driver then calls ``restart()``: the dead instance's subscriptions are cancelled (what
it had prefetched goes back to its queues), it is stopped, and a new MechanismService opens the
same journal and recovers from it (snapshot, replayed inputs, the last boundary's commands
republished under a new epoch).

PolicySupervisor: its replica, at a scheduled request, dies mid-solve: the handler never returns,
its subscription is cancelled at once, so the unacknowledged request goes back to the queue
(redelivered, as RabbitMQ does when a consumer's channel dies) and a new replica answers it.
"""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Callable

import structlog

from common.bus import Bus, Delivery
from common.clock import Clock
from common.host import ServiceBus
from common.journal import Journal
from mechanism_service.service import MechanismService
from policy_service.answer import SolveContext
from policy_service.service import PolicyService
from sim.faults import FaultLog, InjectedCrash, MechanismCrash, PolicyCrash

log = structlog.get_logger("gavel.sim.faults")


class MechanismCrashes:
    """The crash point the mechanism calls: raises at the scheduled points, each once."""

    def __init__(self, clock: Clock, crashes: tuple[MechanismCrash, ...], log_: FaultLog) -> None:
        self._clock = clock
        self._pending = list(crashes)
        self._log = log_

    def __call__(self, point: str) -> None:
        now_s = self._clock.now_s()
        due = next((c for c in self._pending if c.at_s <= now_s), None)
        if due is None or due.point != point:
            return
        self._pending.remove(due)
        self._log.injected("mechanism-crash", now_s, point)
        raise InjectedCrash(f"injected fault: the mechanism dies at {point} (t={now_s:.1f} s)")


class MechanismSupervisor:
    """One mechanism at a time on the host's bus; ``current`` is the live one."""

    name = "mechanism"

    def __init__(self, make: Callable[[Journal | None], MechanismService], journal: Journal | None) -> None:
        self._make = make
        self._first_journal = journal  # the first incarnation's; each next one opens the same file
        self._journal_path: pathlib.Path | None = None if journal is None else journal.path
        self._bus: Bus | None = None
        self._view: ServiceBus | None = None
        self.current: MechanismService | None = None
        self.restarts = 0

    @property
    def crashed(self) -> bool:
        return self.current is not None and self.current.crashed.is_set()

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        await self._start_one()

    async def _start_one(self) -> None:
        assert self._bus is not None
        journal, self._first_journal = self._first_journal, None
        if journal is None and self._journal_path is not None:
            journal = Journal(self._journal_path)
        self.current = self._make(journal)
        self._view = ServiceBus(self._bus, self.name)  # its own subscriptions, to cancel when it dies
        await self.current.start(self._view)

    async def restart(self) -> None:
        assert self._view is not None and self.current is not None
        if self._journal_path is None:
            raise RuntimeError("a mechanism without a journal cannot be restarted")
        await self._view.cancel_subscriptions()
        await self.current.stop()  # its timers; closes its journal connection
        self.restarts += 1
        log.warning("mechanism_restarting", restarts=self.restarts, journal=str(self._journal_path))
        await self._start_one()

    async def stop(self) -> None:
        if self._view is not None:
            await self._view.cancel_subscriptions()
        if self.current is not None:
            await self.current.stop()


class _CrashingPolicy(PolicyService):
    def __init__(self, *, supervisor: PolicySupervisor, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._supervisor = supervisor

    async def on_request(self, delivery: Delivery) -> None:
        if delivery.redelivered:
            self._supervisor.redelivered += 1  # what a dead replica had taken, back from the broker
        if self._supervisor.crash_due():
            # dies mid-solve: nothing answers, nothing acknowledges; the supervisor cancels this
            # handler with the subscription, so the delivery goes back to the queue
            asyncio.get_running_loop().create_task(self._supervisor.replace(self))
            await asyncio.get_running_loop().create_future()
        await super().on_request(delivery)


class PolicySupervisor:
    name = "policy"

    def __init__(self, *, clock: Clock, context: SolveContext, crashes: tuple[PolicyCrash, ...], log_: FaultLog) -> None:
        self._clock = clock
        self._context = context
        self._pending = list(crashes)
        self._log = log_
        self._bus: Bus | None = None
        self._view: ServiceBus | None = None
        self.current: PolicyService | None = None
        self.restarts = 0
        self.redelivered = 0

    def crash_due(self) -> bool:
        now_s = self._clock.now_s()
        due = next((c for c in self._pending if c.at_s <= now_s), None)
        if due is None:
            return False
        self._pending.remove(due)
        self._log.injected("policy-crash", now_s, "mid-solve")
        return True

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        await self._start_one()

    async def _start_one(self) -> None:
        assert self._bus is not None
        self.current = _CrashingPolicy(supervisor=self, clock=self._clock, context=self._context, solving="inline")
        self._view = ServiceBus(self._bus, self.name)
        await self.current.start(self._view)

    async def replace(self, dead: PolicyService) -> None:
        if dead is not self.current or self._view is None:
            return
        # timeout 0: the dying handler is cancelled, not waited for (its process is gone)
        await self._view.cancel_subscriptions(timeout_s=0.0)
        await dead.stop()
        self.restarts += 1
        log.warning("policy_restarting", restarts=self.restarts)
        await self._start_one()

    async def stop(self) -> None:
        if self._view is not None:
            await self._view.cancel_subscriptions()
        if self.current is not None:
            await self.current.stop()
