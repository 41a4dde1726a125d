"""A snapshot journaled by the code before the mechanism became collaborators (issue 24) loads and
runs on after it: tests/data/mechanism-snapshot/journal.sqlite, made once by make.py beside it on
commit 732af1f. Its memory pickles classes by the module paths of then
(mechanism_service.service.Memory and Lease, mechanism_service.core.model's ledgers,
mechanism_service.core.reducers.NewJob): they must keep resolving."""

from __future__ import annotations

import pathlib
import shutil

from common.messages import JobCompleted
from mechanism_service.core.invariants import check
from mechanism_service.core.model import MechanismState
from mechanism_service.core.retention import Retention
from mechanism_service.core.rounds import type_shuffler
from mechanism_service.core.settings import preset
from mechanism_service.config import MechanismConfig
from mechanism_service.service import MechanismService
from policy_service.service import PolicyService, shipped_context
from common.transport.memory import InMemoryBroker, InMemoryBus
from common.host import ServiceHost
from common.journal import Journal, read_events
from sim.clock import VirtualClock
from sim.fleet import SimulatedFleet

SNAPSHOT = pathlib.Path(__file__).parents[1] / "data" / "mechanism-snapshot" / "journal.sqlite"
POLICY = "max_min_fairness_packed"  # as make.py ran it
CLUSTER = {"v100": 2, "p100": 2, "k80": 2}
RUNNING = ["job-1", "job-2", "job-3", "job-10"]
ENDED = ["job-9", "job-8", "job-0", "job-5", "job-4"]  # refused, cancelled waiting, completed x2, cancelled running


async def test_a_snapshot_journaled_before_the_collaborators_loads_and_runs(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "mechanism.sqlite"
    shutil.copy(SNAPSHOT, path)  # a start appends to its journal
    context = shipped_context()
    table = context.table
    assert table is not None
    broker = InMemoryBroker()
    clock = VirtualClock(broker, start_s=1801.0)  # the snapshot's last boundary was at ~1,801 s
    completions: list[str] = []

    def stop_when(state: MechanismState) -> bool:
        return {"job-7", *RUNNING} <= {j.job_id for j in state.completed}

    # What the old snapshot held, loaded by today's code (its classes by their old paths)
    journal = Journal(path)
    memory, snapshot_seq = journal.load_snapshot()
    assert [kind for _, kind, _, _ in journal.events(after_seq=snapshot_seq)] == ["progress"] * 4  # its leases' reports
    journal.close()
    state = memory.state
    assert state is not None
    assert (memory.round_id, memory.epoch) == (6, 1)
    assert sorted(memory.expected) == ["5:1", "5:2", "5:3", "5:6"]
    assert [j.job_id for j in state.jobs.values()] == RUNNING
    assert [(j.job_id, j.steps_done) for j in state.completed] == [("job-0", 2000), ("job-5", 1500)]
    assert [j.job_id for j in memory.submitted] == ["job-7"]
    assert [j.job_id for j, _ in memory.held] == ["job-6"]
    assert sorted(memory.observations.cancelled) == ["job-4", "job-8"]
    assert list(memory.observations.rejected) == ["job-9"]
    assert list(memory.ended_at_s) == ENDED
    assert memory.launch == {"job-2": ("python train.py", "/srv/job-2")}
    assert memory.user_estimates == {"job-3": {"v100": 9.0}}
    assert sorted(memory.owners) == ["job-0"]
    assert len(state.entries) > len(state.jobs)  # pairs: the packed policy's ledgers came back as columns

    mechanism = MechanismService(
        MechanismConfig(
            settings=preset("default", POLICY), policy=POLICY, table=table, shuffle=type_shuffler("default", 0), seed=0,
            elastic_types=table.accelerator_types,
            retention=Retention(finished_s=None, finished_jobs=100, rounds=100, lost_workers=100),
            stop_when=stop_when, more_arrivals=lambda: True,
        ),
        clock=clock,
        journal=Journal(path),
    )

    class Listener:
        name = "listener"

        async def start(self, bus: InMemoryBus) -> None:
            async def on_end(d: object) -> None:
                completions.append(d.message.job_id)  # type: ignore[attr-defined]

            await bus.subscribe("test.completions", [JobCompleted.ROUTING_KEY], on_end)

        async def stop(self) -> None:
            pass

    fleet = SimulatedFleet(clock=clock, table=table, cluster=CLUSTER, gpus_per_server=1, seed=0)
    policy = PolicyService(clock=clock, context=context, solving="inline")
    host = ServiceHost(InMemoryBus(broker, clock=clock, source="sim"), [Listener(), policy, mechanism, fleet])
    await host.start()

    try:
        await clock.run_until(lambda: mechanism.stopped.is_set())
    finally:
        await host.stop()
    assert not mechanism.crashed.is_set(), mechanism.crash_reason
    state = mechanism.state
    assert state is not None
    done = {j.job_id: (j.steps_done, j.total_steps) for j in state.completed}
    assert {job_id: steps for job_id, (steps, _) in done.items()} == {
        job_id: total for job_id, (_, total) in done.items()
    }  # every job completed ran all its steps
    assert set(done) == {"job-0", "job-5", "job-7", *RUNNING}
    assert sorted(completions) == sorted(["job-7", *RUNNING])
    assert [j.job_id for j, _ in mechanism.memory.held] == ["job-6"]  # still no type with 4 GPUs
    assert mechanism.memory.round_id > 6 and mechanism.memory.epoch == 2
    report = check(read_events(path))  # the old records and the new ones, as one audit trail
    assert report.ok, report.violations
