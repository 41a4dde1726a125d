"""The optimum of a packed program without every pair variable: column generation.

When every job has its own throughput row, classes are single jobs and the class pairs are the
job pairs: O(n^2) pair variables (1.1 M x 3 types at 2,048 jobs), almost all of them zero at the
optimum (a job packs with a handful of partners). Column generation solves the same program:

1. solve the *restricted* program: every x variable, only the pair columns generated so far
   (none at first, or the pairs of the previous allocation: a warm start across rounds);
2. from its dual prices, compute every candidate column's reduced gain in one vectorised pass
   (below); a column whose gain exceeds its cost would raise the objective if added;
3. add the most improving ones (a few per class), drop the present ones priced well below
   their cost (nonbasic: they only slow the simplex pivots down, and are priced again with the
   rest every round), solve again; stop when none improves.

Pair variables enter every program linearly (a job's steps/s, a job's time, a type's GPUs), so
for the convex programs here (LPs, and FTF's inv_pos rows) the KKT conditions of the restricted
optimum, extended by zeros, are those of the full program exactly when no column has a positive
reduced gain: the answer is the full program's optimum, not an approximation (POP is the
approximate option). With a relative tolerance ``eps`` on "improves", the objective is within
``eps`` (relative) of the full program's: scaling the budget and GPU prices by 1 + eps gives
a dual-feasible point of the full program whose bound is (1 + eps) times the restricted value.

Reduced gain of column (p, k) packing classes a and b on type k, from the policy's prices:

    gain = pi_a * T'[p, k, a] * m_a + pi_b * T'[p, k, b] * m_b    (objective per unit time)
    cost = beta_a * m_a + beta_b * m_b + gamma_k * s_p
    m_c = 1 / |c| (2 / |a| for a self pair (a, a), no b term)

pi_c: what one more steps/s of one job of class c is worth to the objective (d objective / d
throughput: the fairness row's dual times the fairness coefficient for max-min; for FTF the
dual times the derivative of inv_pos at the solution); beta_c: the dual of class c's time row;
gamma_k: the dual of type k's GPUs; s_p: the pair's gang (GPUs).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from policy_service.core.allocation import Status
from policy_service.core.formulation import Space

# A column improves when gain > cost * (1 + RELATIVE_TOLERANCE): the objective is then within
# this relative distance of the full program's optimum (module docstring); the solver's own
# accuracy (CLARABEL: 1e-8) is the floor below which the prices say nothing.
RELATIVE_TOLERANCE = 1e-7
# Columns added per class and round (as either member of the pair): a job packs with few
# partners at the optimum; more per round means fewer rounds but larger restricted programs.
COLUMNS_PER_CLASS = 2
MAX_ROUNDS = 200
# A present column whose gain is below (1 - DROP_RELATIVE) x its cost is dropped from the next
# restricted program (it is nonbasic: a basic column's gain equals its cost). Most of a simplex
# pivot's time is proportional to the program's columns (highs_columns.py).
DROP_RELATIVE = 0.1


@dataclass(frozen=True)
class Prices:
    """The restricted program's dual prices, in the objective's sense (larger gain = better).

    throughput (C,): objective per steps/s of one job of class c; budget (C,): per unit of one
    job's time; usage (K,): per GPU of type k. All >= 0 at an optimum."""

    throughput: np.ndarray
    budget: np.ndarray
    usage: np.ndarray


@dataclass(frozen=True)
class Restricted:
    """One solve of a restricted program: the variable values, the objective, and the prices
    (None when the solve did not reach an optimum)."""

    values: np.ndarray | None
    objective: float | None
    status: Status
    reason: str
    timings: Mapping[str, float]
    prices: Prices | None


@dataclass(frozen=True, eq=False)
class Candidates:
    """Every allowed pool column as flat arrays, built once per solve (the rounds only gather
    prices into them: ~2.2 M columns at 2,048 jobs, where the (P, K) grid has 6.7 M cells).

    column (E,): the column's cell p * K + k of the pool's (P, K) grid; first, second (E,): the
    two classes (equal for a self pair); first_share, second_share (E,): m_a and m_b of the
    module docstring; first_steps, second_steps (E,): T' m of each member; gpus (E,): the gang."""

    column: np.ndarray
    type: np.ndarray
    first: np.ndarray
    second: np.ndarray
    first_share: np.ndarray
    second_share: np.ndarray
    first_steps: np.ndarray
    second_steps: np.ndarray
    gpus: np.ndarray

    @staticmethod
    def of(space: Space) -> Candidates:
        pool = space.pool
        assert pool is not None
        row, k = np.nonzero(pool.allowed)
        a, b = pool.pairs.pairs[row, 0], pool.pairs.pairs[row, 1]
        sizes = space.classes.sizes.astype(float)
        same = a == b
        m_a = np.where(same, 2.0, 1.0) / sizes[a]
        m_b = np.where(same, 0.0, 1.0 / sizes[b])
        packed = pool.pairs.throughputs_steps_per_s[row, k]  # (E, 2)
        return Candidates(
            column=row * pool.allowed.shape[1] + k, type=k, first=a, second=b, first_share=m_a, second_share=m_b,
            first_steps=packed[:, 0] * m_a, second_steps=packed[:, 1] * m_b, gpus=space.class_scale_factors[a],
        )

    def gains_and_costs(self, prices: Prices) -> tuple[np.ndarray, np.ndarray]:
        """(E,) gain and (E,) cost of every candidate at these prices (module docstring)."""
        gain = prices.throughput[self.first] * self.first_steps
        gain += prices.throughput[self.second] * self.second_steps
        cost = prices.budget[self.first] * self.first_share
        cost += prices.budget[self.second] * self.second_share
        cost += prices.usage[self.type] * self.gpus
        return gain, cost

    def grid(self, selected: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
        """(E,) bool -> the pool's (P, K) bool grid."""
        out = np.zeros(shape[0] * shape[1], dtype=bool)
        out[self.column[selected]] = True
        return out.reshape(shape)


def choose_columns(candidates: Candidates, gains: np.ndarray, present: np.ndarray) -> np.ndarray:
    """(E,) bool: the improving candidates not yet present ((E,) reduced gains and presence),
    at most COLUMNS_PER_CLASS per class as each member (the best first), so every class with an
    improving partner gets one."""
    improving = np.flatnonzero((gains > 0) & ~present)
    chosen = np.zeros(len(gains), dtype=bool)
    if len(improving) == 0:
        return chosen
    by_value = improving[np.argsort(-gains[improving], kind="stable")]
    for member_of in (candidates.first, candidates.second):
        member = member_of[by_value]
        order = np.argsort(member, kind="stable")  # by class, best first within each class
        grouped = member[order]
        rank = np.arange(len(order)) - np.searchsorted(grouped, grouped, "left")
        chosen[by_value[order[rank < COLUMNS_PER_CLASS]]] = True
    return chosen


def previous_columns(space: Space) -> np.ndarray:
    """(P, K) bool: the pool columns the previous allocation used (a warm start), if any."""
    previous = space.problem.previous
    if previous is None:
        return np.zeros(space.pool.allowed.shape, dtype=bool)  # type: ignore[union-attr]
    return job_pair_columns(space, previous.pair_jobs, previous.pair_fractions)


def job_pair_columns(space: Space, pair_jobs: np.ndarray, pair_fractions: np.ndarray) -> np.ndarray:
    """(P, K) bool: the pool columns of job pairs (m, 2) used on the types where (m, K) > 0."""
    pool = space.pool
    assert pool is not None
    seed = np.zeros(pool.allowed.shape, dtype=bool)
    if len(pair_jobs) == 0 or pool.pairs.num_pairs == 0:
        return seed
    cls = space.classes.class_of_job[np.asarray(pair_jobs, dtype=np.int64)]  # (m, 2)
    low, high = cls.min(axis=1), cls.max(axis=1)
    base = space.num_classes + 1
    codes = pool.pairs.pairs[:, 0] * base + pool.pairs.pairs[:, 1]  # sorted (pair_classes)
    wanted = low * base + high
    position = np.clip(np.searchsorted(codes, wanted), 0, len(codes) - 1)
    found = codes[position] == wanted
    used = np.asarray(pair_fractions)[found] > 0
    rows = np.repeat(position[found], used.shape[1])[used.reshape(-1)]
    types = np.tile(np.arange(used.shape[1]), int(found.sum()))[used.reshape(-1)]
    seed[rows, types] = True
    return seed & pool.allowed


def column_codes(space: Space) -> np.ndarray:
    """(V,) a name for each variable of a restricted space that stays the same across rounds:
    x variables by index, the pool column (r, k) as num_x + r * K + k."""
    assert space.pool is not None and space.pool_rows is not None
    codes = np.arange(space.num_vars, dtype=np.int64)
    p_idx, k_idx = np.nonzero(space.pair_index >= 0)
    codes[space.pair_index[p_idx, k_idx]] = space.num_x + space.pool_rows[p_idx] * space.problem.num_types + k_idx
    return codes


def solve_by_columns(
    space: Space, restricted: Callable[[Space], Restricted], seed: np.ndarray | None = None
) -> tuple[Space, Restricted, dict[str, float]]:
    """Column generation (module docstring) from the previous allocation's columns and ``seed``
    ((P, K) bool, e.g. job_pair_columns of a related problem's answer): the final restricted
    space, its solve, and timings (rounds, columns, pricing time summed)."""
    assert space.pool is not None
    started = time.perf_counter()
    candidates = Candidates.of(space)
    shape = space.pool.allowed.shape
    grid = previous_columns(space)
    if seed is not None:
        grid |= seed & space.pool.allowed
    present = grid.reshape(-1)[candidates.column]
    pricing_s, solver_s = time.perf_counter() - started, 0.0
    added, dropped = int(present.sum()), 0
    current = space.with_pairs(grid)
    converged = False
    result = restricted(current)
    for rounds in range(1, MAX_ROUNDS + 1):
        solver_s += float(result.timings.get("solve_call_s", 0.0))
        if result.prices is None:  # no optimum: report what the solver said
            break
        started = time.perf_counter()
        gain, cost = candidates.gains_and_costs(result.prices)
        chosen = choose_columns(candidates, gain - (1.0 + RELATIVE_TOLERANCE) * cost, present)
        if not chosen.any():
            pricing_s += time.perf_counter() - started
            converged = True
            break
        # Columns the prices price well below their cost are nonbasic: out of the next program
        # (smaller pivots); the next rounds price them again with the rest.
        stale = present & (gain < (1.0 - DROP_RELATIVE) * cost)
        dropped += int(stale.sum())
        present &= ~stale
        present |= chosen
        added += int(chosen.sum())
        grid = candidates.grid(present, shape)
        pricing_s += time.perf_counter() - started
        current = space.with_pairs(grid)
        result = restricted(current)
    timings = {
        **dict(result.timings),
        "solve_call_s": solver_s,
        "pricing_s": pricing_s,
        "iterations": float(rounds),
        "pair_columns": float(present.sum()),
        "columns_added": float(added),
        "columns_dropped": float(dropped),
        "candidate_columns": float(space.pool.num_columns),
    }
    if result.prices is not None and not converged:
        reason = f"column generation stopped after {MAX_ROUNDS} rounds with improving columns left"
        result = Restricted(result.values, result.objective, Status.OPTIMAL_INACCURATE, reason, timings, result.prices)
    return current, result, timings
