"""A round plan as the commands that carry it out: one lease per entry (run, or extend a lease it
holds), one command per worker of its gang, what each job's status and attempts record, and the
boundary's audit record. Pure: the shell journals and publishes what this returns."""

from __future__ import annotations

from dataclasses import dataclass
from common.messages import Assignment, ExtendLease, RunJobs
from mechanism_service.core import attempts as attempts_core
from mechanism_service.core import audit
from mechanism_service.core import status as status_core
from mechanism_service.core.leases import workers_of
from mechanism_service.core.memory import Lease, Memory
from mechanism_service.core.model import MechanismState
from mechanism_service.core.rounds import RoundPlan
from mechanism_service.core.settings import MechanismSettings

NO_LAUNCH = ("", "")  # a job's command and working directory when it gave neither: its type's catalog entry


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A boundary's commands (in the plan's order, a gang's in rank order) and what the round
    assigned (RoundStarted's, and the audit record's), under ``round_id``."""

    round_id: int
    commands: tuple[RunJobs | ExtendLease, ...]
    assignments: tuple[Assignment, ...]


def dispatch(memory: Memory, state: MechanismState, plan: RoundPlan, now_s: float, reset: bool, settings: MechanismSettings) -> Dispatch:
    """The plan's leases become the running round's (``memory.expected``), each job's placement and
    attempt are recorded, and the commands are returned."""
    assignment = plan.assignment
    commands: list[RunJobs | ExtendLease] = []
    assignments = []
    round_id = memory.round_id
    if assignment:
        memory.round_id += 1
        memory.running = (now_s, plan, reset)
    for entry, placement in assignment.items():
        lease_id = f"{round_id}:{'+'.join(str(i) for i in entry)}"
        memory.expected[lease_id] = Lease(lease_id, entry, placement, now_s)
        jobs = [state.jobs[i] for i in entry]
        extended = entry in plan.kept
        launch = [memory.launch.get(j.job_id, NO_LAUNCH) for j in jobs]
        job_fields = dict(
            job_ids=tuple(j.job_id for j in jobs),
            max_steps=tuple(j.steps_remaining for j in jobs),
            job_types=tuple(j.job_type for j in jobs),
            scale_factor=jobs[0].scale_factor,
            # () when no job gave one (the catalog runs; a simulated fleet never needs them):
            # every field is validated at every publish, and the simulator sends ~60,000 commands
            commands=tuple(command for command, _ in launch) if any(c for c, _ in launch) else (),
            working_dirs=tuple(working_dir for _, working_dir in launch) if any(d for _, d in launch) else (),
            # the steps credited so far: the job resumes from its newest checkpoint at or below
            resume_steps=tuple(j.steps_done for j in jobs),
            # the submitters' steps/s (() when no job gave any): a simulated fleet runs a job
            # its table lacks from them (sim/derived_rates.py)
            throughput_estimates_steps_per_s=(
                tuple(memory.user_estimates.get(j.job_id, {}) for j in jobs)
                if any(j.job_id in memory.user_estimates for j in jobs) else ()
            ),
        )
        placed = workers_of(memory.worker_of, placement)
        workers = [worker_id for worker_id, _ in placed]  # in rank order, as `gavel workers` names them
        first_rank = 0  # the gang's GPUs on the workers before this one
        for worker_id, gpu_ids in placed:
            common = dict(
                worker_id=worker_id, round_id=round_id, lease_id=lease_id, epoch=memory.epoch,
                # a lease on one worker needs no gang list (its worker is the gang's first)
                lease_duration_s=settings.round_s, gpu_ids=gpu_ids, gang_workers=tuple(workers) if len(workers) > 1 else (),
                first_rank=first_rank,
            )
            if extended:
                commands.append(ExtendLease(**common, **job_fields))  # gpu_ids too: a restarted worker starts it anew
            else:
                commands.append(RunJobs(**common, restore_s=settings.restore_s, **job_fields))
            assignments.append(
                Assignment(tuple(j.job_id for j in jobs), worker_id, placement.accelerator_type, gpu_ids, lease_id, extended)
            )
            first_rank += len(gpu_ids)
        for job in jobs:
            status_core.record_placement(
                memory.observations, job.job_id, round_id, now_s, placement.accelerator_type, workers,
                extended=extended, packed_with=[j.job_id for j in jobs if j is not job],
            )
            attempt = attempts_core.continue_attempt if extended else attempts_core.start_attempt
            attempt(
                memory.observations.attempts, job.job_id, round_id=round_id, now_s=now_s,
                accelerator_type=placement.accelerator_type, workers=workers,
            )
    return Dispatch(round_id, tuple(commands), tuple(assignments))


def boundary_record(
    memory: Memory, state: MechanismState, settings: MechanismSettings, round_id: int, now_s: float, *, pool_changed: bool
) -> audit.BoundaryRecord:
    """The audit record of a boundary, its leases and settled leases aside (written as columns);
    the workers and the pool only when they changed since the last one (``pool_changed``)."""
    workers = pool = None
    if pool_changed:
        workers = tuple((w, t, g) for t, servers in memory.servers.items() for w, g in servers)
        # A GPU the state has and no worker owns would be a leak: named, not a crash, so the
        # checker says it
        pool = tuple(
            memory.worker_of.get(gpu, ("?", gpu)) for servers in state.servers.values() for server in servers for gpu in server
        )
    return audit.BoundaryRecord(
        epoch=memory.epoch, at_s=now_s, round_id=round_id, leases=(), settled=(), workers=workers, pool=pool,
        charges_from_previous_end=settings.round_start_from_previous_end,
        round_s=settings.round_s, worker_grace_s=settings.worker_grace_s or 0.0,
    )
