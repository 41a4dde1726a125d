"""The lease-aware training iterator: the one piece of gavel a training script uses.

A training loop wraps its data loader::

    from worker_service.training import LeaseIterator

    batches = LeaseIterator(loader, save_checkpoint=save, load_checkpoint=load, steps=10_000)
    for batch in batches:        # the model is restored from its last checkpoint first
        train_step(batch)
    # here the lease ended (gavel resumes the job later, maybe on another worker) or it is done

Under a gavel worker the iterator counts steps, stops at the lease's end or at the job's step
budget, saves a checkpoint through the user's function, tells the worker, and waits for the next
lease (an extension continues the same process; no restart). On its next start, possibly on
another worker, it calls the user's load function with the newest checkpoint the scheduler has
credited. It plays the role of Gavel's ``GavelIterator`` with the same contract
(``load_checkpoint``, ``save_checkpoint``, ``done``), but it talks to the worker through two
files, never over the network.

Outside a worker (no ``GAVEL_LEASE_FILE`` in the environment) it is a transparent pass-through:
the loader's batches, one pass, or ``steps`` of them cycling through the loader; checkpoints only
where ``checkpoint_dir`` is given. So the same script runs by hand.

The contract with the worker (docs/worker.md lists every variable):
- the worker writes the *lease file* (JSON, replaced atomically): ``lease_id``, ``round_id``,
  ``lease_end_unix_s``, ``step_budget`` (steps the job may still do: at most this many in the
  lease, and the job is done when it has done them all) and ``stop``; a new ``lease_id`` is an
  extension;
- the iterator writes the *progress file* (JSON, replaced atomically): the lease it refers to,
  ``state`` (``running``, ``paused``: the lease's steps are final and checkpointed, ``exited``),
  ``lease_steps``, ``step`` (the job's step counter), and the time spent starting up, restoring,
  stepping and checkpointing;
- SIGTERM asks for a checkpoint and exit at the end of the current step.

Steps reported are steps checkpointed: a checkpoint is written before the worker hears of the
lease's steps, so a job that moves resumes exactly where the scheduler thinks it is. Checkpoints
are directories ``step-<N>`` (written as ``.tmp`` and renamed, so a crash mid-save leaves the last
good one); the newest few are kept, and a job resumes from the newest one at or below the step the
scheduler credited (``GAVEL_RESUME_STEP``), should a report have been lost after its save.

A gang (``WORLD_SIZE`` > 1 with torch.distributed initialised) agrees on every stop: each step
ends with an all-reduce of the stop flag, so no rank waits in a collective its peers left.

Standard library only, and common/children.py, itself standard library (torch is used only
when the script itself initialised torch.distributed).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

from common.children import die_with_parent

T = TypeVar("T")

ENV_JOB_ID = "GAVEL_JOB_ID"
ENV_LEASE_FILE = "GAVEL_LEASE_FILE"
ENV_PROGRESS_FILE = "GAVEL_PROGRESS_FILE"
ENV_CHECKPOINT_DIR = "GAVEL_CHECKPOINT_DIR"
ENV_RESUME_STEP = "GAVEL_RESUME_STEP"
ENV_EMULATE_SPEED = "GAVEL_EMULATE_SPEED"
ENV_STARTED_AT = "GAVEL_STARTED_AT_UNIX_S"  # when the worker launched the process (start-up time)
ENV_RANK = "RANK"
ENV_WORLD_SIZE = "WORLD_SIZE"

CHECKPOINTS_KEPT = 3
POLL_S = 0.02  # how often a paused job looks for its next lease
PROGRESS_EVERY_S = 1.0  # a running job refreshes its progress file at most this often
LEASE_REREAD_S = 0.25  # a running job re-reads its lease file at least this often


class CheckpointError(RuntimeError):
    """The user's save or load function failed, or a checkpoint directory is unusable."""


def write_json_atomic(path: Path, body: dict[str, Any]) -> None:
    """Replace ``path`` with ``body`` so that a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when it is missing or not (yet) a whole object."""
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def checkpoint_steps(directory: Path) -> list[int]:
    """The steps of the complete checkpoints in ``directory``, ascending."""
    if not directory.is_dir():
        return []
    steps = []
    for child in directory.iterdir():
        name = child.name
        if name.startswith("step-") and child.is_dir() and name[5:].isdigit():
            steps.append(int(name[5:]))
    return sorted(steps)


class LeaseIterator(Generic[T]):
    """Wraps a data loader (any re-iterable) for a job that gavel may stop and resume.

    ``save_checkpoint(directory)`` writes the model's state into an empty directory;
    ``load_checkpoint(directory)`` reads it back. The iterator keeps the step counter itself.
    """

    def __init__(
        self,
        loader: Iterable[T],
        *,
        save_checkpoint: Callable[[Path], None] | None = None,
        load_checkpoint: Callable[[Path], None] | None = None,
        steps: int | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        environ: dict[str, str] | None = None,
        now_unix_s: Callable[[], float] = time.time,
        perf_s: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
        install_signal_handler: bool = True,
    ) -> None:
        env = os.environ if environ is None else environ
        self._loader = loader
        self._save = save_checkpoint
        self._load = load_checkpoint
        self._steps = steps
        self._now = now_unix_s
        self._perf = perf_s
        self._sleep = sleep
        lease_file = env.get(ENV_LEASE_FILE, "")
        self.under_worker = bool(lease_file)
        self._lease_file = Path(lease_file) if lease_file else None
        progress_file = env.get(ENV_PROGRESS_FILE, "")
        self._progress_file = Path(progress_file) if progress_file else None
        directory = env.get(ENV_CHECKPOINT_DIR) or (os.fspath(checkpoint_dir) if checkpoint_dir is not None else "")
        self.checkpoint_dir = Path(directory) if directory else None
        resume = env.get(ENV_RESUME_STEP, "")
        self._resume_step = int(resume) if resume.isdigit() else None
        speed = float(env.get(ENV_EMULATE_SPEED, "1") or 1)
        if not 0 < speed <= 1:
            raise ValueError(f"{ENV_EMULATE_SPEED} must be in (0, 1], got {speed}")
        self._slowdown = 1.0 / speed - 1.0  # sleep this many times each step's own time
        self._world_size = int(env.get(ENV_WORLD_SIZE, "1") or 1)
        self._rank = int(env.get(ENV_RANK, "0") or 0)
        started = env.get(ENV_STARTED_AT, "")
        self._started_at = float(started) if started else None
        self.job_id = env.get(ENV_JOB_ID, "")

        self.step = 0  # the job's step counter (restored from its checkpoint)
        self.lease_steps = 0  # steps in the current lease
        self.done = False  # every step of the job is done (under a worker: its budget is spent)
        self._restored = False
        self._stop_requested = False
        self._lease: dict[str, Any] = {}
        self._lease_key: tuple[int, int, int] | None = None
        self._lease_read_s = 0.0
        self._timings = {"startup_s": 0.0, "restore_s": 0.0, "stepping_s": 0.0, "checkpoint_s": 0.0}
        self._last_progress_s = 0.0
        if self.under_worker and install_signal_handler:
            try:
                signal.signal(signal.SIGTERM, self._on_sigterm)
            except ValueError:  # not the main thread: the worker's SIGKILL still ends us
                pass
            die_with_parent()  # a job started through a shell is the shell's child: tied to it, as it is to the worker

    # -- the contract: load_checkpoint, save_checkpoint, done ---------------------------------

    def load_checkpoint(self) -> int:
        """Restore the newest usable checkpoint through the user's function; return the job's
        step counter (0 when there is none: the job starts from scratch). Called by the first
        iteration when the script did not call it."""
        if self._restored:
            return self.step
        self._restored = True
        started = self._perf()
        if self._started_at is not None:  # from the worker's launch to here: interpreter, imports, model
            self._timings["startup_s"] = max(0.0, self._now() - self._started_at)
        if self.checkpoint_dir is None:
            return 0
        usable = [s for s in checkpoint_steps(self.checkpoint_dir) if self._resume_step is None or s <= self._resume_step]
        if usable:
            self.step = usable[-1]
            if self._load is not None:
                try:
                    self._load(self.checkpoint_dir / f"step-{self.step}")
                except Exception as e:
                    raise CheckpointError(f"loading checkpoint step-{self.step} failed: {e!r}") from e
        self._timings["restore_s"] = self._perf() - started
        return self.step

    def save_checkpoint(self) -> Path | None:
        """Write a checkpoint of the current step through the user's function (atomically: a
        ``.tmp`` directory renamed when complete) and prune old ones. None without a checkpoint
        directory or save function."""
        if self.checkpoint_dir is None or self._save is None:
            return None
        started = self._perf()
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        final = self.checkpoint_dir / f"step-{self.step}"
        if final.is_dir():
            return final  # this step is saved already (a kill right after a lease end)
        tmp = self.checkpoint_dir / f".step-{self.step}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            self._save(tmp)
        except Exception as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(f"saving checkpoint step-{self.step} failed: {e!r}") from e
        os.replace(tmp, final)
        for old in checkpoint_steps(self.checkpoint_dir)[:-CHECKPOINTS_KEPT]:
            shutil.rmtree(self.checkpoint_dir / f"step-{old}", ignore_errors=True)
        self._timings["checkpoint_s"] += self._perf() - started
        return final

    # -- iteration -----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[T]:
        if not self.under_worker:
            yield from self._pass_through()
            return
        self.load_checkpoint()
        self._refresh_lease(force=True)
        self._write_progress("running")
        batches = self._cycle()
        while True:
            lease_started = self._perf()
            while not self._agreed_stop(self._must_stop()):
                step_started = self._perf()
                batch = next(batches)
                yield batch
                self.step += 1
                self.lease_steps += 1
                if self._slowdown > 0:  # an emulated slower accelerator: the same step, stretched
                    self._sleep((self._perf() - step_started) * self._slowdown)
                if self._perf() - self._last_progress_s >= PROGRESS_EVERY_S:
                    self._timings["stepping_s"] = self._perf() - lease_started
                    self._write_progress("running")
            self._timings["stepping_s"] = self._perf() - lease_started
            self.done = self.lease_steps >= self._budget()
            self.save_checkpoint()  # before the worker hears of these steps (see the module doc)
            self._write_progress("paused")
            if self.done or self._stop_requested or not self._await_next_lease():
                self._write_progress("exited")
                return

    def _pass_through(self) -> Iterator[T]:
        if self.checkpoint_dir is not None:
            self.load_checkpoint()
        if self._steps is None:
            for batch in self._loader:
                yield batch
                self.step += 1
        else:
            batches = self._cycle()
            while self.step < self._steps:
                yield next(batches)
                self.step += 1
        self.done = True
        self.save_checkpoint()

    def _cycle(self) -> Iterator[T]:
        """The loader's batches, pass after pass (a job's steps outlast an epoch)."""
        while True:
            empty = True
            for batch in self._loader:
                empty = False
                yield batch
            if empty:
                raise ValueError("the data loader yielded no batch")

    # -- leases ----------------------------------------------------------------------------------

    def _budget(self) -> int:
        budget = int(self._lease.get("step_budget", 0))
        return budget if budget > 0 else 0

    def _must_stop(self) -> bool:
        if self._stop_requested:
            return True
        self._refresh_lease()
        if self._lease.get("stop"):
            return True
        if self.lease_steps >= self._budget():
            return True
        return self._now() >= float(self._lease.get("lease_end_unix_s", 0.0))

    def _agreed_stop(self, stop: bool) -> bool:
        """Every rank of a gang stops at the same step: the flag is all-reduced (max)."""
        if self._world_size <= 1:
            return stop
        torch = sys.modules.get("torch")
        dist = getattr(torch, "distributed", None) if torch is not None else None
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return stop
        flag = torch.tensor([1 if stop else 0], dtype=torch.int32)  # type: ignore[union-attr]
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _refresh_lease(self, *, force: bool = False) -> bool:
        """Re-read the lease file if it changed; True when it names a new lease. A change is seen
        from its stat (every replace makes a new inode), and the file is re-read at least every
        LEASE_REREAD_S anyway: two writes within one timestamp tick can share an mtime, and an
        inode number can be reused."""
        assert self._lease_file is not None
        try:
            st = self._lease_file.stat()
        except OSError:
            return False
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        now = self._perf()
        if key == self._lease_key and not force and now - self._lease_read_s < LEASE_REREAD_S:
            return False
        body = read_json(self._lease_file)
        if body is None:
            return False
        self._lease_key, self._lease_read_s = key, now
        new = body.get("lease_id") != self._lease.get("lease_id")
        self._lease = body
        return new

    def _await_next_lease(self) -> bool:
        """Paused at a lease's end: wait for an extension (a new lease id: True) or for the order
        to stop (False). The worker decides; a worker that died takes us with it."""
        while True:
            if self._stop_requested:
                return False
            if self._refresh_lease(force=True):
                if self._lease.get("stop"):
                    return False
                self.lease_steps = 0
                for key in self._timings:
                    self._timings[key] = 0.0
                self._write_progress("running")
                return True
            if self._lease.get("stop"):
                return False
            self._sleep(POLL_S)

    def _on_sigterm(self, signum: int, frame: object) -> None:  # noqa: ARG002
        self._stop_requested = True

    def _write_progress(self, state: str) -> None:
        self._last_progress_s = self._perf()
        if self._progress_file is None:
            return
        write_json_atomic(
            self._progress_file,
            {
                "pid": os.getpid(),
                "lease_id": self._lease.get("lease_id", ""),
                "state": state,
                "lease_steps": self.lease_steps,
                "step": self.step,
                "done": self.done,
                "rank": self._rank,
                **self._timings,
            },
        )
