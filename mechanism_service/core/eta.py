"""When a job should finish: its remaining steps over the throughput the allocation in force gives
it (docs/jobs.md, "When will it finish"). Pure; times on the mechanism's clock.

The expected throughput is the sum over the job's entries and types of the entry's share there
times the job's rate there as the mechanism believes it (the ledgers' throughputs: the table, or
the estimator's latest figures, refreshed at each solve); a packed entry counts at the job's
packed rate. That is the rate the policy planned for, and the rounds give each entry its share
over time, so ``remaining / rate`` is when the job finishes if the allocation holds.

The steps a job has done are known as of the last round boundary (its leases report at their
end), so the ETA counts from there (``since_s``: the running round's start), never earlier than
now: it stays put while a round runs instead of drifting a round later and jumping back.

It does not hold when jobs keep arriving (each solve shares the GPUs among more jobs) or leave
(fewer): so a range beside it, whose bounds are

- soonest: the job alone on its fastest type all the time (no allocation can do better, so it
  is a true bound while the rates are right);
- latest: the job going on as it has gone since it arrived, its waiting included (its steps done
  over the time since its arrival), when that is slower than the allocation's rate: the cluster
  has been as busy as that, and a backlog that keeps coming keeps it so. None for a job that has
  done no step yet: nothing says how long it may still wait.

No estimate (None, and why) when the allocation gives the job no share (new since the last
solve, degraded, or FIFO's queue) or the mechanism knows no rate for it there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from mechanism_service.core.model import JobState, MechanismState


@dataclass(frozen=True, slots=True)
class Eta:
    finish_s: float | None  # mechanism time it should finish at, if the allocation holds
    soonest_s: float | None
    latest_s: float | None  # None: no bound (it has done no step yet), or no estimate at all
    steps_per_s: float  # the allocation's expected rate (0: no estimate)
    basis: str  # in words: what it rests on, or why there is none


def allocation_rates(state: MechanismState) -> dict[int, float]:
    """Job index -> its expected steps/s under the allocation in force (only jobs it gives a
    share with a known rate). One pass over the allocation."""
    ledgers = state.entries
    rates: dict[int, float] = {}
    for entry, fractions in state.allocation.items():
        if entry not in ledgers:
            continue
        throughputs = ledgers[entry].throughputs
        for w, f in fractions.items():
            if f <= 0.0 or w not in ledgers.column_of:
                continue
            per_member = throughputs[w]
            for position, i in enumerate(entry):
                rate = per_member[position]
                if rate > 0.0:
                    rates[i] = rates.get(i, 0.0) + f * rate
    return rates


def finish_times(state: MechanismState | None, now_s: float, since_s: float | None = None) -> dict[str, float]:
    """Every admitted job the allocation gives a rate: job id -> when it should finish if the
    allocation holds (mechanism time). The cheap form, for `gavel jobs`."""
    if state is None:
        return {}
    rates = allocation_rates(state)
    jobs = state.jobs
    start_s = now_s if since_s is None else min(since_s, now_s)
    return {
        jobs[i].job_id: max(now_s, start_s + max(0, jobs[i].steps_remaining) / rate) for i, rate in rates.items() if i in jobs
    }


def job_eta(
    state: MechanismState, job: JobState, now_s: float, *, rate: float | None = None, since_s: float | None = None
) -> Eta:
    """The job's ETA with its range and basis (``rate``: its allocation rate when the caller has
    it from ``allocation_rates``; ``since_s``: when its steps done were counted, the running
    round's start; now when not given)."""
    remaining = max(0, job.steps_remaining)
    if rate is None:
        rate = allocation_rates(state).get(job.index, 0.0)
    start_s = now_s if since_s is None else min(since_s, now_s)
    best = _best_rate(state, job.index)
    soonest_s = max(now_s, start_s + remaining / best) if best > 0 else None
    if rate <= 0.0:
        has_share = any(job.index in e and any(f > 0.0 for f in fr.values()) for e, fr in state.allocation.items())
        why = "the mechanism knows no rate for it where its share is" if has_share else "the allocation in force gives it no share"
        return Eta(None, soonest_s, None, 0.0, f"no estimate: {why}")
    finish_s = max(now_s, start_s + remaining / rate)
    elapsed_s = start_s - job.arrival_s
    latest_s: float | None = None
    if job.steps_done > 0 and elapsed_s > 0:
        so_far = job.steps_done / elapsed_s
        latest_s = max(finish_s, start_s + remaining / so_far)
    shares = {w: f for w, f in state.allocation.get((job.index,), {}).items() if f > 0.0}
    packed = any(len(e) == 2 and job.index in e and any(f > 0 for f in fr.values()) for e, fr in state.allocation.items())
    basis = (
        f"{remaining} steps left at {rate:.4g} steps/s: its share of the allocation in force"
        f"{' (' + _shares(shares) + ')' if shares else ''}{', packed entries at their packed rate' if packed else ''}"
        " times its rate on each type, if the allocation holds"
    )
    return Eta(finish_s, soonest_s, latest_s, rate, basis)


def _best_rate(state: MechanismState, index: int) -> float:
    ledger = state.entries.get((index,))
    if ledger is None:
        return 0.0
    best = max((ledger.throughputs[w][0] for w in state.gpus), default=0.0)
    return best if math.isfinite(best) else 0.0


def _shares(shares: Mapping[str, float]) -> str:
    return ", ".join(f"{w} {f:.2f}" for w, f in sorted(shares.items(), key=lambda kv: -kv[1]))


def as_fields(eta: Eta) -> dict[str, object]:
    """What `gavel job` carries of it: ``eta_s`` (mechanism time; None: no estimate), the range
    and the basis."""
    def rounded(t: float | None) -> float | None:
        return round(t, 3) if t is not None else None

    return {
        "eta_s": rounded(eta.finish_s),
        "eta_range_s": [rounded(eta.soonest_s), rounded(eta.latest_s)],
        "eta_steps_per_s": round(eta.steps_per_s, 6),
        "eta_basis": eta.basis,
    }
