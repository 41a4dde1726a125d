"""How tests/data/mechanism-snapshot/journal.sqlite was made (issue 24: "a snapshot journaled by
the code before this change loads and runs on after it"): run once, on the code of commit 732af1f
(before the mechanism became collaborators), never again. Kept so that the file's contents are
explained, not to be regenerated: a journal written by newer code proves nothing about old ones.

A mechanism with a file journal on the in-memory bus in virtual time (packed max-min on v100,
p100 and k80, two GPUs each, elastic), with jobs in every state a snapshot can hold: completed
and failed ones retained, running ones with leases out, one cancelled while it runs (it leaves
at the next boundary), one cancelled before it arrived, one refused on receipt, one held (a gang
no type here can hold), one still to arrive, one with its own command and working directory, one
with its submitter's estimate and owner. It stops after its sixth boundary: the snapshot is that
boundary's (its leases out), and the journal holds their reports after it.

    PYTHONPATH=<a checkout of 732af1f> python tests/data/mechanism-snapshot/make.py OUT.sqlite

(Its imports were since rewritten to today's module paths when the runtime moved into common/;
on 732af1f they were services.bus.memory, services.host and services.journal. It builds the
mechanism with the keyword arguments of then, before MechanismConfig.)
"""

from __future__ import annotations

import asyncio
import sys

from common.messages import CancelJob, JobSpec, JobSubmitted
from mechanism_service.core.retention import Retention
from mechanism_service.core.rounds import type_shuffler
from mechanism_service.core.settings import preset
from mechanism_service.service import MechanismService
from policy_service.service import PolicyService, shipped_context
from common.transport.memory import InMemoryBroker, InMemoryBus
from common.host import ServiceHost
from common.journal import Journal
from sim.clock import VirtualClock
from sim.fleet import SimulatedFleet

POLICY = "max_min_fairness_packed"
CLUSTER = {"v100": 2, "p100": 2, "k80": 2}
RETENTION = Retention(finished_s=None, finished_jobs=100, rounds=100, lost_workers=100)
STOP_AFTER_ROUNDS = 6


def jobs() -> list[JobSubmitted]:
    def job(i: int, job_type: str, steps: int, **fields: object) -> JobSpec:
        return JobSpec(f"job-{i}", job_type, total_steps=steps, **fields)  # type: ignore[arg-type]

    return [
        JobSubmitted(job(0, "ResNet-18 (batch size 32)", 2_000), submitted_by="alice"),  # completes early
        JobSubmitted(job(1, "ResNet-50 (batch size 64)", 400_000)),  # runs on
        JobSubmitted(job(2, "Transformer (batch size 64)", 300_000, command="python train.py", working_dir="/srv/job-2")),
        JobSubmitted(job(3, "LM (batch size 20)", 300_000, throughput_estimate_steps_per_s={"v100": 9.0})),
        JobSubmitted(job(4, "A3C", 250_000)),  # cancelled while it runs
        JobSubmitted(job(5, "CycleGAN", 1_500)),  # completes
        JobSubmitted(job(6, "ResNet-50 (batch size 64)", 100_000, scale_factor=4)),  # held: no type has 4 GPUs
        JobSubmitted(job(7, "Recommendation (batch size 512)", 50_000), arrival_offset_s=1e6),  # still to arrive
        JobSubmitted(job(8, "Recommendation (batch size 512)", 50_000), arrival_offset_s=2e6),  # cancelled before it arrives
        JobSubmitted(job(9, "ResNet-18 (batch size 32)", 0)),  # refused on receipt: no steps
        JobSubmitted(job(10, "ResNet-18 (batch size 32)", 600_000, priority_weight=2.0, entity="team-a")),
    ]


class Submitter:
    """Submits the jobs once the fleet registered, then the cancels."""

    name = "submitter"

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    async def start(self, bus) -> None:  # noqa: ANN001
        async def run() -> None:
            await self._clock.sleep_until(1.0)
            for message in jobs():
                await bus.publish(message)
            await self._clock.sleep_until(10.0)
            await bus.publish(CancelJob("job-8", reason="no longer needed"))
            await self._clock.sleep_until(4 * 360.0 + 100.0)
            await bus.publish(CancelJob("job-4", reason="the user stopped it"))

        self._task = asyncio.get_running_loop().create_task(run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


async def main(path: str) -> None:
    context = shipped_context()
    table = context.table
    assert table is not None
    broker = InMemoryBroker()
    clock = VirtualClock(broker, start_s=0.0)
    settings = preset("default", POLICY)
    mechanism = MechanismService(
        clock=clock, settings=settings, policy=POLICY, table=table, shuffle=type_shuffler("default", 0), seed=0,
        journal=Journal(path), elastic_types=table.accelerator_types, retention=RETENTION,
        stop_when=lambda state: mechanism.memory.round_id >= STOP_AFTER_ROUNDS,
        more_arrivals=lambda: True,
    )
    fleet = SimulatedFleet(clock=clock, table=table, cluster=CLUSTER, gpus_per_server=1, seed=0)
    policy = PolicyService(clock=clock, context=context, solving="inline")
    host = ServiceHost(InMemoryBus(broker, clock=clock, source="sim"), [policy, mechanism, fleet, Submitter(clock)])
    await host.start()
    try:
        await clock.run_until(lambda: mechanism.stopped.is_set())
    finally:
        await host.stop()
    memory = mechanism.memory
    state = memory.state
    assert state is not None
    print(
        "round", memory.round_id, "t", memory.last_boundary_s, "active", sorted(j.job_id for j in state.jobs.values()),
        "completed", [(j.job_id, j.steps_done) for j in state.completed], "submitted", [j.job_id for j in memory.submitted],
        "held", [j.job_id for j, _ in memory.held], "cancelled", sorted(memory.observations.cancelled),
        "rejected", sorted(memory.observations.rejected), "ended", list(memory.ended_at_s), "launch", memory.launch,
        "owners", sorted(memory.owners),
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
