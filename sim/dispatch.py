"""What the simulated hardware does with a round's leases, for the bus-free path (sim/fastpath.py):
each lease's steps and finish time from the table's true rates, whatever the mechanism believes
(physics.py; the services' simulated fleet runs the same physics)."""

from __future__ import annotations

from common.throughputs import ThroughputTable
from mechanism_service.core.model import Entry, MechanismState, Placement
from mechanism_service.core.reducers import LeaseResult
from mechanism_service.core.rounds import RoundPlan
from mechanism_service.core.settings import MechanismSettings
from sim.physics import full_lease, lease_outcome, true_rates

# (job type, scale factor, accelerator type, restore s) -> physics.full_lease: the table is the run's
FullLeases = dict[tuple[str, int, str, float], tuple[float, tuple[int], float]]


def full_lease_of(
    table: ThroughputTable, full_leases: FullLeases, settings: MechanismSettings
):
    """``full_leases`` as a function of its key, filling it as dispatch_round does."""

    def lookup(key: tuple[str, int, str, float]) -> tuple[float, tuple[int], float]:
        full = full_leases.get(key)
        if full is None:
            full = full_leases[key] = full_lease(table, *key[:3], settings.round_s, key[3])
        return full

    return lookup


def dispatch_round(
    state: MechanismState, table: ThroughputTable, plan: RoundPlan, now_s: float, settings: MechanismSettings,
    full_leases: FullLeases,
) -> list[LeaseResult]:
    """The round's leases, in the plan's order: ``dispatch_one`` of each. A single job's lease (nearly
    every one) is written out: its steps and length come from ``full_leases``, worked out once per
    (job type, scale factor, accelerator type, restore) for the run (physics.full_lease: the same
    floats as lease_outcome), unless the job has fewer steps left than the lease would run."""
    jobs, kept, restore_s, lease_s = state.jobs, plan.kept, settings.restore_s, settings.round_s
    running = []
    for entry, placement in plan.assignment.items():
        lease_restore_s = 0.0 if entry in kept else restore_s
        if len(entry) != 1:
            running.append(dispatch_one(state, table, entry, placement, now_s, lease_restore_s, settings))
            continue
        job = jobs[entry[0]]
        key = (job.job_type, job.scale_factor, placement.accelerator_type, lease_restore_s)
        full = full_leases.get(key)
        if full is None:
            full = full_leases[key] = full_lease(table, *key[:3], lease_s, lease_restore_s)
        rate, steps, duration_s = full
        remaining = job.total_steps - job.steps_done
        if remaining < steps[0]:  # the job's last lease: its own steps
            steps, duration_s = lease_outcome((rate,), (remaining,), lease_s, lease_restore_s)
        running.append(LeaseResult(entry, placement, steps, now_s + duration_s))
    return running


def dispatch_one(
    state: MechanismState, table: ThroughputTable, entry: Entry, placement: Placement, now_s: float, restore_s: float,
    settings: MechanismSettings,
) -> LeaseResult:
    """What the simulated hardware does with a lease: the table's true rates, whatever the
    mechanism believes."""
    if len(entry) == 1:  # nearly every lease: one job, without the lists
        job = state.jobs[entry[0]]
        throughputs = true_rates(table, (job.job_type,), job.scale_factor, placement.accelerator_type)
        remaining: tuple[int, ...] = (job.total_steps - job.steps_done,)
    else:
        jobs = [state.jobs[i] for i in entry]
        throughputs = true_rates(table, [j.job_type for j in jobs], jobs[0].scale_factor, placement.accelerator_type)
        remaining = tuple(j.steps_remaining for j in jobs)
    steps, duration_s = lease_outcome(throughputs, remaining, settings.round_s, restore_s)
    return LeaseResult(entry, placement, steps, now_s + duration_s)
