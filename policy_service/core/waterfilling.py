"""Hierarchical max-min fairness by water filling (paper section 4.2; Gavel's
max_min_fairness_water_filling.py).

Levels are normalised throughputs u_j = throughput_j(X) / E_j (E_j: equal-share steps/s). Each
iteration raises every *active* job together, job j by t * w'_j / s_j, keeping every other job
at least where it is, with the largest t the cluster allows:

    maximize t  s.t.  u_j >= level_j + t * w'_j / s_j   (active j)
                      u_j >= level_j                     (frozen or waiting j)
                      cluster constraints

then freezes the jobs that cannot rise any further ("bottlenecked") and repeats until every job
is frozen. w'_j is the job's weight after entity reweighting, recomputed every iteration:
- no entities: the job's priority weight;
- an entity with policy "fairness": the entity weight, split over its unfrozen jobs in
  proportion to their priority weights;
- an entity with policy "fifo": the whole entity weight goes to its oldest unfrozen job; the
  others wait (weight 0) until it freezes.
A job with no entity when entities are defined is an entity of its own (weight = its priority
weight).

Bottleneck detection differs from Gavel's. Gavel solves a mixed-integer program (GLPK_MI) after
every iteration to find the largest set of jobs that can still rise; that MILP is where its
97 s at 2048 jobs go. Here the LP's own dual values decide: a job whose constraint has a
positive multiplier is tight in *every* optimal solution (complementary slackness), i.e. it
cannot rise without lowering another job — exactly the bottleneck condition. Interior-point
solvers return a strictly complementary pair, so every bottlenecked job shows a positive
multiplier; a job missed by the numerical threshold just stays active and is caught one
iteration later (where t = 0). One LP per level instead of an LP plus a MILP; the LP is
compiled once (cvxpy parameters) and re-solved with new levels and weights.

FIFO entities activate one job at a time, which would cost one LP per queued job. Once a FIFO
head freezes at level 0 (the cluster has nothing left for it), one extra LP asks whether *any*
job still waiting in a FIFO queue could get anything while every other job keeps its level; if
not, none of them ever can (levels only rise), so they all freeze at 0 at once — the same result
as activating them one by one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from policy_service.core.allocation import Allocation, Status, empty_allocation
from policy_service.core.baselines import equal_share_throughputs
from policy_service.core.fairness import check_variant, fairness_view
from policy_service.core.formulation import SolveOptions, Space, build_space
from policy_service.core.solving import solve
from policy_service.core.problem import FIFO, Problem
from policy_service.core.sparse import sp

if TYPE_CHECKING:  # annotations only: cvxpy is loaded when a program is built
    import cvxpy as cp

# A class is bottlenecked when its share of the LP's dual weight (the multipliers of the level
# constraints times their gains sum to 1) exceeds this, and its constraint is tight. Interior-
# point duals give a class that could still rise by a hair (relative slack ~1e-6) a share of
# ~1e-6; true bottlenecks carry shares of order 1 / (number of bottlenecked classes). A true
# bottleneck below the threshold is caught in the next iteration, where the rise is 0 and the
# dual weight moves to it.
_DUAL_SHARE_THRESHOLD = 1e-4
_TIGHT_RELATIVE = 1e-5
# Levels are re-imposed a hair lower (relative and absolute), so that the next LP keeps a
# nonempty interior: frozen jobs sit exactly where they cannot rise, which interior-point
# solvers handle badly when imposed without any slack.
_LEVEL_SLACK = 1e-6
_LEVEL_SLACK_ABS = 1e-9
# Normalised throughput below which a job counts as getting nothing.
_ZERO_LEVEL = 1e-7


def arrival_order(problem: Problem) -> np.ndarray:
    """(n,) rank of each job in arrival order (oldest first; ties by input order)."""
    order = np.lexsort((np.arange(problem.num_jobs), -problem.time_since_arrival_s))
    rank = np.empty(problem.num_jobs, dtype=np.int64)
    rank[order] = np.arange(problem.num_jobs)
    return rank


@dataclass(frozen=True, eq=False)
class _Entities:
    """Per class: entity index (a job without one gets its own), weight, policy, FIFO rank."""

    of_class: np.ndarray  # (C,)
    weight: np.ndarray  # (E,)
    is_fifo: np.ndarray  # (E,) bool
    rank: np.ndarray  # (C,) arrival rank of the class's first job


def _class_entities(problem: Problem, space: Space) -> _Entities:
    reps = space.classes.representative
    entity = problem.entity_of_job[reps].copy()
    weights = [e.weight for e in problem.entities]
    fifo = [e.policy == FIFO for e in problem.entities]
    if not problem.entities:
        # No hierarchy: every class is its own "entity" weighted by its jobs' priority weight.
        entity = np.arange(len(reps))
        weights = list(problem.priority_weights[reps] * space.classes.sizes)
        fifo = [False] * len(reps)
    else:
        orphans = np.flatnonzero(entity < 0)
        entity[orphans] = len(weights) + np.arange(len(orphans))
        weights += list(problem.priority_weights[reps[orphans]] * space.classes.sizes[orphans])
        fifo += [False] * len(orphans)
    return _Entities(entity, np.asarray(weights, float), np.asarray(fifo, bool), arrival_order(problem)[reps])


def job_weights(problem: Problem, space: Space, entities: _Entities, frozen: np.ndarray) -> np.ndarray:
    """(C,) weight w' of one job of each class this iteration (0: frozen or waiting its turn)."""
    sizes = space.classes.sizes.astype(float)
    own = problem.priority_weights[space.classes.representative]
    live = ~frozen
    total = np.zeros(len(entities.weight))
    np.add.at(total, entities.of_class[live], (own * sizes)[live])
    share = np.where(live, entities.weight[entities.of_class] * own / np.maximum(total[entities.of_class], 1e-300), 0.0)
    fifo_class = entities.is_fifo[entities.of_class]
    if fifo_class.any():
        # Only the oldest live job of a FIFO entity is active (FIFO classes are single jobs).
        candidates = np.flatnonzero(fifo_class & live)
        head = np.full(len(entities.weight), np.iinfo(np.int64).max)
        np.minimum.at(head, entities.of_class[candidates], entities.rank[candidates])
        is_head = entities.rank == head[entities.of_class]
        share = np.where(fifo_class, np.where(is_head & live, entities.weight[entities.of_class], 0.0), share)
    return share


@dataclass(frozen=True)
class WaterFilling:
    heterogeneity_aware: bool = True
    space_sharing: bool = False
    options: SolveOptions = field(default_factory=SolveOptions)
    name: str = "max_min_fairness_water_filling_perf"

    def allocate(self, problem: Problem) -> Allocation:
        import cvxpy as cp  # noqa: PLC0415 - loaded when a program is built, not when the package is imported
        started = time.perf_counter()
        if problem.num_jobs == 0:
            return empty_allocation(self.name, problem.job_ids, problem.worker_types)
        view = fairness_view(problem, self.heterogeneity_aware)
        fifo_entity = np.asarray([e.policy == FIFO for e in problem.entities] + [False], bool)
        # Jobs of a FIFO entity are never interchangeable (their order matters): own class each.
        fifo_id = np.where(fifo_entity[problem.entity_of_job], np.arange(problem.num_jobs), -1)
        space = build_space(
            view, packing=self.space_sharing, options=self.options,
            columns=[problem.priority_weights, problem.entity_of_job, fifo_id],
        )
        entities = _class_entities(problem, space)
        reps = space.classes.representative
        normalised = sp.diags(1.0 / equal_share_throughputs(view)[reps]) @ space.throughput()
        scale_factors = space.class_scale_factors

        num_classes = space.num_classes
        v = cp.Variable(space.num_vars, nonneg=True)
        rise = cp.Variable()
        floor = cp.Parameter(num_classes)
        gain = cp.Parameter(num_classes, nonneg=True)
        level_constraint = normalised @ v >= floor + cp.multiply(gain, rise)
        program = cp.Problem(cp.Maximize(rise), [level_constraint, *space.constraints(v)])
        waiting_mask = cp.Parameter(num_classes, nonneg=True)
        tail_program = cp.Problem(
            cp.Maximize(waiting_mask @ (normalised @ v)), [normalised @ v >= floor, *space.constraints(v)]
        )
        fifo_class = entities.is_fifo[entities.of_class]
        build_s = time.perf_counter() - started

        level = np.zeros(num_classes)
        frozen = np.zeros(num_classes, dtype=bool)
        values: np.ndarray | None = None
        status, reason = Status.OPTIMAL, ""
        timings = {"build_s": build_s, "compile_s": 0.0, "solver_s": 0.0, "iterations": 0.0}
        for _ in range(2 * num_classes + 1):  # each iteration freezes at least one class
            weights = job_weights(problem, space, entities, frozen)
            active = ~frozen & (weights > 0)
            if not active.any():
                break
            gains = np.where(active, weights / scale_factors, 0.0)
            floor.value = _floor(level)
            gain.value = gains
            outcome = solve(program, self.options)
            timings["iterations"] += 1
            timings["compile_s"] += outcome.timings.get("compile_s", 0.0)
            timings["solver_s"] += outcome.timings.get("solver_s", 0.0)
            if not outcome.status.startswith("optimal") or rise.value is None:
                status, reason = outcome.status, outcome.reason
                if values is None:
                    break
                status = Status.OPTIMAL_INACCURATE  # keep the last good iteration, as Gavel does
                reason = f"water filling stopped early: {outcome.reason}"
                break
            if outcome.status == Status.OPTIMAL_INACCURATE:
                status, reason = outcome.status, outcome.reason
            values = space.clean(v.value)
            achieved = normalised @ values  # feasible values, so min(level, achieved) is too
            step = max(float(rise.value), 0.0)
            level = np.minimum(np.where(active, level + step * gains, level), achieved)
            newly = _bottlenecked(level_constraint, achieved, level, gains, active)
            frozen |= newly
            waiting = fifo_class & ~frozen
            if (newly & fifo_class & (level <= _ZERO_LEVEL)).any() and waiting.any():
                floor.value = np.where(waiting, 0.0, _floor(level))
                waiting_mask.value = waiting.astype(float)
                tail = solve(tail_program, self.options)
                timings["iterations"] += 1
                timings["solver_s"] += tail.timings.get("solver_s", 0.0)
                nothing_left = tail_program.value is not None and tail_program.value <= _ZERO_LEVEL
                if tail.status.startswith("optimal") and nothing_left:
                    frozen |= waiting
        objective = None
        if values is not None:
            levels = (normalised @ space.clean(values)) * scale_factors / problem.priority_weights[reps]
            objective = float(levels.min())
        timings["solve_call_s"] = time.perf_counter() - started - build_s
        return space.allocation(
            values, policy=self.name, status=status if values is not None else Status.FAILED,
            objective=objective, started_s=started, reason=reason, timings=timings,
        )


def _floor(level: np.ndarray) -> np.ndarray:
    return np.maximum(level * (1 - _LEVEL_SLACK) - _LEVEL_SLACK_ABS, 0.0)


def _bottlenecked(
    constraint: cp.Constraint, achieved: np.ndarray, level: np.ndarray, gains: np.ndarray, active: np.ndarray
) -> np.ndarray:
    """(C,) active classes that cannot rise further (see the module docstring)."""
    dual = np.asarray(constraint.dual_value, dtype=float).reshape(-1)
    dual_share = np.clip(dual, 0.0, None) * gains
    tight = achieved <= level * (1 + _TIGHT_RELATIVE) + 1e-9
    result = active & tight & (dual_share > _DUAL_SHARE_THRESHOLD * max(dual_share.sum(), 1e-300))
    if not result.any():
        # Numerical safety: always freeze at least the class carrying the most dual weight.
        candidates = np.where(active, dual_share, -np.inf)
        result = np.zeros_like(active)
        result[int(np.argmax(candidates))] = True
    return result


def water_filling(
    heterogeneity_aware: bool = True,
    space_sharing: bool = False,
    *,
    solver: str = "CLARABEL",
    grouping: bool = True,
    exclude_oversized_gangs: bool = True,
    prune_dominated: bool = True,
    canon_backend: str | None = None,
    pair_variables: str = "auto",
) -> WaterFilling:
    """Hierarchical max-min fairness. Gavel: max_min_fairness_water_filling[_perf|_packed]."""
    check_variant(heterogeneity_aware, space_sharing)
    options = SolveOptions(
        solver, grouping, exclude_oversized_gangs, prune_dominated, canon_backend, pair_variables=pair_variables
    )
    suffix = "_packed" if space_sharing else ("_perf" if heterogeneity_aware else "")
    return WaterFilling(heterogeneity_aware, space_sharing, options, "max_min_fairness_water_filling" + suffix)
