"""The mechanism's metrics (docs/metrics.md, "Mechanism") on a registry it is given.

Two kinds. What happens (rounds, leases, submissions, job ends, losses, restores) is counted by
the collaborators as it happens, one call each: cheap, a few counter increments per boundary.
What is (jobs per state and per reason, GPUs per type, the allocation's age, workers) is read
from the memory when Prometheus scrapes (core/gauges.py), so the round loop pays nothing for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from common.metrics import (
    CollectorRegistry,
    FunctionCollector,
    GaugeMetricFamily,
    LoopMetrics,
    Spread,
    Tally,
    build_info,
    registry_or_private,
)
from mechanism_service.core import gauges
from mechanism_service.core.endings import Ending
from mechanism_service.core.memory import MemoryCell
from mechanism_service.core.model import MechanismState
from mechanism_service.core.rounds import RoundPlan

# Mechanism seconds: a job's life, from a minute to weeks.
LIFETIME_BUCKETS_S = (60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0, 172800.0, 604800.0, float("inf"))
ROUND_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, float("inf"))
RESTORE_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, float("inf"))
RUN, EXTEND, REJECTED = ("run",), ("extend",), ("rejected",)
SUBMISSION_OUTCOMES = {"new": ("accepted",), "known": ("duplicate",), "conflict": REJECTED, "refused": REJECTED}


class MechanismMetrics:
    def __init__(
        self, registry: CollectorRegistry | None = None, *, wall: Callable[[], float] = time.perf_counter,
        wall_per_mechanism_s: float = 1.0,
    ) -> None:
        self.registry = r = registry_or_private(registry)
        self.wall = wall
        self._wall_per_mechanism_s = wall_per_mechanism_s  # 1 / --time-scale: lags said in wall seconds
        build_info(r, "mechanism")
        # counted on the loop's thread in plain numbers (common/metrics.py: Tally, Spread), read
        # there when scraped: what a boundary and a submission pay is a few dict updates
        m = LoopMetrics(r)
        self.rounds = m.add(Tally("gavel_mechanism_rounds", "rounds started: leases went out"))
        self.round_duration = m.add(Spread(
            "gavel_mechanism_round_duration_seconds", "wall time of one boundary: settle, admit, solve if due, plan, send",
            ROUND_BUCKETS_S,
        ))
        self.boundary_lag = m.add(Spread(
            "gavel_mechanism_round_boundary_lag_seconds", "how late a boundary was handled after its round's end was due",
            ROUND_BUCKETS_S,
        ))
        self.leases = m.add(Tally("gavel_mechanism_leases", "leases sent, per command", ("command",), known=[("run",), ("extend",)]))
        self.submissions = m.add(Tally(
            "gavel_mechanism_submissions", "submissions received, per outcome", ("outcome",),
            known=[("accepted",), ("duplicate",), ("rejected",)],
        ))
        self.job_ends = m.add(Tally(
            "gavel_mechanism_job_ends", "jobs that ended, per outcome", ("outcome",),
            known=[("completed",), ("failed",), ("cancelled",), ("rejected",)],
        ))
        self.completion = m.add(Spread(
            "gavel_mechanism_job_completion_seconds", "JCT of completed jobs (mechanism seconds)", LIFETIME_BUCKETS_S
        ))
        self.admission_wait = m.add(Spread(
            "gavel_mechanism_admission_wait_seconds", "from a job's arrival to its first run (mechanism seconds)",
            LIFETIME_BUCKETS_S,
        ))
        self.restore = m.add(Spread(
            "gavel_mechanism_restore_seconds", "a job's restore from its checkpoint, as its worker measured it", RESTORE_BUCKETS_S
        ))
        self.worker_losses = m.add(Tally("gavel_mechanism_worker_losses", "workers declared lost"))
        self.gpu_seconds = m.add(Tally(
            "gavel_mechanism_gpu_seconds", "GPU time leased (mechanism seconds)", ("accelerator_type",)
        ))
        self.profiling_gpu_seconds = m.add(Tally(
            "gavel_mechanism_profiling_gpu_seconds", "GPU time leased to runs the estimator asked for"
        ))
        self.journal_replay_s: float | None = None

    def watch(self, cell: MemoryCell, now_s: Callable[[], float]) -> None:
        """The state-like metrics, read from ``cell`` at scrape time."""
        self.registry.register(FunctionCollector(lambda: self._families(cell, now_s())))

    # -- what happens -----------------------------------------------------------------------------

    def round_done(
        self, began_wall: float, state: MechanismState, plan: RoundPlan, now_s: float, round_s: float, due_s: float | None
    ) -> None:
        """One boundary handled (``began_wall``: when its step 2 began); a round started if its
        plan leased anything. ``due_s``: when the round it closed was due to end, if one ran."""
        self.round_duration.observe(self.wall() - began_wall)
        if due_s is not None:
            self.boundary_lag.observe(max(now_s - due_s, 0.0) * self._wall_per_mechanism_s)
        if not plan.assignment:
            return
        self.rounds.inc()
        extended = 0
        profiled_gpu_s = 0.0
        per_type: dict[str, float] = {}  # summed first: one counter update per type, not per lease
        for entry, placement in plan.assignment.items():
            gpu_s = len(placement.worker_ids) * round_s
            per_type[placement.accelerator_type] = per_type.get(placement.accelerator_type, 0.0) + gpu_s
            if entry in plan.profiled:
                profiled_gpu_s += gpu_s
            if entry in plan.kept:
                extended += 1
                continue
            for i in entry:  # a job's first run is now: its wait for admission ends
                job = state.jobs.get(i)
                if job is not None and job.first_run_s == now_s:
                    self.admission_wait.observe(max(now_s - job.arrival_s, 0.0))
        for w, gpu_s in per_type.items():
            self.gpu_seconds.inc((w,), gpu_s)
        if profiled_gpu_s:
            self.profiling_gpu_seconds.inc((), profiled_gpu_s)
        self.leases.inc(EXTEND, extended)
        self.leases.inc(RUN, len(plan.assignment) - extended)

    def submitted(self, outcome: str) -> None:
        """A submission's receipt (core/intake.py's outcome, or "forged": not accepted)."""
        self.submissions.inc(SUBMISSION_OUTCOMES.get(outcome, REJECTED))

    def ended(self, ending: Ending) -> None:
        """A job left (core/endings.py); a refusal on receipt is a rejected submission instead."""
        if ending.outcome == "refused":
            return
        self.job_ends.inc((ending.outcome,))
        if ending.outcome == "completed" and ending.job is not None:
            self.completion.observe(max(ending.at_s - ending.job.arrival_s, 0.0))

    def worker_lost(self) -> None:
        self.worker_losses.inc()

    def restored(self, restore_s: float) -> None:
        if restore_s > 0.0:
            self.restore.observe(restore_s)

    # -- what is ----------------------------------------------------------------------------------

    def _families(self, cell: MemoryCell, now_s: float) -> Iterable[GaugeMetricFamily]:
        g = gauges.read(cell.memory, now_s)
        jobs = GaugeMetricFamily("gavel_mechanism_jobs", "jobs per state", labels=("state",))
        for name, n in g.jobs.items():
            jobs.add_metric((name,), n)
        pending = GaugeMetricFamily("gavel_mechanism_jobs_pending", "jobs not running, per reason code", labels=("reason",))
        for reason, n in sorted(g.pending.items()):
            pending.add_metric((reason,), n)
        gpus = GaugeMetricFamily("gavel_mechanism_gpus", "GPUs per type: busy, idle, lost", labels=("accelerator_type", "state"))
        for (w, state), n in sorted(g.gpus.items()):
            gpus.add_metric((w, state), n)
        allocated = GaugeMetricFamily(
            "gavel_mechanism_allocated_gpus", "GPUs the allocation in force gives out per type", labels=("accelerator_type",)
        )
        for w, n in sorted(g.allocated_gpus.items()):
            allocated.add_metric((w,), n)
        workers = GaugeMetricFamily("gavel_mechanism_workers", "workers per state", labels=("state",))
        for name, n in g.workers.items():
            workers.add_metric((name,), n)
        speed = GaugeMetricFamily(
            "gavel_mechanism_worker_speed_ratio", "a flagged worker's measured steps/s over what the estimates expected",
            labels=("worker_id",),
        )
        for worker_id, ratio in sorted(g.speed_ratio.items()):
            speed.add_metric((worker_id,), ratio)
        yield from (jobs, pending, gpus, allocated, workers, speed)
        yield GaugeMetricFamily("gavel_mechanism_policy_degraded", "1 while the allocation is kept because the policy does not answer", value=float(g.degraded))
        if g.allocation_age_s is not None:
            yield GaugeMetricFamily(
                "gavel_mechanism_allocation_age_mechanism_seconds", "since the allocation in force was solved",
                value=g.allocation_age_s,
            )
        if self.journal_replay_s is not None:
            yield GaugeMetricFamily(
                "gavel_mechanism_journal_replay_seconds", "the mechanism's restore from its journal at start",
                value=self.journal_replay_s,
            )
