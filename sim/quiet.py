"""Exact skipping of quiet rounds in the bus-free path (sim/fastpath.py).

Most of a long run's rounds change nothing but the clock: no job arrives, none finishes or
fails, the allocation is not recomputed, and every lease is extended. At such a boundary the
planner would make last round's plan again (mechanism_service/core/quiet.py says when that can
be shown), so the loop runs that plan without planning it: it settles, dispatches and records
the round as always (the same arithmetic in the same order: steps, received time, ledgers,
costs, extension counts, round records), and replays only what planning writes.

A boundary is advanced so only when it is quiet (``quiet_here``) and, while one of the plan's
entries could still be held by a move it has not paid for (planning/holds.py reads last
round's assignment in its order), only when every boundary until none can be is quiet too
(``_quiet_ahead``), so no boundary that is planned again depends on the order of a plan that was
not made afresh. ``SkipMispredicted`` is raised if that promise is ever broken: it would be a
bug here, never a property of the input.

``--no-skip-quiet-rounds`` (RunConfig.skip_quiet_rounds) plans every round: the same jobs.csv
and summary.json, byte for byte (tests/sim/test_quiet_rounds.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from common.errors import GavelError
from mechanism_service.core.allocation import reset_due
from mechanism_service.core.model import MechanismState
from mechanism_service.core.planning.picking import type_order
from mechanism_service.core.quiet import (
    DrawnPlans,
    drawn_plan,
    drawn_plans,
    moves_with_the_draw,
    replay,
    rounds_until_hold_free,
    steady_plan,
)
from mechanism_service.core.reducers import LeaseResult
from mechanism_service.core.rounds import RoundPlan
from mechanism_service.core.seams.chosen import Chosen
from mechanism_service.core.settings import MechanismSettings
from sim.traces import TraceJob

# (job type, scale factor, accelerator type, restore s) -> (steps/s, (steps,), seconds): the loop's
# cache of a single job's full lease (fastpath.FullLeases)
FullLease = Callable[[tuple[str, int, str, float]], tuple[float, tuple[int], float]]


class SkipMispredicted(GavelError):
    """A boundary promised quiet was not: the skip's own bug (module docstring)."""


@dataclass(slots=True)
class QuietRounds:
    """Which boundaries the loop advances without planning, and the plan it runs there."""

    settings: MechanismSettings
    chosen: Chosen
    enabled: bool = True
    steady: RoundPlan | None = None  # the plan the next quiet boundary repeats
    allocation: object = None  # the allocation that plan was shown steady under
    promised: int = 0  # boundaries after the last one advanced that must be quiet too
    advanced: int = 0  # boundaries advanced without planning
    drawn: DrawnPlans | None = None  # the plans the next quiet boundaries' draws make, instead
    # (the allocation, (next job index, jobs), their DrawnPlans, whether some job goes where the type
    # order's draw says: core/quiet.moves_with_the_draw), kept until the allocation or the jobs change
    moving: tuple[object, tuple[int, int], DrawnPlans | None, bool] | None = None
    # sim/quiet_drawn.py's leases of the drawn plans' entries: (the plans, the entries, the leases)
    drawn_leases: tuple[DrawnPlans, list, object] | None = None

    def planned(self, state: MechanismState, plan: RoundPlan) -> None:
        """A boundary was planned: whether its plan repeats at the next quiet ones."""
        if self.promised:
            raise SkipMispredicted(f"a boundary promised quiet was planned ({self.promised} promised)")
        self.steady = self.drawn = None
        self.allocation = state.allocation
        if not self.enabled:
            return
        if self.settings.shuffle_type_order:  # jobs that go where the draw says, remembered while nothing changes
            jobs = (state.next_index, len(state.jobs))
            if self.moving is None or self.moving[0] is not state.allocation or self.moving[1] != jobs:
                moving = moves_with_the_draw(state, self.settings)
                self.moving = (state.allocation, jobs, drawn_plans(state, self.settings, self.chosen) if moving else None, moving)
            if self.moving[3]:
                if not (plan.jobs_waiting or plan.profiled or plan.seam_errors):
                    self.drawn = self.moving[2]
                return
        self.steady = steady_plan(state, plan, self.settings, self.chosen)

    @property
    def armed(self) -> bool:
        """Whether the next quiet boundary may run without planning."""
        return self.steady is not None or self.drawn is not None

    def settled_cleanly(self, state: MechanismState, running: Sequence[LeaseResult], round_start_s: float) -> bool:
        """Whether settling ``running`` (before it is settled) can fail no lease: every lease one
        job's, with at least a step a GPU and time run (settle.py's failure test cannot hold)."""
        jobs = state.jobs
        for lease in running:
            job = jobs.get(lease.entry[0])
            if len(lease.entry) != 1 or job is None or lease.steps[0] < job.scale_factor or not lease.finish_s > round_start_s:
                return False
        return True

    def plan_for(
        self, state: MechanismState, now_s: float, quiet_here: bool, arrivals: deque[TraceJob], lag_s: float,
        full_lease: FullLease, shuffle: Callable[[list[str]], None],
    ) -> RoundPlan | None:
        """The plan to run at this boundary without planning it (after replaying what planning
        writes), or None: plan it. ``quiet_here``: nothing arrived, finished, failed or reset
        here, and the admission queue is empty."""
        steady = self.steady
        if self.drawn is not None and quiet_here and state.allocation is self.allocation:
            order = type_order(state, self.settings)
            shuffle(order)  # open_round's draw: it alone says where each job goes (core/quiet.drawn_plans)
            plan = drawn_plan(state, self.drawn, order)
            replay(state, plan, now_s, self.settings, None)
            self.advanced += 1
            return plan
        if steady is None or not quiet_here or state.allocation is not self.allocation:
            if self.promised:
                raise SkipMispredicted(f"t={now_s:.3f} s: a boundary promised quiet is not")
            return None
        ahead = rounds_until_hold_free(state, steady, self.settings)  # (before this boundary's stretch: one less after)
        ahead = max(0, int(ahead) - 1) if ahead != float("inf") else ahead
        if ahead > self.promised - 1 and not self._quiet_ahead(state, steady, now_s, ahead, arrivals, lag_s, full_lease):
            if self.promised:
                raise SkipMispredicted(f"t={now_s:.3f} s: a boundary promised quiet is not")
            return None
        self.promised = max(self.promised - 1, int(ahead))
        replay(state, steady, now_s, self.settings, shuffle)
        self.advanced += 1
        return steady

    def _quiet_ahead(
        self, state: MechanismState, plan: RoundPlan, now_s: float, count: float, arrivals: deque[TraceJob],
        lag_s: float, full_lease: FullLease,
    ) -> bool:
        """Whether the ``count`` boundaries after this one will be quiet if this one runs
        ``plan``: every lease a full one that leaves steps to run and fails no test of settle.py,
        no arrival by then, no reset due then (the round's end is fastpath's: the latest lease's
        finish, then the boundary's lag)."""
        if count == float("inf"):
            return False
        count = int(count)
        jobs = state.jobs
        longest_s = 0.0
        for entry, placement in plan.assignment.items():
            job = jobs[entry[0]]
            _, (steps,), duration_s = full_lease((job.job_type, job.scale_factor, placement.accelerator_type, 0.0))
            if steps < job.scale_factor or job.total_steps - job.steps_done <= count * steps:
                return False
            longest_s = max(longest_s, duration_s)
        next_arrival_s = arrivals[0].arrival_time_s if arrivals else float("inf")
        t_s = now_s
        for _ in range(count):
            t_s = (t_s + longest_s) + lag_s
            if next_arrival_s <= t_s or reset_due(state, t_s, self.settings):
                return False
            if state.resolve_at_s is not None and t_s >= state.resolve_at_s:
                return False
        return True
