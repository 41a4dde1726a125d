"""``python -m worker_service.workloads --job-type "ResNet-18 (batch size 32)"``: train one job type
of the catalog through the lease-aware iterator (worker_service/training.py).

Under a gavel worker (``GAVEL_LEASE_FILE`` set) the iterator decides how many steps run, where
checkpoints go and when the process exits; by hand it is a pass-through: ``--steps`` steps (one
epoch without it), checkpoints only with ``--checkpoint-dir`` (and a resume from its newest one).

Environment: ``GAVEL_DEVICE`` (default cpu; ``--device`` wins), ``GAVEL_NUM_THREADS`` (torch's
intra-op threads, default 1: a worker packs jobs by the core), and for a gang ``WORLD_SIZE``,
``RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` (torch.distributed's env:// rendezvous).

Output (rank 0 only, on stdout: a worker keeps it in the job's log): a line at the first step, one
every ``--log-every-s`` seconds (30; 0: none) and every ``--log-every`` N steps if given, and one
when the process stops (its step, and whether the job is done). Exit 2 with one
line on stderr for what the caller must fix (a bad flag, an unknown job type, a data directory
without its files, no CUDA); any other failure exits 1 with its traceback on stderr (the worker
reports the tail).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from worker_service.workloads.catalog import Workload, entry_for, known_job_types
from worker_service.workloads.config import SIZES, Size, WorkloadConfig, default_size
from worker_service.workloads.errors import WorkloadError

PROG = "python -m worker_service.workloads"
ENV_DEVICE = "GAVEL_DEVICE"
ENV_NUM_THREADS = "GAVEL_NUM_THREADS"
STATE_FILE = "state.pt"  # inside each checkpoint directory step-<N>/

class UsageError(WorkloadError):
    """A bad flag or environment variable."""

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        raise UsageError(message)

@dataclass(frozen=True)
class RunSettings:
    job_type: str
    steps: int | None  # by hand: how many steps in all (None: one epoch); ignored under a worker
    size: Size
    seed: int
    device: str  # "cpu" or "cuda:<index>"
    data_dir: Path | None
    checkpoint_dir: Path | None
    log_every_steps: int  # 0: not by steps
    threads: int
    rank: int
    world_size: int
    log_every_s: float = 30.0  # 0: not by time

def _natural(text: str, name: str, *, minimum: int = 0) -> int:
    if not text.strip().isdigit() or int(text) < minimum:
        raise UsageError(f"{name} must be an integer >= {minimum}, got {text!r}")
    return int(text)

def parse_settings(argv: Sequence[str] | None, environ: Mapping[str, str]) -> RunSettings:
    parser = _Parser(prog=PROG, description="Train one job type of the workload catalog (docs/workloads.md).")
    parser.add_argument("--job-type", required=True, help=f"one of: {known_job_types()}")
    parser.add_argument("--steps", type=str, default=None, help="steps in all, by hand (default: one epoch)")
    parser.add_argument("--data-dir", type=Path, default=None, help="a local dataset (default: synthetic data)")
    parser.add_argument("--size", choices=SIZES, default=None, help="small (default on cpu) or full (default on cuda)")
    parser.add_argument("--seed", type=str, default="0")
    parser.add_argument("--device", default=None, help=f"cpu or cuda (default: ${ENV_DEVICE}, else cpu)")
    parser.add_argument("--checkpoint-dir", type=Path, default=None, help="by hand: save here, resume from here")
    parser.add_argument("--log-every", type=str, default="0", help="also print a line every N steps (default: by time only)")
    parser.add_argument(
        "--log-every-s", type=str, default="30", help="print a line every S seconds of stepping (default 30; 0: only the first and last)"
    )
    args = parser.parse_args(argv)
    device = (args.device or environ.get(ENV_DEVICE) or "cpu").strip()
    if device == "cuda":
        device = "cuda:0"  # the worker narrows CUDA_VISIBLE_DEVICES to the job's GPUs
    if device != "cpu" and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise UsageError(f"device must be cpu or cuda, got {device!r}")
    return RunSettings(
        job_type=args.job_type,
        steps=None if args.steps is None else _natural(args.steps, "--steps", minimum=1),
        size=args.size or default_size(device),
        seed=_natural(args.seed, "--seed"),
        device=device,
        data_dir=args.data_dir,
        checkpoint_dir=args.checkpoint_dir,
        log_every_steps=_natural(args.log_every, "--log-every"),
        log_every_s=float(_natural(args.log_every_s, "--log-every-s")),
        threads=_natural(environ.get(ENV_NUM_THREADS, "1"), ENV_NUM_THREADS, minimum=1),
        rank=_natural(environ.get("RANK", "0") or "0", "RANK"),
        world_size=_natural(environ.get("WORLD_SIZE", "1") or "1", "WORLD_SIZE", minimum=1),
    )

def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    try:
        settings = parse_settings(argv, env)
        workload = entry_for(settings.job_type)  # before torch is imported: a typo costs milliseconds
        return train(workload, settings)
    except WorkloadError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130

class ProgressLines:
    """When a job prints a line: at its first step in this process, then every ``every_steps``
    steps and every ``every_s`` seconds (steps per second differ 1000-fold between job types, so
    a time cadence keeps every job's log readable; issue 23: catalog jobs logged nothing)."""

    def __init__(self, every_steps: int, every_s: float) -> None:
        self._every_steps, self._every_s = every_steps, every_s
        self._first: tuple[int, float] | None = None
        self._last: tuple[int, float] = (0, 0.0)

    def due(self, step: int, now_s: float) -> bool:
        if self._first is None:
            self._first = self._last = (step, now_s)
            return True
        by_steps = bool(self._every_steps) and step % self._every_steps == 0
        by_time = bool(self._every_s) and now_s - self._last[1] >= self._every_s
        if by_steps or by_time:
            self._last = (step, now_s)
            return True
        return False

    def rate(self) -> str:
        """Steps per second since the first step (the interpreter's start-up and the restore aside)."""
        assert self._first is not None
        steps, elapsed_s = self._last[0] - self._first[0], self._last[1] - self._first[1]
        return f" ({steps / elapsed_s:.1f} steps/s)" if steps and elapsed_s > 0 else ""


def train(workload: Workload, settings: RunSettings) -> int:
    """Build the job, join the gang if there is one, and step through the lease iterator."""
    import torch
    import torch.distributed as dist

    from worker_service.training import LeaseIterator

    torch.set_num_threads(settings.threads)
    device = torch.device(settings.device)
    if device.type == "cuda":
        if not torch.cuda.is_available() or device.index >= torch.cuda.device_count():
            raise UsageError(f"device {settings.device}: CUDA is not available here")
        torch.cuda.set_device(device)
    # 1. The job (a bad data directory fails here, before any peer waits on us).
    config = WorkloadConfig(
        size=settings.size, seed=settings.seed, data_seed=settings.seed + settings.rank,
        device=settings.device, data_dir=settings.data_dir,
    )
    job = workload.build(config)
    gang = settings.world_size > 1
    try:
        # 2. A gang: rendezvous (env://) and data-parallel modules; ranks start from rank 0's weights.
        if gang:
            # On GPUs, NCCL carries the gradients; gloo stays the backend of CPU tensors, because the
            # lease iterator agrees on every stop with an all-reduce of a CPU flag (NCCL has no CPU).
            backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend, init_method="env://")
            from torch.nn.parallel import DistributedDataParallel

            ids = [device.index] if device.type == "cuda" else None
            job.distribute(lambda module: DistributedDataParallel(module, device_ids=ids))

        # 3. Checkpoints: every rank loads (the directory is shared); rank 0 alone saves. The other
        #    ranks pass no save function, so the iterator makes no directory for them either.
        def save(directory: Path) -> None:
            torch.save(job.state_dict(), directory / STATE_FILE)

        def load(directory: Path) -> None:
            job.load_state_dict(torch.load(directory / STATE_FILE, map_location=device, weights_only=True))

        batches = LeaseIterator(
            job.data,
            save_checkpoint=save if settings.rank == 0 else None,
            load_checkpoint=load,
            steps=settings.steps,
            checkpoint_dir=settings.checkpoint_dir,
        )
        # 4. Train until the iterator stops: the steps are done, or the lease ended.
        lines = ProgressLines(settings.log_every_steps, settings.log_every_s) if settings.rank == 0 else None
        for batch in batches:
            loss = job.train_step(batch)
            done_steps = batches.step + 1  # the iterator counts this step when we ask for the next
            if lines is not None and lines.due(done_steps, time.monotonic()):
                print(f"{workload.job_type}: step {done_steps} loss {loss:.4f}{lines.rate()}", flush=True)
        if lines is not None:
            why = "every step done" if batches.done else "lease over or stopped: resumes from its checkpoint"
            print(f"{workload.job_type}: stopped at step {batches.step} ({why})", flush=True)
    finally:
        if gang and dist.is_initialized():
            dist.destroy_process_group()
    if gang:
        # A rank of a gang is a process of its own (one per rank, see the module docstring), and it
        # leaves here without the interpreter's tear-down: freeing the gang's modules (DDP's
        # reducer, gloo's pending work) can wait forever on a peer that has already exited (seen:
        # one run in four of a two-rank gloo gang on CPU hung there after its last step, with
        # everything saved). Every file is written and closed by now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


__all__ = ["ProgressLines", "RunSettings", "UsageError", "main", "parse_settings", "train"]
