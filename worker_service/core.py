"""The worker's decisions, as pure functions: what to launch for a lease command, what a job's
lease file says, and what to report when a job pauses, exits or crashes.

The shell (worker_service/service.py) owns processes, files, the bus and the clock; everything it
decides, it asks here, with values in and values out (no I/O, no time of its own), so each rule is
tested without a process.

One process per job on this worker, or one per rank for a gang (``scale_factor`` > 1: one rank
per GPU; this worker runs ranks ``first_rank`` .. ``first_rank + len(gpu_ids) - 1``). A packed
pair is two jobs on the same GPUs: two processes side by side.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from common.messages import ExtendLease, JobProgress, RunJobs

OUTPUT_TAIL_CHARS = 2000  # of a crashed job's output (stdout and stderr), in its report (the codec bounds strings)
CATALOG_MODULE = "worker_service.workloads"


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    worker_id: str
    accelerator_type: str
    gpus: int
    device: str  # "cpu" or "cuda"
    checkpoint_dir: str  # shared by every worker (a job moves with its checkpoints)
    work_dir: str  # a job's default working directory
    run_dir: str  # this worker's own files: lease and progress files
    python: str  # the interpreter that runs catalog workloads
    emulate_speed: Mapping[str, float] = field(default_factory=dict)  # job type -> factor in (0, 1]; "*" for any
    default_speed: float = 1.0
    threads_per_job: int = 1
    advertise_host: str = "127.0.0.1"  # where a gang's rank 0 here can be reached by other workers
    workload_args: tuple[str, ...] = ()  # extra arguments for catalog workloads (e.g. --size full)
    log_dir: str = ""  # its jobs' output (worker_service/job_logs.py); "": <run_dir>/logs


@dataclass(frozen=True, slots=True)
class Rendezvous:
    master_addr: str
    master_port: int


@dataclass(frozen=True, slots=True)
class Launch:
    """One process to start: a job, or one rank of a gang."""

    job_id: str
    job_type: str
    rank: int  # in the gang (0 for a job of one GPU)
    local_rank: int
    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    lease_file: str
    progress_file: str
    reports: bool  # this process's progress is the job's report (rank 0 of the gang)


@dataclass(frozen=True, slots=True)
class LeaseTerms:
    """What the lease file says (the iterator reads it; see worker_service/training.py)."""

    lease_id: str
    round_id: int
    lease_end_unix_s: float
    step_budget: int
    stop: bool = False

    def as_json(self) -> dict[str, object]:
        return {
            "lease_id": self.lease_id,
            "round_id": self.round_id,
            "lease_end_unix_s": self.lease_end_unix_s,
            "step_budget": self.step_budget,
            "stop": self.stop,
        }


def safe_name(job_id: str) -> str:
    """A job id as one path component (ids may hold '/', as trace prefixes do)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", job_id).strip("._") or "job"
    return cleaned[:120]


def stale_epoch(command_epoch: int, newest_epoch: int) -> bool:
    """Commands of an older mechanism incarnation than one already obeyed are refused."""
    return command_epoch < newest_epoch


def is_gang_leader(command: RunJobs | ExtendLease, worker_id: str) -> bool:
    """The gang's first worker picks the rendezvous and reports progress."""
    return not command.gang_workers or command.gang_workers[0] == worker_id


def needs_rendezvous(command: RunJobs | ExtendLease) -> bool:
    return command.scale_factor > 1


def speed_for(config: WorkerConfig, job_type: str) -> float:
    return float(config.emulate_speed.get(job_type, config.emulate_speed.get("*", config.default_speed)))


def packed_with(command: RunJobs | ExtendLease, job_id: str) -> tuple[str, ...]:
    """The other jobs of ``command`` (a packed pair shares its GPUs): what ``job_id``'s reports
    name as its partners, so the estimator learns the pair's slowdown rather than a slower type."""
    return tuple(other for other in command.job_ids if other != job_id)


def lease_terms(command: RunJobs | ExtendLease, index: int, received_unix_s: float) -> LeaseTerms:
    """A lease runs ``lease_duration_s`` from when the worker received its command."""
    budget = command.max_steps[index] if index < len(command.max_steps) else 0
    return LeaseTerms(command.lease_id, command.round_id, received_unix_s + command.lease_duration_s, int(budget))


def launches(
    config: WorkerConfig,
    command: RunJobs | ExtendLease,
    received_unix_s: float,
    rendezvous: Rendezvous | None,
    base_env: Mapping[str, str],
) -> list[Launch]:
    """The processes that run ``command`` here, with their environment (docs/worker.md lists it)."""
    gpu_ids = command.gpu_ids
    gang = command.scale_factor > 1
    out: list[Launch] = []
    for index, job_id in enumerate(command.job_ids):
        job_type = command.job_types[index] if index < len(command.job_types) else ""
        user_command = command.commands[index] if index < len(command.commands) else ""
        cwd = (command.working_dirs[index] if index < len(command.working_dirs) else "") or config.work_dir
        resume = command.resume_steps[index] if index < len(command.resume_steps) else None
        if user_command:
            argv: tuple[str, ...] = ("/bin/sh", "-c", shell_line(user_command))
        else:
            argv = (config.python, "-m", CATALOG_MODULE, "--job-type", job_type, *config.workload_args)
        name = safe_name(job_id)
        per_process = [(k, (gpu,)) for k, gpu in enumerate(gpu_ids)] if gang else [(0, gpu_ids)]
        for local_rank, devices in per_process:
            rank = command.first_rank + local_rank if gang else 0
            stem = f"{config.run_dir}/{name}/rank{rank}"
            env = {
                **base_env,
                # `python` in a user's command is the worker's own interpreter (the one with torch)
                "PATH": os.pathsep.join([os.path.dirname(config.python), base_env.get("PATH", os.defpath)]),
                "GAVEL_JOB_ID": job_id,
                "GAVEL_JOB_TYPE": job_type,
                "GAVEL_WORKER_ID": config.worker_id,
                "GAVEL_ACCELERATOR_TYPE": config.accelerator_type,
                "GAVEL_ROUND_ID": str(command.round_id),
                "GAVEL_LEASE_ID": command.lease_id,
                "GAVEL_LEASE_END_UNIX_S": repr(received_unix_s + command.lease_duration_s),
                "GAVEL_STEP_BUDGET": str(command.max_steps[index] if index < len(command.max_steps) else 0),
                "GAVEL_LEASE_FILE": f"{stem}.lease.json",
                "GAVEL_PROGRESS_FILE": f"{stem}.progress.json",
                "GAVEL_CHECKPOINT_DIR": f"{config.checkpoint_dir}/{name}",
                "GAVEL_DEVICE": config.device,
                "GAVEL_GPU_IDS": ",".join(str(g) for g in devices),
                "GAVEL_EMULATE_SPEED": repr(speed_for(config, job_type)),
                "GAVEL_STARTED_AT_UNIX_S": repr(received_unix_s),
                "GAVEL_NUM_THREADS": str(config.threads_per_job),
                "OMP_NUM_THREADS": str(config.threads_per_job),
                "PYTHONUNBUFFERED": "1",
            }
            if resume is not None:
                env["GAVEL_RESUME_STEP"] = str(resume)
            if config.device == "cuda":
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in devices)
            if gang:
                assert rendezvous is not None, "a gang's ranks need the rendezvous first"
                env.update(
                    MASTER_ADDR=rendezvous.master_addr,
                    MASTER_PORT=str(rendezvous.master_port),
                    WORLD_SIZE=str(command.scale_factor),
                    RANK=str(rank),
                    LOCAL_RANK=str(local_rank),
                )
            out.append(
                Launch(
                    job_id=job_id, job_type=job_type, rank=rank, local_rank=local_rank, argv=argv, cwd=cwd, env=env,
                    lease_file=env["GAVEL_LEASE_FILE"], progress_file=env["GAVEL_PROGRESS_FILE"], reports=rank == 0,
                )
            )
    return out


SHELL_SYNTAX = re.compile(r"[;&|<>()`$\n]")


def shell_line(command: str) -> str:
    """A simple command replaces the shell (``exec``), so the job is the worker's own child: its
    signals reach it, and it dies with the worker. A compound one keeps the shell (the worker
    signals the whole process group, and the iterator ties the job's life to its parent's)."""
    return command if SHELL_SYNTAX.search(command) else f"exec {command}"


def describe_argv(argv: tuple[str, ...]) -> str:
    if argv[:2] == ("/bin/sh", "-c"):
        return argv[2].removeprefix("exec ")
    return shlex.join(argv)


@dataclass(frozen=True, slots=True)
class Observed:
    """What the shell saw of one job's reporting process at one moment."""

    progress: Mapping[str, object] | None  # its progress file, or None
    exit_code: int | None  # None while it runs; negative: killed by that signal
    output_tail: str = ""
    killed: bool = False  # we asked it to stop (KillJobs, a fence, its GPUs needed elsewhere)


def lease_report(
    *,
    job_id: str,
    worker_id: str,
    lease_id: str,
    round_id: int,
    seen: Observed,
    elapsed_s: float,
    accelerator_type: str,
    packed_with: tuple[str, ...] = (),
) -> JobProgress | None:
    """The report for ``lease_id`` if this observation settles it, else None (keep watching).

    Settled when the job paused at the lease's end (its steps are checkpointed: they count), or
    when its process is gone. A process that failed before pausing reports 0 steps for the lease:
    the steps it made since its last checkpoint are lost, and the next attempt resumes from that
    checkpoint, so counting them would make the job's steps disagree with its model.

    Every report says where it ran (``accelerator_type``: the worker's own type) and which jobs
    shared its GPUs (``packed_with``: the other job of a packed pair): without them the estimator
    cannot tell a measurement alone from one packed, nor on which type it was made."""
    progress = seen.progress or {}
    paused_here = progress.get("lease_id") == lease_id and progress.get("state") in ("paused", "exited")
    if paused_here:
        steps = int(progress.get("lease_steps", 0) or 0)
        stepping_s = float(progress.get("stepping_s", 0.0) or 0.0)
        done = bool(progress.get("done"))
        outcome = "finished" if done else ("killed" if seen.killed else "lease_end")
        return JobProgress(
            job_id=job_id,
            worker_id=worker_id,
            lease_id=lease_id,
            round_id=round_id,
            steps_done=steps,
            elapsed_s=elapsed_s,
            throughput_steps_per_s=steps / stepping_s if stepping_s > 0 else 0.0,
            finished=done,
            startup_s=float(progress.get("startup_s", 0.0) or 0.0),
            restore_s=float(progress.get("restore_s", 0.0) or 0.0),
            stepping_s=stepping_s,
            checkpoint_s=float(progress.get("checkpoint_s", 0.0) or 0.0),
            outcome=outcome,
            accelerator_type=accelerator_type,
            packed_with=packed_with,
        )
    if seen.exit_code is None:
        return None
    if seen.killed:
        outcome, error = "killed", (f"stopped before its checkpoint (signal {-seen.exit_code})" if seen.exit_code < 0 else "")
    else:
        outcome, error = "crashed", crash_reason(seen.exit_code, seen.output_tail)
    return JobProgress(
        job_id=job_id, worker_id=worker_id, lease_id=lease_id, round_id=round_id, steps_done=0, elapsed_s=elapsed_s,
        throughput_steps_per_s=0.0, outcome=outcome, exit_code=seen.exit_code, error=error,
        accelerator_type=accelerator_type, packed_with=packed_with,
    )


def crash_reason(exit_code: int, output_tail: str) -> str:
    how = f"killed by signal {-exit_code}" if exit_code < 0 else f"exit code {exit_code}"
    if exit_code == 0:
        how = "exited (code 0) without reporting its lease's steps: does it use worker_service.training.LeaseIterator?"
    tail = output_tail.strip()[-OUTPUT_TAIL_CHARS:]
    return f"{how}: {tail}" if tail else how


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""
