"""The real worker with real job processes, in one process on the in-memory bus; the test plays
the mechanism. The job is tests/support/jobs/counter.py (standard library only, so each process
starts in ~0.1 s): its model is a running sum, so its checkpoints show whether a resumed job went
on where it stopped. About 10 s in all; catalog (torch) jobs run in tests/e2e/test_real_workers.py."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from common.messages import (
    Assignment,
    ExtendLease,
    JobProgress,
    KillJobs,
    RoundStarted,
    RunJobs,
    WorkerFenced,
    WorkerHeartbeat,
    WorkerRegistered,
)
from common.transport.memory import InMemoryBroker, InMemoryBus
from tests.support.waiting import Collector, eventually
from worker_service.core import WorkerConfig
from worker_service.service import WorkerService
from worker_service.training import checkpoint_steps, read_json

ROOT = Path(__file__).resolve().parents[2]
COUNTER = f"{sys.executable} {ROOT / 'tests/support/jobs/counter.py'}"


class Rig:
    def __init__(self, tmp_path: Path, speed: float = 1.0) -> None:
        self.tmp_path = tmp_path
        self.broker = InMemoryBroker()
        self.config = WorkerConfig(
            worker_id="w1", accelerator_type="v100", gpus=2, device="cpu", checkpoint_dir=str(tmp_path / "ckpt"),
            work_dir=str(ROOT), run_dir=str(tmp_path / "run"), python=sys.executable, default_speed=speed,
        )
        self.worker = WorkerService(config=self.config, heartbeat_s=0.2, kill_grace_s=5.0, hold_s=30.0)
        self.reports = Collector()
        self.members = Collector()
        self.mechanism = InMemoryBus(self.broker, source="mechanism")
        self.worker_bus = InMemoryBus(self.broker, source="worker")

    async def start(self) -> None:
        await self.mechanism.start()
        await self.mechanism.subscribe("progress", [JobProgress.ROUTING_KEY], self.reports)
        await self.mechanism.subscribe("members", [WorkerRegistered.ROUTING_KEY, WorkerHeartbeat.ROUTING_KEY], self.members)
        await self.worker_bus.start()
        await self.worker.start(self.worker_bus)

    async def stop(self) -> None:
        await self.worker.stop()
        await self.worker_bus.close()
        await self.mechanism.close()

    async def send(self, command) -> None:  # noqa: ANN001
        await self.mechanism.publish(command)

    def reports_of(self, lease_id: str) -> list[JobProgress]:
        return [m for m in self.reports.messages if isinstance(m, JobProgress) and m.lease_id == lease_id]

    async def report(self, lease_id: str, count: int = 1, timeout_s: float = 20.0) -> list[JobProgress]:
        await self.reports.wait_until(lambda: len(self.reports_of(lease_id)) >= count, timeout_s)
        return self.reports_of(lease_id)

    def model(self, job: str, step: int) -> dict[str, int]:
        return json.loads((self.tmp_path / "ckpt" / job / f"step-{step}" / "model.json").read_text())

    def progress(self, job: str) -> dict[str, object]:
        return read_json(self.tmp_path / "run" / job / "rank0.progress.json") or {}


@pytest.fixture
async def rig(tmp_path: Path):
    r = Rig(tmp_path)
    await r.start()
    yield r
    await r.stop()


def run(lease_id: str, round_id: int, *, job_ids=("j1",), command=COUNTER, duration_s=1.0, max_steps=(10_000,), epoch=1, gpu_ids=(0,), resume=(0,)):  # noqa: ANN001
    return RunJobs(
        worker_id="w1", round_id=round_id, lease_id=lease_id, epoch=epoch, job_ids=tuple(job_ids), gpu_ids=gpu_ids,
        lease_duration_s=duration_s, max_steps=tuple(max_steps), job_types=("A3C",) * len(job_ids),
        commands=(command,) * len(job_ids), resume_steps=tuple(resume),
    )


async def test_it_registers_and_heartbeats(rig: Rig) -> None:
    await rig.members.wait_until(lambda: sum(isinstance(m, WorkerHeartbeat) for m in rig.members.messages) >= 2)
    registered = [m for m in rig.members.messages if isinstance(m, WorkerRegistered)]
    assert registered[0] == WorkerRegistered("w1", "v100", 2, "w1", clock="wall", instance=rig.worker.instance)


async def test_a_lease_ends_with_a_checkpoint_and_its_extension_continues_the_same_process(rig: Rig) -> None:
    await rig.send(run("0:0", 0))
    [first] = await rig.report("0:0")
    assert first.outcome == "lease_end" and first.steps_done > 10 and not first.finished
    assert first.throughput_steps_per_s > 10 and first.startup_s > 0 and first.stepping_s > 0.5
    assert (first.accelerator_type, first.packed_with) == ("v100", ())  # the worker's --type; alone
    # what was reported is what was checkpointed: the model saw exactly that many steps
    assert checkpoint_steps(rig.tmp_path / "ckpt" / "j1") == [first.steps_done]
    assert rig.model("j1", first.steps_done)["steps"] == first.steps_done
    pid = rig.progress("j1")["pid"]
    await rig.send(ExtendLease("w1", 1, "1:0", 1, 1.0, ("j1",), (10_000 - first.steps_done,), ("A3C",), commands=(COUNTER,)))
    [second] = await rig.report("1:0")
    assert second.outcome == "lease_end" and second.startup_s == 0.0  # no restart: no start-up
    assert (second.accelerator_type, second.packed_with) == ("v100", ())
    assert rig.progress("j1")["pid"] == pid
    total = first.steps_done + second.steps_done
    assert rig.model("j1", total)["steps"] == total
    # the next round does not continue it here: it stops (it has checkpointed already)
    await rig.send(RoundStarted(2, 0.0, 1.0, ()))
    await eventually(lambda: rig.progress("j1").get("state") == "exited", 10)
    assert len(rig.reports_of("1:0")) == 1


async def test_a_job_resumes_from_the_credited_checkpoint_in_a_new_process(rig: Rig) -> None:
    await rig.send(run("0:0", 0))
    [first] = await rig.report("0:0")
    await rig.send(RoundStarted(1, 0.0, 1.0, ()))
    await eventually(lambda: rig.progress("j1").get("state") == "exited", 10)
    # a lease the steps end, not the clock (a busy machine can take a second to start a process)
    await rig.send(run("2:0", 2, max_steps=(7,), resume=(first.steps_done,), gpu_ids=(1,), duration_s=60.0))
    [last] = await rig.report("2:0")
    assert last.finished and last.outcome == "finished" and last.steps_done == 7
    done = first.steps_done + 7
    model = rig.model("j1", done)
    assert model["steps"] == done
    # the sum continues the same sequence of batches 1..10, 1..10, ... from the step it stopped at
    assert model["sum"] == rig.model("j1", first.steps_done)["sum"] + sum(1 + (i % 10) for i in range(7))


async def test_a_crash_is_reported_with_its_exit_code_and_stderr(rig: Rig) -> None:
    await rig.send(run("0:0", 0, command=COUNTER + " --fail"))
    [report] = await rig.report("0:0")
    assert report.outcome == "crashed" and report.exit_code == 1 and report.steps_done == 0
    assert "ValueError: the learning rate is not a number" in report.error


async def test_a_command_that_cannot_start_is_reported_not_raised(rig: Rig) -> None:
    await rig.send(run("0:0", 0, command="/nonexistent/train --x"))
    [report] = await rig.report("0:0")
    assert report.outcome == "crashed" and report.exit_code == 127 and "not found" in report.error


async def test_kill_checkpoints_and_reports_the_steps_so_far(rig: Rig) -> None:
    await rig.send(run("0:0", 0, duration_s=60.0))
    await eventually(lambda: rig.progress("j1").get("state") == "running", 10)
    await rig.send(KillJobs("w1", 0, "0:0", 1, "cancelled"))
    [report] = await rig.report("0:0")
    assert report.outcome == "killed" and report.steps_done > 0
    assert rig.model("j1", report.steps_done)["steps"] == report.steps_done


async def test_a_packed_pair_runs_two_processes_on_one_gpu(rig: Rig) -> None:
    # a lease the steps end, not the clock: under load 40 steps and two starts took more than 1 s
    await rig.send(run("0:0+1", 0, job_ids=("a", "b"), max_steps=(30, 40), resume=(0, 0), duration_s=60.0))
    reports = await rig.report("0:0+1", 2)
    assert {(r.job_id, r.steps_done, r.finished) for r in reports} == {("a", 30, True), ("b", 40, True)}
    # each names the other: the estimator reads these steps/s as the pair's, not as the type's alone
    assert {(r.job_id, r.accelerator_type, r.packed_with) for r in reports} == {("a", "v100", ("b",)), ("b", "v100", ("a",))}


async def test_a_packed_pair_extended_together_still_names_its_partner(rig: Rig) -> None:
    await rig.send(run("0:0+1", 0, job_ids=("a", "b"), max_steps=(10_000, 10_000), resume=(0, 0)))
    first = await rig.report("0:0+1", 2)
    steps = {r.job_id: r.steps_done for r in first}
    await rig.send(ExtendLease(
        "w1", 1, "1:0+1", 1, 1.0, ("a", "b"), (10_000 - steps["a"], 10_000 - steps["b"]), ("A3C", "A3C"),
        commands=(COUNTER, COUNTER),
    ))
    second = await rig.report("1:0+1", 2)
    assert {(r.job_id, r.outcome, r.startup_s, r.packed_with) for r in second} == {
        ("a", "lease_end", 0.0, ("b",)), ("b", "lease_end", 0.0, ("a",)),  # the same processes, still paired
    }


async def test_a_pair_that_cannot_start_names_its_partner_in_each_failure(rig: Rig, tmp_path: Path) -> None:
    """No process at all (its working directory is missing): the worker's own failure report."""
    missing = str(tmp_path / "missing")
    await rig.send(dataclasses.replace(
        run("0:0+1", 0, job_ids=("a", "b"), resume=(0, 0), max_steps=(5, 5)), working_dirs=(missing, missing),
    ))
    reports = await rig.report("0:0+1", 2)
    assert all("could not start" in r.error for r in reports), reports
    assert {(r.job_id, r.outcome, r.accelerator_type, r.packed_with) for r in reports} == {
        ("a", "crashed", "v100", ("b",)), ("b", "crashed", "v100", ("a",)),
    }


async def test_stale_epochs_are_refused_and_duplicates_get_the_same_report(rig: Rig) -> None:
    await rig.send(run("0:0", 0, epoch=3, max_steps=(5,)))
    [report] = await rig.report("0:0")
    await rig.send(run("0:0", 0, epoch=3, max_steps=(5,)))  # redelivered: the same report again
    await rig.report("0:0", 2)
    assert rig.reports_of("0:0") == [report, report]
    await rig.send(run("1:0", 1, epoch=2, max_steps=(5,), job_ids=("old",)))  # an older incarnation's
    await rig.send(run("2:0", 2, epoch=3, max_steps=(5,), job_ids=("new",)))
    await rig.report("2:0")
    assert rig.reports_of("1:0") == [] and not (rig.tmp_path / "run" / "old").exists()


async def test_a_fenced_worker_stops_its_jobs_without_reporting_and_announces_itself(rig: Rig) -> None:
    await rig.send(run("0:0", 0, duration_s=60.0))
    await eventually(lambda: rig.progress("j1").get("state") == "running", 10)
    before = sum(isinstance(m, WorkerRegistered) for m in rig.members.messages)
    await rig.send(WorkerFenced("w1", 1, "no heartbeat for 30 s"))
    await eventually(lambda: rig.progress("j1").get("state") == "exited", 10)
    await rig.members.wait_until(lambda: sum(isinstance(m, WorkerRegistered) for m in rig.members.messages) > before)
    assert rig.reports_of("0:0") == []


async def test_round_started_keeps_the_jobs_it_continues_here(rig: Rig) -> None:
    await rig.send(run("0:0", 0))
    [first] = await rig.report("0:0")
    await rig.send(ExtendLease("w1", 1, "1:0", 1, 30.0, ("j1",), (5_000,), ("A3C",), commands=(COUNTER,)))
    await rig.send(RoundStarted(1, 0.0, 30.0, (Assignment(("j1",), "w1", "v100", (0,), "1:0", True),)))
    await eventually(lambda: rig.progress("j1").get("lease_id") == "1:0" and rig.progress("j1").get("state") == "running", 10)
    assert first.steps_done > 0


async def test_kill_reaches_a_job_behind_a_shell(rig: Rig) -> None:
    """A compound command keeps its shell; the stop goes to the whole process group, so the
    training process itself checkpoints and reports (not just the shell dying)."""
    await rig.send(run("0:0", 0, duration_s=60.0, command=f"cd {ROOT} && {COUNTER}"))
    await eventually(lambda: rig.progress("j1").get("state") == "running", 10)
    await rig.send(KillJobs("w1", 0, "0:0", 1, "cancelled"))
    [report] = await rig.report("0:0")
    assert report.outcome == "killed" and report.steps_done > 0
    assert rig.model("j1", report.steps_done)["steps"] == report.steps_done


async def test_an_emulated_slower_accelerator_measures_slower(tmp_path: Path) -> None:
    """--emulate-speed 0.25 stretches each step four times: the throughput the worker reports
    shows it (steps/s over stepping time), so a CPU-only cluster of "v100" and "k80" differs."""
    rates = {}
    for speed in (1.0, 0.25):
        rig = Rig(tmp_path / str(speed), speed)
        await rig.start()
        try:
            await rig.send(run("0:0", 0, command=f"{COUNTER} --step-s 0.01", duration_s=1.5))
            [report] = await rig.report("0:0")
            rates[speed] = report.throughput_steps_per_s
        finally:
            await rig.stop()
    assert rates[0.25] < 0.5 * rates[1.0], rates


async def test_a_lease_stopped_while_its_process_starts_still_stops_and_frees_its_gpus(rig: Rig) -> None:
    """A restarted worker reads from its queue a lease of an earlier round and the start of the
    next round, which does not continue it: the stop can come while the process is starting. It
    must stop (it paused for ever, and the next lease of its GPUs waited for it: an e2e run)."""
    await rig.send(run("2:0", 2, duration_s=60.0))
    await rig.send(RoundStarted(3, 0.0, 1.0, ()))
    [stale] = await rig.report("2:0")
    assert stale.outcome == "killed"  # stopped by the worker: not a failed attempt of the job
    await rig.send(run("5:0", 5, max_steps=(5,), duration_s=60.0, resume=(0,)))
    [report] = await rig.report("5:0")
    assert report.outcome == "finished" and report.steps_done == 5
