"""Themis: finish-time fairness by partial-allocation auctions.

Mahajan et al., "Themis: Fair and Efficient GPU Cluster Scheduling", NSDI 2020, sections 4-5.
Each job's finish-time fairness is ``rho_j = T_shared / T_isolated``: the time it will have
taken at the share it has, over the time it would have taken on its isolated share (1/n of the
cluster; ftf.py's denominator, ``I_j + R_j / T_iso_j``):

    rho_j(x) = (t_j + R_j / T_j(x)) / (I_j + R_j / T_iso_j),   T_j(x) = sum_k x_jk T_jk

At each solve (Themis: each lease's end):

1. the ``1 - f`` fraction of jobs with the worst (largest, times their weight) rho under the
   allocation in force bid (a job not in it has rho = inf: new jobs bid first), at most
   ``max_bidders`` of them (MAX_BIDDERS, below); the fairness knob ``f`` (``fairness_knob``)
   trades fairness for efficiency;
2. a partial-allocation (PA) auction among the bidders (Cole, Gkatzelis and Goel, EC 2013):
   the proportionally fair allocation x* of the whole cluster, maximising
   ``sum_i w_i log V_i(x)`` with each bid's valuation ``V_i = 1 / rho_i``, then bidder i keeps
   the fraction ``c_i = prod_{j != i} V_j(x*) / prod_{j != i} V_j(x*_{-i})`` of its x*_i, where
   x*_{-i} is the proportionally fair allocation without i (the hidden payment that makes
   bidding one's true rho the best strategy);
3. the leftover (what the payments withheld, and what the bidders could not use) goes to the
   jobs that did not bid, in equal parts (each 1/m of every type's leftover it can run on, as
   the isolated share), then what they cannot use to them worst rho first, each on its fastest
   type with room, up to all of its time; what is still left returns to the bidders, up to x*.

Convex: ``V_i`` is concave and increasing in T_i, so ``log V_i`` is, written for the solver as
``log(1 - inv_pos(1 + a_i T_i / T_iso_i))`` plus a constant (``a_i = t_i T_iso_i / R_i``; a
bidder that has barely waited, ``a_i`` < 1e-3, as ``log(T_i / T_iso_i)``, its limit). The
auction's m + 1 programs (x* and each x*_{-i}) are solved as one: their variables are disjoint
blocks of one exponential-cone program.

- heterogeneity-aware (``themis_perf``): the valuations read each type's steps/s, so the auction
  gives each bidder the types it gains most on;
- agnostic (``themis``): every type runs each job at its speed on the reference type (v100 when
  present), as agnostic FTF; any type is as good as another.

Where it differs from Gavel's FTF (``finish_time_fairness``, ftf.py): Gavel solves one program
over every job, ``min max_j w_j rho_j``, a global min-max that every job takes part in; Themis
lets only the worst ``1 - f`` bid, maximises the product of their ``1 / rho`` (proportional
fairness, not min-max), charges each bidder the share its presence costs the others (so its
bidders get less than x*) and shares the rest among the jobs that did not bid. Gavel's LP
is the allocation Themis approximates over many leases with f -> 1 and no payments.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from policy_service.core.allocation import (
    Allocation,
    PairShares,
    Status,
    _readonly,
    empty_allocation,
)
from policy_service.core.baselines import (
    agnostic_reference_throughputs,
    isolated_throughputs,
)
from policy_service.core.formulation import SolveOptions
from policy_service.core.problem import Problem
from policy_service.core.solving import solve
from policy_service.core.sparse import sp
from policy_service.core.srtf import runnable_types

# Below this a_i (waited time over the remaining time alone on its isolated share) a bidder's
# valuation is taken as linear in its throughput: 1 - 1/(1 + z) loses digits as z -> 0.
LINEAR_BELOW = 1e-3

# At most this many jobs bid in one auction. Its m + 1 programs (x* and each x*_{-i}) grow as m^2:
# 60 bidders solve in about a second, 300 (1,500 jobs at f = 0.8) take ~24 s and ~1 GB a solve.
# Themis itself auctions only the GPUs of the leases that just ended, among the jobs then worst
# off; the cap keeps an auction to such a group while the worst-off still bid first.
MAX_BIDDERS = 64


def rho(problem: Problem, fractions: np.ndarray, baseline: np.ndarray) -> np.ndarray:
    """(n,) each job's rho under ``fractions`` (n, K) time shares; inf for a job given none."""
    speed = (fractions * problem.throughputs_steps_per_s).sum(axis=1)
    isolated_s = problem.isolated_time_s + problem.steps_remaining / np.maximum(baseline, 1e-300)
    with np.errstate(divide="ignore", invalid="ignore"):
        shared_s = problem.time_since_arrival_s + np.where(
            problem.steps_remaining > 0, problem.steps_remaining / speed, 0.0
        )
        return np.where(np.isfinite(shared_s), shared_s / np.maximum(isolated_s, 1e-300), np.inf)


def bidders(problem: Problem, baseline: np.ndarray, fairness_knob: float, max_bidders: int = MAX_BIDDERS) -> np.ndarray:
    """Indices of the ceil((1 - f) n) jobs (at least one, at most ``max_bidders``) with the worst
    w x rho under the allocation in force, worst first (ties: oldest first)."""
    previous = problem.previous.job_fractions if problem.previous is not None else np.zeros(
        (problem.num_jobs, problem.num_types)
    )
    worst = rho(problem, previous, baseline) * problem.priority_weights
    count = min(max_bidders, max(1, math.ceil((1.0 - fairness_knob) * problem.num_jobs - 1e-9)))
    order = np.lexsort((np.arange(problem.num_jobs), -problem.time_since_arrival_s, -worst))
    return order[:count]


@dataclass(frozen=True)
class Auction:
    """The PA auction's outcome over its m bidders: x* (m, K), each bidder's kept fraction c (m,)."""

    proportionally_fair: np.ndarray
    kept: np.ndarray
    status: Status
    reason: str
    timings: dict[str, float]


def auction(problem: Problem, jobs: np.ndarray, baseline: np.ndarray, options: SolveOptions) -> Auction:
    """The PA auction among ``jobs`` (problem rows): x* and every x*_{-i} in one program."""
    import cvxpy as cp  # loaded when a program is built, not when the package is imported

    started = time.perf_counter()
    m, num_types = len(jobs), problem.num_types
    tput = problem.throughputs_steps_per_s[jobs]
    unit = np.maximum(baseline[jobs], 1e-300)
    steps = problem.steps_remaining[jobs]
    waited = problem.time_since_arrival_s[jobs]
    weights = problem.priority_weights[jobs]
    # Copies: 0 is the whole auction, c >= 1 the auction without bidder c - 1. Rows are the
    # (copy, bidder) pairs present; cells the rows' runnable types: the program's variables.
    copy_of = np.repeat(np.arange(m + 1), m)
    bidder_of = np.tile(np.arange(m), m + 1)
    present = copy_of != bidder_of + 1
    copy_of, bidder_of = copy_of[present], bidder_of[present]
    rows = len(copy_of)
    allowed = runnable_types(problem)[jobs][bidder_of]  # (rows, K)
    row_of_cell, type_of_cell = np.nonzero(allowed)
    cells = len(row_of_cell)
    ones = np.ones(cells)
    relative = (tput[bidder_of[row_of_cell], type_of_cell] / unit[bidder_of[row_of_cell]])
    speed = sp.csr_matrix((relative, (row_of_cell, np.arange(cells))), shape=(rows, cells))  # T / T_iso per row
    time_rows = sp.csr_matrix((ones, (row_of_cell, np.arange(cells))), shape=(rows, cells))
    gpus = problem.scale_factors[jobs][bidder_of[row_of_cell]].astype(float)
    capacity = sp.csr_matrix(
        (gpus, (copy_of[row_of_cell] * num_types + type_of_cell, np.arange(cells))), shape=((m + 1) * num_types, cells)
    )
    x = cp.Variable(cells, nonneg=True)
    a = waited * unit / np.maximum(steps, 1e-300)
    busy = steps[bidder_of] > 0
    curved = np.flatnonzero(busy & (a[bidder_of] >= LINEAR_BELOW))
    linear = np.flatnonzero(busy & (a[bidder_of] < LINEAR_BELOW))
    terms = []
    if len(curved):
        z = cp.multiply(a[bidder_of[curved]], speed[curved] @ x)
        terms.append(weights[bidder_of[curved]] @ cp.log(1 - cp.inv_pos(1 + z)))
    if len(linear):
        terms.append(weights[bidder_of[linear]] @ cp.log(speed[linear] @ x))
    constraints = [time_rows @ x <= 1, capacity @ x <= np.tile(problem.worker_counts, m + 1)]
    program = cp.Problem(cp.Maximize(cp.sum(cp.hstack(terms)) if terms else 0), constraints)
    with warnings.catch_warnings():
        # cvxpy warns "Solution may be inaccurate" on stderr; the status says it already
        # (optimal_inaccurate, with its reason), and the mechanism takes such an answer
        warnings.simplefilter("ignore", UserWarning)
        outcome = solve(program, options, build_s=time.perf_counter() - started)
    if not outcome.status.startswith("optimal") or x.value is None:
        return Auction(np.zeros((m, num_types)), np.zeros(m), outcome.status, outcome.reason, dict(outcome.timings))
    shares = np.zeros((rows, num_types))
    shares[row_of_cell, type_of_cell] = np.clip(x.value, 0.0, 1.0)
    # each copy's valuations, log V_j = -log(rho_j) (numpy, exact): rows of copy 0 are x*
    speed_rows = (shares * tput[bidder_of]).sum(axis=1)
    isolated_s = problem.isolated_time_s[jobs] + steps / unit
    shared_s = waited[bidder_of] + np.where(busy, steps[bidder_of] / np.maximum(speed_rows, 1e-12), 0.0)
    log_value = np.log(isolated_s[bidder_of]) - np.log(np.maximum(shared_s, 1e-300))
    log_value_all = log_value[copy_of == 0]  # (m,) in bidder order
    # c_i: sum over j != i of log V_j(x*) - log V_j(x*_{-i}); the copy of i holds exactly those j
    others = copy_of > 0
    gain = np.zeros(m)
    np.add.at(gain, copy_of[others] - 1, log_value_all[bidder_of[others]] - log_value[others])
    kept = np.minimum(1.0, np.exp(np.minimum(gain, 0.0)))
    return Auction(shares[copy_of == 0], kept, outcome.status, outcome.reason, dict(outcome.timings))


def equal_shares(problem: Problem, fractions: np.ndarray, jobs: np.ndarray) -> np.ndarray:
    """(len(jobs), K) the GPUs ``fractions`` leave free, in equal parts for ``jobs`` (each 1/m of
    every type's free GPUs it can run on, as the isolated share), each scaled to at most all
    its time."""
    free = np.maximum(problem.worker_counts - (problem.scale_factors[:, None] * fractions).sum(axis=0), 0.0)
    if not len(jobs):
        return np.zeros((0, problem.num_types))
    x = np.where(runnable_types(problem)[jobs], free[None, :] / len(jobs), 0.0) / problem.scale_factors[jobs, None]
    return x / np.maximum(x.sum(axis=1), 1.0)[:, None]


def hand_out(problem: Problem, fractions: np.ndarray, order: np.ndarray, upto: np.ndarray | None = None) -> np.ndarray:
    """``fractions`` (n, K) with the GPUs they leave free given to the jobs in ``order``, each on
    its fastest runnable types with room, up to all its time (or up to ``upto``'s row)."""
    out = fractions.copy()
    free = problem.worker_counts - (problem.scale_factors[:, None] * out).sum(axis=0)
    speed = np.where(runnable_types(problem), problem.throughputs_steps_per_s, -np.inf)
    for j in order.tolist():
        if free.max(initial=0.0) <= 1e-9:
            break
        gang = problem.scale_factors[j]
        for k in np.argsort(-speed[j], kind="stable").tolist():
            want = 1.0 - out[j].sum() if upto is None else upto[j, k] - out[j, k]
            if speed[j, k] == -np.inf or want <= 1e-12:
                continue
            take = min(want, free[k] / gang)
            if take > 1e-12:
                out[j, k] += take
                free[k] -= take * gang
    return out


@dataclass(frozen=True, eq=False)
class Themis:
    heterogeneity_aware: bool = True
    fairness_knob: float = 0.8
    reference_type: str | None = None
    options: SolveOptions = field(default_factory=SolveOptions)
    name: str = "themis_perf"
    max_bidders: int = MAX_BIDDERS

    def __post_init__(self) -> None:
        if not 0.0 <= self.fairness_knob < 1.0:
            raise ValueError(f"fairness_knob: f in [0, 1) (the 1 - f worst jobs bid), got {self.fairness_knob!r}")
        if self.max_bidders < 1:
            raise ValueError(f"max_bidders: at least 1, got {self.max_bidders!r}")

    def _view(self, problem: Problem) -> Problem:
        return problem if self.heterogeneity_aware else agnostic_reference_throughputs(problem, self.reference_type)

    def isolated_baseline(self, problem: Problem) -> np.ndarray:
        """(n,) the isolated-share throughputs rho is measured against (the caller accumulates
        ``isolated_time_s`` from them, as for finish-time fairness)."""
        return isolated_throughputs(self._view(problem))

    def allocate(self, problem: Problem) -> Allocation:
        started = time.perf_counter()
        if problem.num_jobs == 0:
            return empty_allocation(self.name, problem.job_ids, problem.worker_types)
        view = self._view(problem)
        baseline = isolated_throughputs(view)
        bidding = bidders(view, baseline, self.fairness_knob, self.max_bidders)
        result = auction(view, bidding, baseline, self.options)
        if not result.status.startswith("optimal"):
            return empty_allocation(
                self.name, problem.job_ids, problem.worker_types, status=result.status, reason=result.reason,
                solve_time_s=time.perf_counter() - started,
            )
        fractions = np.zeros((problem.num_jobs, problem.num_types))
        fractions[bidding] = result.proportionally_fair * result.kept[:, None]
        # the leftover: to the jobs that did not bid, in equal shares, then what they leave
        # worst rho first; then back to the bidders
        rest = np.setdiff1d(np.arange(problem.num_jobs), bidding)
        fractions[rest] = equal_shares(view, fractions, rest)
        previous = problem.previous.job_fractions if problem.previous is not None else np.zeros_like(fractions)
        rest = rest[np.lexsort((rest, -problem.time_since_arrival_s[rest], -rho(view, previous, baseline)[rest]))]
        fractions = hand_out(view, fractions, rest)
        upto = np.zeros_like(fractions)
        upto[bidding] = result.proportionally_fair
        fractions = hand_out(view, fractions, bidding, upto=upto)
        return Allocation(
            policy=self.name, status=result.status, job_ids=problem.job_ids, worker_types=problem.worker_types,
            job_fractions=_readonly(fractions), pairs=PairShares.none(problem.num_jobs, problem.num_types),
            objective=float(np.max(rho(view, fractions, baseline) * problem.priority_weights)),
            solve_time_s=time.perf_counter() - started, reason=result.reason, timings=result.timings,
        )


def themis(
    heterogeneity_aware: bool = True, *, fairness_knob: float = 0.8, reference_type: str | None = None,
    solver: str = "CLARABEL", max_bidders: int = MAX_BIDDERS,
) -> Themis:
    """Themis' partial-allocation auctions: themis (agnostic, reference-type speeds), themis_perf."""
    return Themis(
        heterogeneity_aware, float(fairness_knob), reference_type, SolveOptions(solver),
        "themis_perf" if heterogeneity_aware else "themis", int(max_bidders),
    )
