"""The lease-aware iterator (worker_service/training.py), in one process: the worker's side of the
files is played by the test, and time is a counter the test moves."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from worker_service.training import LeaseIterator, checkpoint_steps, read_json, write_json_atomic


class FakeTime:
    def __init__(self) -> None:
        self.now_s = 1_000.0

    def now(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds


class Model:
    """A stand-in for a model: its state is a list of the batches it has seen."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.loads: list[Path] = []

    def save(self, directory: Path) -> None:
        (directory / "model.json").write_text(json.dumps(self.seen))

    def load(self, directory: Path) -> None:
        self.loads.append(directory)
        self.seen = json.loads((directory / "model.json").read_text())


def worker_env(tmp_path: Path, *, resume: int | None = None, speed: float | None = None) -> dict[str, str]:
    env = {
        "GAVEL_LEASE_FILE": str(tmp_path / "lease.json"),
        "GAVEL_PROGRESS_FILE": str(tmp_path / "progress.json"),
        "GAVEL_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "GAVEL_JOB_ID": "j1",
    }
    if resume is not None:
        env["GAVEL_RESUME_STEP"] = str(resume)
    if speed is not None:
        env["GAVEL_EMULATE_SPEED"] = str(speed)
    return env


def lease(tmp_path: Path, lease_id: str, *, end_s: float = 1e12, budget: int = 1_000_000, stop: bool = False) -> None:
    write_json_atomic(
        tmp_path / "lease.json",
        {"lease_id": lease_id, "round_id": 0, "lease_end_unix_s": end_s, "step_budget": budget, "stop": stop},
    )


def make(tmp_path: Path, model: Model, clock: FakeTime | None = None, **env_kw) -> LeaseIterator[int]:
    clock = clock or FakeTime()
    return LeaseIterator(
        range(5), save_checkpoint=model.save, load_checkpoint=model.load, environ=worker_env(tmp_path, **env_kw),
        now_unix_s=clock.now, perf_s=clock.now, sleep=clock.sleep, install_signal_handler=False,
    )


def test_outside_a_worker_it_passes_the_loader_through_unchanged() -> None:
    it = LeaseIterator(["a", "b", "c"], environ={})
    assert list(it) == ["a", "b", "c"]
    assert not it.under_worker and it.done and it.step == 3


def test_outside_a_worker_steps_cycle_the_loader_and_checkpoint_where_asked(tmp_path: Path) -> None:
    model = Model()
    it = LeaseIterator(range(3), save_checkpoint=model.save, load_checkpoint=model.load, steps=7, checkpoint_dir=tmp_path, environ={})
    for batch in it:
        model.seen.append(batch)
    assert model.seen == [0, 1, 2, 0, 1, 2, 0]
    assert checkpoint_steps(tmp_path) == [7]
    # run by hand again: it resumes from step 7 and has nothing left to do
    again = Model()
    it2 = LeaseIterator(range(3), save_checkpoint=again.save, load_checkpoint=again.load, steps=7, checkpoint_dir=tmp_path, environ={})
    assert list(it2) == [] and again.seen == [0, 1, 2, 0, 1, 2, 0]


def test_step_budget_ends_the_job_with_a_checkpoint_and_says_done(tmp_path: Path) -> None:
    lease(tmp_path, "0:1", budget=4)
    model = Model()
    it = make(tmp_path, model)
    for batch in it:
        model.seen.append(batch)
    assert model.seen == [0, 1, 2, 3]
    assert it.done and it.step == 4
    progress = read_json(tmp_path / "progress.json")
    assert progress is not None
    assert progress["state"] == "exited" and progress["lease_steps"] == 4 and progress["done"] is True
    assert checkpoint_steps(tmp_path / "ckpt") == [4]


def test_lease_end_pauses_then_an_extension_continues_the_same_loop(tmp_path: Path) -> None:
    clock = FakeTime()
    lease(tmp_path, "0:1", end_s=clock.now_s + 3.5, budget=100)
    model = Model()
    it = make(tmp_path, model, clock, speed=None)
    batches = iter(it)
    # each step costs 1 s of fake time (the test's "training")
    for _ in range(4):
        model.seen.append(next(batches))
        clock.sleep(1.0)
    # the lease has ended: the next call checkpoints, pauses, and waits for the worker; extend it
    # from another thread the way the worker does (a new lease id in the lease file)
    def extend_when_paused() -> None:
        while (read_json(tmp_path / "progress.json") or {}).get("state") != "paused":
            threading.Event().wait(0.001)
        lease(tmp_path, "1:1", end_s=clock.now_s + 1e9, budget=96)

    thread = threading.Thread(target=extend_when_paused)
    thread.start()
    model.seen.append(next(batches))
    thread.join(5)
    assert model.seen == [0, 1, 2, 3, 4]
    assert checkpoint_steps(tmp_path / "ckpt") == [4]  # saved at the pause, before the report
    next(batches)  # the step with batch 4 is done when the loop asks for the next batch
    assert it.lease_steps == 1 and it.step == 5  # the extension's steps start from 0


def test_pause_reports_the_leases_steps_and_times(tmp_path: Path) -> None:
    clock = FakeTime()
    lease(tmp_path, "0:1", end_s=clock.now_s + 2.5, budget=100)
    model = Model()
    it = make(tmp_path, model, clock)
    batches = iter(it)
    for _ in range(3):
        next(batches)
        clock.sleep(1.0)
    lease(tmp_path, "0:1", end_s=clock.now_s - 1, budget=100, stop=True)  # not extended: stop
    assert list(batches) == []
    progress = read_json(tmp_path / "progress.json")
    assert progress is not None and progress["lease_id"] == "0:1"
    assert progress["lease_steps"] == 3 and progress["step"] == 3 and progress["done"] is False
    assert progress["stepping_s"] == pytest.approx(3.0)


def test_a_new_start_restores_the_newest_checkpoint_the_scheduler_credited(tmp_path: Path) -> None:
    model = Model()
    lease(tmp_path, "0:1", budget=3)
    for batch in make(tmp_path, model):
        model.seen.append(batch)
    lease(tmp_path, "1:1", budget=2)
    resumed = Model()
    it = make(tmp_path, resumed, resume=3)
    for batch in it:
        resumed.seen.append(batch)
    assert resumed.loads == [tmp_path / "ckpt" / "step-3"]
    assert resumed.seen == [0, 1, 2, 0, 1] and it.step == 5  # the loader restarts; the counter continues
    assert checkpoint_steps(tmp_path / "ckpt") == [3, 5]
    # A checkpoint whose report was lost (step 5, never credited) is passed over.
    lease(tmp_path, "2:1", budget=2)
    third = Model()
    it3 = make(tmp_path, third, resume=3)
    assert it3.load_checkpoint() == 3 and third.seen == [0, 1, 2]


def test_no_checkpoint_starts_from_zero(tmp_path: Path) -> None:
    lease(tmp_path, "0:1", budget=2)
    model = Model()
    it = make(tmp_path, model, resume=10)
    assert it.load_checkpoint() == 0 and model.loads == []


def test_sigterm_stops_at_the_end_of_the_step_with_a_checkpoint(tmp_path: Path) -> None:
    lease(tmp_path, "0:1", budget=100)
    model = Model()
    it = make(tmp_path, model)
    for batch in it:
        model.seen.append(batch)
        if batch == 2:
            it._on_sigterm(15, None)  # what the signal handler does
    assert model.seen == [0, 1, 2] and not it.done
    assert checkpoint_steps(tmp_path / "ckpt") == [3]
    assert (read_json(tmp_path / "progress.json") or {})["state"] == "exited"


def test_emulated_speed_stretches_each_step(tmp_path: Path) -> None:
    clock = FakeTime()
    lease(tmp_path, "0:1", budget=2)
    model = Model()
    it = make(tmp_path, model, clock, speed=0.25)
    start = clock.now_s
    for _ in it:
        clock.sleep(1.0)  # a step of 1 s becomes 4 s
    assert clock.now_s - start == pytest.approx(8.0)


def test_a_failed_save_leaves_the_last_good_checkpoint(tmp_path: Path) -> None:
    lease(tmp_path, "0:1", budget=2)
    model = Model()
    for batch in make(tmp_path, model):
        model.seen.append(batch)

    def broken_save(directory: Path) -> None:
        (directory / "partial").write_text("x")
        raise OSError("disk full")

    lease(tmp_path, "1:1", budget=2)
    it = LeaseIterator(
        range(5), save_checkpoint=broken_save, load_checkpoint=model.load, environ=worker_env(tmp_path, resume=2),
        install_signal_handler=False,
    )
    with pytest.raises(Exception, match="disk full"):
        list(it)
    assert checkpoint_steps(tmp_path / "ckpt") == [2]
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["step-2"]


def test_an_empty_loader_is_an_error_not_a_hang(tmp_path: Path) -> None:
    lease(tmp_path, "0:1", budget=2)
    it = LeaseIterator([], environ=worker_env(tmp_path), install_signal_handler=False)
    with pytest.raises(ValueError, match="no batch"):
        list(it)


def test_a_speed_outside_zero_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="GAVEL_EMULATE_SPEED"):
        LeaseIterator([1], environ=worker_env(tmp_path, speed=2.0), install_signal_handler=False)
