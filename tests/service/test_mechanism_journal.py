"""The mechanism's journal in a live cluster, in one process on the in-memory bus: what a burst of
submissions costs it (snapshots), and what a restarted mechanism rebuilds from it."""

from __future__ import annotations

import asyncio
import pathlib
import sqlite3
import time

import pytest

from common.journal import Journal
from common.messages import JobSubmitted
from common.transport.memory import InMemoryBroker, InMemoryBus
from mechanism_service.clocks import ScaledClock
from mechanism_service.service import MechanismService
from tests.support.clock import SteppedClock
from tests.support.waiting import eventually
from tests.support.world import live_mechanism, spec


def snapshots_written(path: pathlib.Path) -> int:
    with sqlite3.connect(path) as db:
        row = db.execute("SELECT last_seq FROM snapshot WHERE id = 1").fetchone()
    return 0 if row is None else int(row[0])


def admitted(mechanism: MechanismService) -> dict[str, tuple[str, float]]:
    """Jobs whose arrival came: admitted (with their index), or held until a worker that can run
    them joins (these tests have no worker)."""
    state = mechanism.state
    if state is None:
        return {}
    admitted_jobs = {j.job_id: (f"admitted {j.index}", j.arrival_s) for j in state.jobs.values()}
    held = {j.job_id: (f"held {k}", j.arrival_s) for k, (j, _) in enumerate(mechanism.memory.held)}
    return admitted_jobs | held


async def submit(bus: InMemoryBus, clock: SteppedClock, jobs: range) -> None:
    for i in jobs:
        clock.t += 1.0  # each job reaches the mechanism a second after the last
        await bus.publish(JobSubmitted(spec(i)))
        await asyncio.sleep(0)


async def test_a_restarted_mechanism_admits_the_same_jobs_with_their_arrival_times(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "mechanism.sqlite"
    clock = SteppedClock()
    broker = InMemoryBroker()
    bus = InMemoryBus(broker, source="test")
    await bus.start()
    first = live_mechanism(path, clock)
    await first.start(bus)
    await submit(bus, clock, range(40))
    await eventually(lambda: len(admitted(first)) == 40)
    expected = admitted(first)
    # arrival is when the job reached the mechanism, not the submitter's time (0 here)
    assert sorted(t for _, t in expected.values()) == [1001.0 + i for i in range(40)]

    # Killed: no stop(), nothing flushed beyond what handlers committed before acknowledging.
    assert first.round_task is not None
    await first.kill()
    clock.t += 500.0  # the restart happens later: arrivals must not move to it
    second = live_mechanism(path, clock)
    bus_after = InMemoryBus(InMemoryBroker(), source="test")
    await bus_after.start()
    await second.start(bus_after)
    await eventually(lambda: len(admitted(second)) == 40)
    assert admitted(second) == expected
    assert set(second.memory.intake.known) == {spec(i).job_id for i in range(40)}
    await second.stop()
    await bus_after.close()
    await bus.close()


async def test_a_burst_of_submissions_does_not_snapshot_per_job(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Admission-only boundaries skip the snapshot (pickling the whole memory per arrival made
    ingest quadratic: 150 jobs/s at 10,000), but a bounded number of inputs is ever replayed."""
    path = tmp_path / "mechanism.sqlite"
    clock = SteppedClock()
    bus = InMemoryBus(InMemoryBroker(), source="test")
    await bus.start()
    mechanism = live_mechanism(path, clock)
    mechanism.journal.snapshot_every_events = 25
    saved: list[int] = []
    journal = mechanism.journal.file
    assert journal is not None
    original = journal.save_snapshot

    def counting(memory: object) -> None:
        original(memory)
        saved.append(journal.snapshot_seq)

    monkeypatch.setattr(journal, "save_snapshot", counting)
    await mechanism.start(bus)
    await submit(bus, clock, range(100))
    await eventually(lambda: len(admitted(mechanism)) == 100)
    assert 1 <= len(saved) <= 100 // 25  # one per 25 inputs at most, not one per boundary
    assert journal.last_seq() - snapshots_written(path) < 25 + 1
    await mechanism.stop()
    await bus.close()


def test_a_scaled_clock_resumes_from_the_journal_time() -> None:
    clock = ScaledClock(1000.0)
    before_s = time.monotonic()
    clock.advance_to(5_000.0)
    resumed_s = clock.now_s()
    waited_s = time.monotonic() - before_s
    # from the journal's time on, only the scaled wall time since: however long this took
    assert 5_000.0 <= resumed_s <= 5_000.0 + waited_s * 1000.0 + 1e-6
    clock.advance_to(10.0)  # never backwards
    assert clock.now_s() >= resumed_s


def test_a_journal_from_before_arrival_stamps_opens_and_replays(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, body BLOB NOT NULL)")
        db.execute("INSERT INTO events (kind, body) VALUES ('submitted', x'00')")
    journal = Journal(path)
    journal.append("submitted", b"\x01", 12.5)
    journal.commit()
    assert [(kind, body, at_s) for _, kind, body, at_s in journal.events()] == [
        ("submitted", b"\x00", None), ("submitted", b"\x01", 12.5),
    ]
    journal.close()
