"""A job's output, kept by the real worker and served to `gavel logs` (issue 25, item 6): the worker
with real job processes (tests/support/jobs/talker.py: standard library only, it says what it
does line by line) in one process on the in-memory bus; the test plays the mechanism, and asks as
`gavel logs` does (services/cli/logs_cmd.py's show_logs, on the same broker). About 10 s."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import sys
from pathlib import Path

import pytest

from common.messages import JobProgress, LogsReported, LogsRequested, RoundStarted, RunJobs
from common.errors import CommandFailed
from common.transport.memory import InMemoryBroker, InMemoryBus
from services.cli.logs_cmd import show_logs
from sim.fleet import SimulatedFleet
from tests.support.clock import SteppedClock
from tests.support.waiting import Collector, eventually, until
from tests.support.world import TABLE
from worker_service.core import WorkerConfig
from worker_service.service import WorkerService

ROOT = Path(__file__).resolve().parents[2]
TALKER = f"{sys.executable} {ROOT / 'tests/support/jobs/talker.py'}"


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.broker = InMemoryBroker()
        self.config = WorkerConfig(
            worker_id="w1", accelerator_type="v100", gpus=2, device="cpu", checkpoint_dir=str(tmp_path / "ckpt"),
            work_dir=str(ROOT), run_dir=str(tmp_path / "run"), python=sys.executable, log_dir=str(tmp_path / "logs"),
        )
        self.mechanism = InMemoryBus(self.broker, source="mechanism")
        self.cli = InMemoryBus(self.broker, source="gavel-cli")
        self.reports = Collector()
        self.answers = Collector()
        self.worker = self.new_worker()

    def new_worker(self) -> WorkerService:
        return WorkerService(config=self.config, heartbeat_s=0.2, kill_grace_s=5.0, hold_s=30.0)

    async def start(self) -> None:
        await self.mechanism.start()
        await self.mechanism.subscribe("progress", [JobProgress.ROUTING_KEY], self.reports)
        await self.cli.start()
        await self.cli.subscribe("cli.asker", ["logs.reply.asker"], self.answers, durable=False)
        self.worker_bus = InMemoryBus(self.broker, source="worker")
        await self.worker_bus.start()
        await self.worker.start(self.worker_bus)

    async def stop(self) -> None:
        await self.worker.stop()
        for bus in (self.worker_bus, self.cli, self.mechanism):
            await bus.close()

    async def finished(self, lease_id: str) -> JobProgress:
        await self.reports.wait_until(lambda: any(getattr(m, "lease_id", "") == lease_id for m in self.reports.messages), 30)
        return next(m for m in self.reports.messages if m.lease_id == lease_id)

    async def ask(self, request: LogsRequested) -> list[LogsReported]:
        """The worker's whole answer (every part of it)."""
        await self.cli.publish(request, mandatory=False)
        mine = lambda: [m for m in self.answers.messages if m.request_id == request.request_id]  # noqa: E731
        await self.answers.wait_until(lambda: bool(mine()) and len(mine()) == mine()[0].parts, 30)
        return sorted(mine(), key=lambda m: m.part)

    async def logs(self, job_id: str, **kwargs: object) -> str:
        out = io.StringIO()
        assert await show_logs(self.cli, job_id, follow=False, out=out, wait_s=1.0, **kwargs) == 0  # type: ignore[arg-type]
        return out.getvalue()


@pytest.fixture
async def rig(tmp_path: Path):
    r = Rig(tmp_path)
    await r.start()
    yield r
    await r.stop()


def run(lease_id: str, round_id: int, job_id: str = "j1", *, steps: int = 5, gpu_ids=(0,), scale_factor: int = 1, step_s: float = 0.01):  # noqa: ANN001
    return RunJobs(
        worker_id="w1", round_id=round_id, lease_id=lease_id, epoch=1, job_ids=(job_id,), gpu_ids=gpu_ids,
        lease_duration_s=60.0, max_steps=(steps,), job_types=("A3C",), commands=(f"{TALKER} --step-s {step_s}",),
        resume_steps=(0,), scale_factor=scale_factor,
    )


def lines(text: str) -> list[str]:
    return text.splitlines()


async def test_a_finished_jobs_stdout_and_stderr_are_served_as_written(rig: Rig) -> None:
    await rig.mechanism.publish(run("0:0", 0, steps=5))
    assert (await rig.finished("0:0")).outcome == "finished"
    # the attempt ends when the process is gone and its output read to the end
    async def ended() -> bool:
        return (await rig.ask(LogsRequested(f"r{len(rig.answers.messages)}", "j1", "asker")))[0].ended != ""
    await until(ended, 30)
    [part] = await rig.ask(LogsRequested("whole", "j1", "asker"))
    assert (part.worker_id, part.attempt, part.ended, part.offset, part.kept_from) == ("w1", 1, "finished", 0, 0)
    assert lines(part.text) == ["hello j1", *(f"step {n}" for n in range(1, 6)), "checkpoint 5", "bye 5"]
    assert part.next_offset == len(part.text.encode())
    # `gavel logs j1`: a header (worker, attempt, start, how it ended), then the output
    shown = lines(await rig.logs("j1"))
    assert shown[0].startswith("==> j1 on w1, attempt 1: started ") and shown[0].endswith(": finished <==")
    assert shown[1:] == lines(part.text)
    assert lines(await rig.logs("j1", tail=2)) == [shown[0], "checkpoint 5", "bye 5"]
    # from an offset: only what follows it; an attempt the asker holds in full: nothing
    [since] = await rig.ask(LogsRequested("since", "j1", "asker", offsets={"w1/1": part.next_offset - len("bye 5\n")}))
    assert since.text == "bye 5\n"
    await rig.cli.publish(LogsRequested("none", "j1", "asker", done=("w1/1",)), mandatory=False)
    await rig.broker.drain()
    assert not [m for m in rig.answers.messages if m.request_id == "none"]


async def test_a_worker_without_the_job_stays_silent_and_the_command_says_so_in_one_line(rig: Rig) -> None:
    await rig.cli.publish(LogsRequested("q", "never-ran", "asker"), mandatory=False)
    await rig.broker.drain()
    assert rig.answers.messages == []
    with pytest.raises(CommandFailed, match="no worker holds output of job 'never-ran'") as failed:
        await show_logs(rig.cli, "never-ran", follow=False, out=io.StringIO(), wait_s=0.2)
    assert failed.value.exit_code == 1


async def test_attempts_print_in_order_and_a_restarted_worker_serves_what_it_kept(rig: Rig) -> None:
    await rig.mechanism.publish(run("0:0", 0, steps=3, step_s=0.05))
    await rig.finished("0:0")
    # the next round does not continue it here: it stops; a later lease starts it again (attempt 2)
    await rig.mechanism.publish(RoundStarted(1, 0.0, 1.0, ()))
    await rig.mechanism.publish(run("2:0", 2, steps=2))
    await rig.finished("2:0")
    await rig.worker.stop()
    await rig.worker_bus.close()
    rig.worker, rig.worker_bus = rig.new_worker(), InMemoryBus(rig.broker, source="worker")
    await rig.worker_bus.start()
    await rig.worker.start(rig.worker_bus)
    shown = await rig.logs("j1")
    headers = [line for line in lines(shown) if line.startswith("==>")]
    assert [h.split(":")[0] for h in headers] == ["==> j1 on w1, attempt 1", "==> j1 on w1, attempt 2"]
    first, second = shown.split("==> j1 on w1, attempt 2")
    assert lines(first)[1:] == ["hello j1", "step 1", "step 2", "step 3", "checkpoint 3", "bye 3"]
    assert lines(second)[1:] == ["hello j1", "step 1", "step 2", "checkpoint 2", "bye 2"]


async def test_a_gangs_lines_say_their_rank(rig: Rig) -> None:
    await rig.mechanism.publish(run("0:0", 0, "gang", steps=3, gpu_ids=(0, 1), scale_factor=2))
    await rig.finished("0:0")
    async def both_said_bye() -> bool:
        [part] = await rig.ask(LogsRequested(f"g{len(rig.answers.messages)}", "gang", "asker"))
        return all(f"[rank {r}] bye" in part.text for r in (0, 1))
    await until(both_said_bye, 30)
    [part] = await rig.ask(LogsRequested("gang-all", "gang", "asker"))
    assert part.ranks == (0, 1)
    for rank in (0, 1):
        steps = [line.removeprefix(f"[rank {rank}] ") for line in lines(part.text) if line.startswith(f"[rank {rank}] step")]
        assert steps == ["step 1", "step 2", "step 3"], part.text
    assert all(line.startswith(("[rank 0] ", "[rank 1] ")) for line in lines(part.text)), part.text
    assert "ranks 0-1" in lines(await rig.logs("gang"))[0]


async def test_the_simulated_fleet_says_a_simulated_job_has_no_output(tmp_path: Path) -> None:
    broker = InMemoryBroker()
    fleet = SimulatedFleet(
        clock=SteppedClock(), table=TABLE, cluster={"v100": 1}, lockstep=True, answers_logs=True
    )
    mechanism, cli = InMemoryBus(broker, source="mechanism"), InMemoryBus(broker, source="gavel-cli")
    for bus in (mechanism, cli):
        await bus.start()
    fleet_bus = InMemoryBus(broker, source="fleet")
    await fleet_bus.start()
    await fleet.start(fleet_bus)
    reports = Collector()
    await mechanism.subscribe("progress", [JobProgress.ROUTING_KEY], reports)
    try:
        await mechanism.publish(RunJobs("v100-0", 0, "0:0", 1, ("sim",), (0,), 60.0, (10,), ("A3C",)))
        await reports.wait_until(lambda: bool(reports.messages), 10)
        with pytest.raises(CommandFailed, match=r"^job 'sim' has no output: it ran on the simulated fleet, which runs no process \(its server v100-0\)$") as failed:
            await show_logs(cli, "sim", follow=False, out=io.StringIO(), wait_s=1.0)
        assert failed.value.exit_code == 1
    finally:
        await fleet.stop()
        for bus in (fleet_bus, cli, mechanism):
            await bus.close()


async def test_following_prints_what_the_job_writes_as_it_comes_and_ctrl_c_ends_it_with_exit_0(rig: Rig) -> None:
    """No mechanism answers here, so the job's end is unknown and only Ctrl-C ends following."""
    await rig.mechanism.publish(run("0:0", 0, steps=100_000, step_s=0.05))
    out = io.StringIO()
    follow = asyncio.create_task(show_logs(rig.cli, "j1", follow=True, out=out, wait_s=0.5))
    await eventually(lambda: "step 3\n" in out.getvalue(), 20)
    first = out.getvalue()
    await eventually(lambda: "step 40\n" in out.getvalue(), 30)  # printed as it came, not again
    assert out.getvalue().startswith(first) and out.getvalue().count("step 3\n") == 1
    os.kill(os.getpid(), signal.SIGINT)
    assert await asyncio.wait_for(follow, 10) == 0
    shown = out.getvalue().splitlines()
    assert shown[0].startswith("==> j1 on w1, attempt 1: started ") and shown[0].endswith(", running <==")
    steps = [int(line.split()[1]) for line in shown if line.startswith("step ")]
    assert steps == list(range(1, len(steps) + 1))
