"""``python -m worker_service.workloads`` as a person and as a worker run it: real subprocesses,
real torch, the real lease iterator (no mocks).

Cost: nearly all of it interpreter and torch start-up (about 3 s per process that trains, ~2.5 s
of CPU): a run by hand, a bad data directory, a 2-rank gloo gang (two processes at once), and two
leases under a simulated worker. The five processes that depend on nothing start together when the
first test needs one (``started``), so that they share the cores rather than queue: the file
takes 16-17.5 s wall and ~21 s of CPU on 2 cores at load ~3 (20.8-22.2 s wall, the same CPU, with
the processes one after the other).
An unknown job type exits before torch is imported. Every subprocess runs with one thread
(OMP_NUM_THREADS, GAVEL_NUM_THREADS).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.unit.test_workloads import assert_same
from worker_service.workloads import entry_for
from worker_service.workloads.runner import UsageError, main, parse_settings

# One xdist worker for the module: ``started`` launches its processes once, not once a worker.
pytestmark = pytest.mark.xdist_group("workload-runner")

ROOT = Path(__file__).resolve().parents[2]
CHEAPEST = "A3C"  # about 12 ms a step at "small" (docs/workloads.md)
TIMEOUT_S = 120


def environment(**extra: str) -> dict[str, str]:
    """This process's environment without any worker or gang variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAVEL_") and k not in ("RANK", "WORLD_SIZE")}
    env.update(OMP_NUM_THREADS="1", GAVEL_NUM_THREADS="1", PYTHONPATH=str(ROOT), **extra)
    return env


def start(*args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "worker_service.workloads", *args],
        cwd=ROOT, env=environment(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"the runner did not finish in {TIMEOUT_S} s; stderr: {err[-2000:]}")
    return process.returncode, out, err


def run(*args: str, **env: str) -> tuple[int, str, str]:
    return finish(start(*args, **env))


def parameters(checkpoint: Path) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint / "state.pt", weights_only=True)["model"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lease(path: Path, lease_id: str, step_budget: int) -> None:
    body = {"lease_id": lease_id, "round_id": int(lease_id.split(":")[0]), "lease_end_unix_s": time.time() + 3600,
            "step_budget": step_budget, "stop": False}
    path.write_text(json.dumps(body))


def worker_files(where: Path) -> dict[str, str]:
    """A simulated worker's variables for a job whose files are in ``where``."""
    return {"GAVEL_LEASE_FILE": str(where / "lease.json"), "GAVEL_PROGRESS_FILE": str(where / "progress.json"),
            "GAVEL_CHECKPOINT_DIR": str(where / "ckpt"), "GAVEL_JOB_ID": "7"}


UNDER_A_WORKER = ("--job-type", CHEAPEST, "--steps", "1000")  # --steps is the by-hand limit: a lease overrides it


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Path, subprocess.Popen[str]]]]:
    """The processes that depend on nothing, all started at once (name -> its directory, the
    process): a run by hand, a bad data directory, both ranks of a gang, and a worker's first
    lease. Each test waits for its own; any left running at the end is killed."""
    where = {name: tmp_path_factory.mktemp(name) for name in ("by-hand", "bad-data", "gang", "lease")}
    lease(where["lease"] / "lease.json", "1:0", step_budget=4)
    port = str(free_port())
    gang = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2"}
    processes = {
        "by-hand": (where["by-hand"], start("--job-type", "Transformer (batch size 16)", "--steps", "3", "--checkpoint-dir", str(where["by-hand"]))),
        "bad-data": (where["bad-data"], start("--job-type", "LM (batch size 5)", "--steps", "2", "--data-dir", str(where["bad-data"]))),
        **{f"gang-{rank}": (where["gang"], start("--job-type", CHEAPEST, "--steps", "2", "--checkpoint-dir", str(where["gang"]), **gang, RANK=str(rank)))
           for rank in (0, 1)},
        "lease": (where["lease"], start(*UNDER_A_WORKER, **worker_files(where["lease"]))),
    }
    try:
        yield processes
    finally:
        for _, process in processes.values():
            if process.poll() is None:  # its test failed before waiting for it
                process.kill()
                process.communicate()


# -- by hand ------------------------------------------------------------------------------------------


@pytest.mark.slow  # ~7 s, the five processes of `started` starting together: a PyTorch process trains and checkpoints
def test_by_hand_it_trains_the_steps_and_checkpoints_them(started):
    tmp_path, process = started["by-hand"]
    code, out, err = finish(process)
    assert (code, err) == (0, "")
    # a line at the first step and one at the end, by default (the 30 s cadence is not reached)
    first, last = out.splitlines()
    assert first.startswith("Transformer (batch size 16): step 1 loss ")
    assert last == "Transformer (batch size 16): stopped at step 3 (every step done)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-3"]
    assert parameters(tmp_path / "step-3")


def test_an_unknown_job_type_is_exit_2_and_one_line():
    code, out, err = run("--job-type", "ResNet-19 (batch size 32)")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "unknown job type 'ResNet-19 (batch size 32)'" in err and "CycleGAN" in err


@pytest.mark.slow  # started with the others: a PyTorch process that starts and refuses
def test_a_bad_data_dir_is_exit_2_and_one_line_naming_what_was_expected(started):
    code, out, err = finish(started["bad-data"][1])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "train.txt" in err and "Traceback" not in err


def test_flags_and_environment_are_checked_in_process(capsys):
    assert main(["--job-type", "A3C", "--steps", "0"], {}) == 2
    assert main(["--job-type", "A3C", "--bogus"], {}) == 2
    assert main(["--job-type", "A3C"], {"GAVEL_NUM_THREADS": "many"}) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and "--steps must be" in lines[0] and "--bogus" in lines[1] and "GAVEL_NUM_THREADS" in lines[2]
    on_gpu = parse_settings(["--job-type", "A3C"], {"GAVEL_DEVICE": "cuda", "RANK": "1", "WORLD_SIZE": "2"})
    assert (on_gpu.device, on_gpu.size, on_gpu.rank, on_gpu.world_size, on_gpu.threads) == ("cuda:0", "full", 1, 2, 1)
    assert parse_settings(["--job-type", "A3C", "--device", "cpu"], {"GAVEL_DEVICE": "cuda"}).size == "small"
    with pytest.raises(UsageError, match="device must be cpu or cuda"):
        parse_settings(["--job-type", "A3C", "--device", "tpu"], {})


# -- a gang -------------------------------------------------------------------------------------------


@pytest.mark.slow  # started with the others: two PyTorch processes in a gloo gang
def test_a_two_rank_gloo_gang_trains_and_rank_0_saves(started):
    tmp_path = started["gang-0"][0]
    results = [finish(started[f"gang-{rank}"][1]) for rank in (0, 1)]
    assert [code for code, _, _ in results] == [0, 0], [err[-2000:] for _, _, err in results]
    # One checkpoint, written by rank 0 alone (no directory, not even an empty one, from rank 1).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2"]
    assert sorted(p.name for p in (tmp_path / "step-2").iterdir()) == ["state.pt"]
    assert all(t.isfinite().all() for t in parameters(tmp_path / "step-2").values())


# -- under a worker -----------------------------------------------------------------------------------


@pytest.mark.slow  # ~5 s: the first lease started with the others, then a second PyTorch process resumes it
def test_under_a_worker_it_runs_its_lease_budget_and_resumes_where_credited(started):
    tmp_path, first = started["lease"]  # its lease file says 1:0, a budget of 4 steps
    worker = worker_files(tmp_path)
    lease_file, progress_file, checkpoints = (Path(worker[k]) for k in ("GAVEL_LEASE_FILE", "GAVEL_PROGRESS_FILE", "GAVEL_CHECKPOINT_DIR"))
    args = UNDER_A_WORKER

    code, _, err = finish(first)
    assert code == 0, err[-2000:]
    progress = json.loads(progress_file.read_text())
    assert (progress["state"], progress["done"], progress["step"], progress["lease_steps"]) == ("exited", True, 4, 4)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-4"]

    lease(lease_file, "2:0", step_budget=3)
    code, _, err = run(*args, **worker, GAVEL_RESUME_STEP="4")
    assert code == 0, err[-2000:]
    progress = json.loads(progress_file.read_text())
    assert (progress["state"], progress["done"], progress["lease_steps"], progress["step"]) == ("exited", True, 3, 7)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-4", "step-7"]
    before, after = parameters(checkpoints / "step-4"), parameters(checkpoints / "step-7")
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # ... and they are step 4's continued: the same three steps from step 4's checkpoint, here.
    assert_same(after, continued(CHEAPEST, checkpoints / "step-4", steps=3))


def continued(job_type: str, checkpoint: Path, steps: int) -> dict[str, torch.Tensor]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the subprocess ran: the same reductions, the same bits
    try:
        job = entry_for(job_type).build()
        job.load_state_dict(torch.load(checkpoint / "state.pt", weights_only=True))
        batches = iter(job.data)
        for _ in range(steps):
            job.train_step(next(batches))
        return job.model.state_dict()
    finally:
        torch.set_num_threads(threads)


def test_a_catalog_job_logs_its_first_step_then_by_time_and_by_steps() -> None:
    """Issue 23: catalog jobs wrote nothing to their log. A line at the first step, then every
    ``--log-every-s`` seconds (and every ``--log-every`` steps when given)."""
    from worker_service.workloads.runner import ProgressLines

    lines = ProgressLines(every_steps=0, every_s=30.0)
    due = [step for step, now_s in [(101, 0.0), (102, 10.0), (150, 29.9), (160, 30.0), (161, 31.0), (400, 60.0)] if lines.due(step, now_s)]
    assert due == [101, 160, 400]  # the first step (resumed at 100), then every 30 s
    assert lines.rate() == " (5.0 steps/s)"  # (400 - 101) steps over 60 s, start-up aside
    by_steps = ProgressLines(every_steps=50, every_s=0.0)
    assert [s for s in (1, 49, 50, 99, 100) if by_steps.due(s, float(s))] == [1, 50, 100]
    assert parse_settings(["--job-type", "A3C"], {}).log_every_s == 30.0
    assert parse_settings(["--job-type", "A3C", "--log-every-s", "0"], {}).log_every_s == 0.0
