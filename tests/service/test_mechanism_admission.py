"""A live mechanism with an admission policy (core/seams/admission.py): a job it does not admit yet
waits in the admission queue, `gavel jobs` and `gavel job ID` say so with the policy's reason,
the queue survives a restart from the journal, and drains as room frees. In one process on the
in-memory bus (every message through the codec), the real policy service, a scripted worker."""

from __future__ import annotations

import pathlib

from common.journal import read_events
from common.messages import JobSpec
from common.transport.memory import InMemoryBus
from mechanism_service.core.invariants import check
from services.cli.status_cmd import ask_on
from tests.support.waiting import eventually
from tests.support.world import RESNET, ScriptedWorker, kill, world

LOAD = {"admission": "load", "admission_params": (("max_load", "1.0"),)}


async def test_the_admission_queue_answers_why_survives_a_restart_and_drains(tmp_path: pathlib.Path) -> None:
    journal = tmp_path / "mechanism.sqlite"
    w = await world(journal, **LOAD)
    await w.worker("a", "v100")
    # one v100 and a bound of 1 GPU of demand per GPU: "first" joins, "second" waits
    await w.submit(JobSpec("first", RESNET, 10**6), JobSpec("second", RESNET, 10**6))
    await eventually(lambda: [j.job_id for j, _ in w.memory.queued] == ["second"] and bool(w.memory.state.previous_assignment))
    assert [j.job_id for j in w.memory.state.jobs.values()] == ["first"]

    rows = {row["id"]: row for row in await ask_on(w.bus, "jobs")}  # type: ignore[union-attr]
    assert (rows["second"]["state"], rows["second"]["reason_code"]) == ("admission", "Admission")
    job = await ask_on(w.bus, "job", job_id="second")
    assert isinstance(job, dict) and job["why"]["code"] == "Admission"
    assert job["why"]["reason"] == (
        "in the admission queue: load-based admission: the scheduled jobs demand 1 GPUs of 1 (load 1.00); "
        "jobs join in arrival order while the load with them stays at most 1"
    )
    assert (job["why"]["admission_queue_position"], job["why"]["admission_queue_length"]) == (1, 1)
    cluster = await ask_on(w.bus, "cluster")
    assert isinstance(cluster, dict) and (cluster["jobs_in_admission_queue"], cluster["jobs_held"]) == (1, 0)

    await kill(w)  # the queue was in the snapshot of the boundary that admitted "first"

    async def worker_first(bus: InMemoryBus) -> None:  # listening before the mechanism republishes
        a = await ScriptedWorker(bus, "a", "v100").start(register=False)
        a.answer = lambda command: {"steps": 10**6}  # every lease runs its job to the end

    again = await world(journal, before=worker_first, **LOAD)
    assert [j.job_id for j, _ in again.memory.queued] == ["second"]
    await eventually(lambda: [j.job_id for j in again.memory.state.completed] == ["first", "second"])
    assert again.memory.queued == [] and set(again.memory.state.admitted_at_s) == {0, 1}  # both through the policy
    await again.mechanism.stop()
    report = check(read_events(journal), finished=True)  # each job accepted once and ended once
    assert report.ok, report.violations


async def test_a_restart_without_the_admission_policy_admits_its_queue(tmp_path: pathlib.Path) -> None:
    """The queue a load-admission start left in its snapshot joins at the first boundary of a
    start with the default (accept_all), which never asks a policy: it waited for ever in state
    admission before."""
    journal = tmp_path / "mechanism.sqlite"
    w = await world(journal, **LOAD)
    await w.worker("a", "v100")
    await w.submit(JobSpec("first", RESNET, 10**6), JobSpec("second", RESNET, 10**6))
    await eventually(lambda: [j.job_id for j, _ in w.memory.queued] == ["second"] and bool(w.memory.state.previous_assignment))
    await kill(w)

    async def worker_first(bus: InMemoryBus) -> None:
        a = await ScriptedWorker(bus, "a", "v100").start(register=False)
        a.answer = lambda command: {"steps": 10**6}

    again = await world(journal, before=worker_first)  # the default admission
    await eventually(lambda: [j.job_id for j in again.memory.state.completed] == ["first", "second"])
    assert again.memory.queued == []
    await again.mechanism.stop()
    report = check(read_events(journal), finished=True)
    assert report.ok, report.violations
