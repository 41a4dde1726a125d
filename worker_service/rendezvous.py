"""A gang's rendezvous on a real worker: the gang's first worker picks an address and port for
its ranks to meet at and tells the others (GangRendezvous); they wait for it, up to a timeout.
An answer that comes before its lease is kept until the lease asks for it.
"""

from __future__ import annotations

import asyncio
import socket

from common.bus import Bus
from common.messages import ExtendLease, GangRendezvous, RunJobs
from worker_service import core
from worker_service.core import Rendezvous, WorkerConfig

KEPT_UNCLAIMED = 1024  # answers kept for leases not seen yet


class GangMeeting:
    """The rendezvous this worker led, heard or waits for."""

    def __init__(self, config: WorkerConfig, timeout_s: float) -> None:
        self.config = config
        self._timeout_s = timeout_s
        self._rendezvous: dict[str, Rendezvous] = {}  # lease id -> heard before its lease asked
        self._waiters: dict[str, asyncio.Future[Rendezvous]] = {}
        self.bus: Bus | None = None

    async def meet(self, command: RunJobs | ExtendLease) -> Rendezvous:
        """The gang's first worker picks a port and tells the others; they wait for it."""
        if core.is_gang_leader(command, self.config.worker_id):
            rendezvous = Rendezvous(self.config.advertise_host, free_port())
            assert self.bus is not None
            for peer in command.gang_workers[1:]:
                await self.bus.publish(GangRendezvous(
                    peer, command.lease_id, command.round_id, command.epoch, rendezvous.master_addr,
                    rendezvous.master_port, from_worker=self.config.worker_id,
                ))
            return rendezvous
        known = self._rendezvous.pop(command.lease_id, None)
        if known is not None:
            return known
        waiter = self._waiters.setdefault(command.lease_id, asyncio.get_running_loop().create_future())
        try:
            return await asyncio.wait_for(waiter, self._timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(
                f"no rendezvous from {command.gang_workers[0]} within {self._timeout_s:g} s"
            ) from None
        finally:
            self._waiters.pop(command.lease_id, None)

    def heard(self, message: GangRendezvous) -> None:
        rendezvous = Rendezvous(message.master_addr, message.master_port)
        waiter = self._waiters.get(message.lease_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(rendezvous)
        else:
            self._rendezvous[message.lease_id] = rendezvous
            if len(self._rendezvous) > KEPT_UNCLAIMED:  # never claimed: forget the oldest
                self._rendezvous.pop(next(iter(self._rendezvous)))


def free_port() -> int:
    """A TCP port free now (the gang's rank 0 binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])
