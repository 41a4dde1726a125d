"""The simulated hardware: what a lease does, given the throughputs (docs/gavel-semantics.md
section 7). Shared by the simulated fleet and the bus-free path, so both
make exactly the same progress."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from common.throughputs import ThroughputTable


def true_rates(table: ThroughputTable, job_types: Sequence[str], scale_factor: int, accelerator_type: str) -> tuple[float, ...]:
    """What the hardware really does: each member's steps/s, alone or in its pair, from the table
    (the simulator's truth, whatever the mechanism believes); 0 where the table has nothing. The
    fleets run a job the table lacks at sim/derived_rates.py's rates instead."""
    if len(job_types) == 1:
        return (table.isolated_steps_per_s.get((job_types[0], scale_factor, accelerator_type), 0.0),)
    pair = table.pair(job_types[0], job_types[1], scale_factor, accelerator_type)
    return tuple(pair) if pair is not None else (0.0,) * len(job_types)


def lease_outcome(
    throughputs_steps_per_s: Sequence[float], steps_remaining: Sequence[int], lease_s: float, restore_s: float = 0.0
) -> tuple[tuple[int, ...], float]:
    """(steps per member, seconds until the last member stops) for one lease.

    Each member runs floor(T x lease) steps, or what it has left, at its own rate (a packed
    member at its rate in the pair); the lease is over when the slowest member stops, so it is
    a little shorter than ``lease_s`` (floor) and much shorter only when every member runs out
    of steps. A job that moved first spends ``restore_s`` of the lease restoring its checkpoint.
    """
    run_s = max(0.0, lease_s - restore_s)
    if len(throughputs_steps_per_s) == 1:  # the common case, without the generic machinery
        rate = throughputs_steps_per_s[0]
        done = min(int(rate * run_s), steps_remaining[0])
        return (done,), restore_s + (done / rate if rate > 0 else 0.0)
    steps = tuple(min(int(t * run_s), r) for t, r in zip(throughputs_steps_per_s, steps_remaining, strict=True))
    duration_s = max((n / t for n, t in zip(steps, throughputs_steps_per_s, strict=True) if t > 0), default=0.0)
    return steps, restore_s + max(0.0, duration_s)


def full_lease(
    table: ThroughputTable, job_type: str, scale_factor: int, accelerator_type: str, lease_s: float, restore_s: float
) -> tuple[float, tuple[int], float]:
    """(steps/s, steps, seconds) of one job's lease, alone on ``accelerator_type``, when it has at
    least those steps left: ``lease_outcome``'s answer for any such job (the min then takes the
    lease's own steps), the same floats, so a run can look it up per (job type, scale factor,
    accelerator type, restore) instead of working it out per lease. A job with fewer steps left
    takes ``lease_outcome`` with the rate."""
    rate = true_rates(table, (job_type,), scale_factor, accelerator_type)[0]
    steps, duration_s = lease_outcome((rate,), (sys.maxsize,), lease_s, restore_s)
    return rate, steps, duration_s  # type: ignore[return-value]
