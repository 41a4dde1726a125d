"""The variables of a convex policy's program and their constraint matrices: ``Space`` (what
formulation.build_space returns), the candidate pairs column generation prices (``PairPool``),
and the variables' values back to an allocation (``Space.grouped``, ``Space.allocation``, with
the repair that makes them exactly feasible). formulation.py's docstring describes the variables."""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from policy_service.core.allocation import (
    NOISE_FRACTION,
    Allocation,
    PairShares,
    Status,
    _readonly,
)
from policy_service.core.grouping import JobClasses
from policy_service.core.packing import (
    PairClasses,
    PartnerEntries,
    partners_to_class_pairs,
)
from policy_service.core.problem import Problem
from policy_service.core.sparse import sp

if TYPE_CHECKING:  # annotations only: cvxpy is loaded when a program is built
    import cvxpy as cp

def _csr(
    rows: list[np.ndarray], cols: list[np.ndarray], vals: list[np.ndarray], shape: tuple[int, int]
) -> sp.csr_matrix:
    if not rows:
        return sp.csr_matrix(shape)
    return sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=shape)


@dataclass(frozen=True, eq=False)
class PairPool:
    """Every candidate class pair of a problem (``packing.pair_classes``) with the types where
    its column may exist ((P, K) ``allowed``: the gang fits, not dominated), none of them
    variables yet: column generation (pair_columns.py) prices them all and adds a few."""

    pairs: PairClasses
    allowed: np.ndarray

    @property
    def num_columns(self) -> int:
        return int(self.allowed.sum())


@dataclass(frozen=True, eq=False)
class Space:
    """Variables and constraint matrices of one problem (see the module docstring)."""

    problem: Problem
    classes: JobClasses
    mode: str  # "none" | "class_pairs" | "partner_keys"
    pairs: PairClasses  # class pairs (class_pairs mode)
    partners: PartnerEntries | None  # partner entries (partner_keys mode)
    x_index: np.ndarray  # (C, K) variable index of x[c, k], -1 = not created
    pair_index: np.ndarray  # (P, K) of W (class_pairs) or (E, K) of Z (partner_keys), -1 = none
    num_vars: int
    # (rows, cols, values) of the budget (C, V) and usage (K, V) matrices; assembled on first use
    # (the compiled max-min path never needs them)
    budget_triplets: tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]
    usage_triplets: tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]
    # Partner keys' rows; None: no such rows (every other mode: no empty matrices built per
    # solve, and no scipy.sparse for the simulator's programs).
    balance: sp.csr_matrix | None  # (B, V) == 0
    no_self: sp.csr_matrix | None  # (S, V) <= 0
    class_throughputs: np.ndarray  # (C, K) isolated steps/s of each class
    class_scale_factors: np.ndarray  # (C,)
    # Candidate class pairs not (all) materialised: set when the caller solves by column
    # generation; ``pairs`` then holds the columns generated so far.
    pool: PairPool | None = None
    num_x: int = -1  # variables of x (the first ones); -1: not recorded (no pool)
    pool_rows: np.ndarray | None = None  # (P,) the pool row of each of ``pairs`` (with a pool)

    @property
    def num_classes(self) -> int:
        return self.classes.num_classes

    @functools.cached_property
    def x_mask(self) -> np.ndarray:
        """(C, K) bool: where x has a variable."""
        return self.x_index >= 0

    @functools.cached_property
    def num_x_vars(self) -> int:
        """How many variables x has (they come first, in ``x_mask``'s row-major order)."""
        return int(np.count_nonzero(self.x_mask))

    def with_pairs(self, selected: np.ndarray) -> Space:
        """The same space with the pool's columns ``selected`` ((P, K) bool, within
        ``pool.allowed``) as its class-pair variables, after the x variables (same indices)."""
        assert self.pool is not None, "with_pairs needs a space built with a pair pool"
        rows = np.flatnonzero(selected.any(axis=1))
        pairs = PairClasses(self.pool.pairs.pairs[rows], self.pool.pairs.throughputs_steps_per_s[rows])
        x_budget = tuple(part[:1] for part in self.budget_triplets)
        x_usage = tuple(part[:1] for part in self.usage_triplets)
        pair_index, num_vars, budget_parts, usage_parts = _pair_columns(
            pairs, selected[rows], self.num_x, self.classes.sizes.astype(float), self.class_scale_factors
        )
        return replace(
            self, mode="class_pairs", pairs=pairs, pair_index=pair_index, num_vars=num_vars,
            budget_triplets=tuple(a + b for a, b in zip(x_budget, budget_parts)),
            usage_triplets=tuple(a + b for a, b in zip(x_usage, usage_parts)),
            balance=None, no_self=None,
            pool_rows=rows,
        )

    @functools.cached_property
    def budget(self) -> sp.csr_matrix:
        """(C, V): each class's time (one job of it) per variable."""
        return _csr(*self.budget_triplets, (self.num_classes, self.num_vars))

    @functools.cached_property
    def usage(self) -> sp.csr_matrix:
        """(K, V): GPUs of each type per variable."""
        return _csr(*self.usage_triplets, (self.problem.num_types, self.num_vars))

    def throughput(self, per_type: np.ndarray | None = None) -> sp.csr_matrix:
        """(C, V): steps/s of one job of each class; ``per_type`` (K,) scales each type's terms
        (e.g. 1 / price for throughput per dollar)."""
        return _csr(*self.throughput_triplets(per_type), (self.num_classes, self.num_vars))

    def throughput_triplets(
        self, per_type: np.ndarray | None = None
    ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        """(rows, cols, values) of ``throughput``, one entry per (row, column): compiled_ecos.py
        lays the program out from them without building the matrix."""
        scale = np.ones(self.problem.num_types) if per_type is None else np.asarray(per_type, float)
        sizes = self.classes.sizes.astype(float)
        c_idx, k_idx = np.nonzero(self.x_index >= 0)
        rows, cols, vals = [c_idx], [self.x_index[c_idx, k_idx]], [self.class_throughputs[c_idx, k_idx] * scale[k_idx]]
        p_idx, k_idx = np.nonzero(self.pair_index >= 0)
        var = self.pair_index[p_idx, k_idx]
        if self.mode == "class_pairs" and len(p_idx):
            a, b = self.pairs.pairs[p_idx, 0], self.pairs.pairs[p_idx, 1]
            same = a == b
            tput = self.pairs.throughputs_steps_per_s[p_idx, k_idx]  # (m, 2)
            rows += [a, b[~same]]
            cols += [var, var[~same]]
            vals += [
                tput[:, 0] * np.where(same, 2.0, 1.0) / sizes[a] * scale[k_idx],
                tput[~same, 1] / sizes[b[~same]] * scale[k_idx[~same]],
            ]
        elif self.mode == "partner_keys" and len(p_idx):
            c = self.partners.cls[p_idx]
            rows.append(c)
            cols.append(var)
            vals.append(self.partners.throughputs_steps_per_s[p_idx, k_idx] / sizes[c] * scale[k_idx])
        return rows, cols, vals

    def constraints(self, v: cp.Variable) -> list[cp.Constraint]:
        """The cluster: each job's time <= 1, each type's GPUs <= its count (v >= 0 is on v),
        and the realisability rows of partner variables."""
        return [self.budget @ v <= 1, self.usage @ v <= self.problem.worker_counts, *self.pairing_constraints(v)]

    def pairing_constraints(self, v: cp.Variable | cp.Expression) -> list[cp.Constraint]:
        """The homogeneous rows of partner variables (none in the other modes)."""
        constraints = []
        if self.balance is not None and self.balance.shape[0]:
            constraints.append(self.balance @ v == 0)
        if self.no_self is not None and self.no_self.shape[0]:
            constraints.append(self.no_self @ v <= 0)
        return constraints

    def clean(self, values: np.ndarray | None) -> np.ndarray:
        """Solver output -> feasible values: clipped at 0 and scaled down by one common factor
        (so balance rows stay balanced) until no job exceeds its time and no type its GPUs."""
        if values is None:
            return np.zeros(self.num_vars)
        values = np.clip(np.nan_to_num(np.asarray(values, float), nan=0.0), 0.0, None)
        values[values < NOISE_FRACTION] = 0.0
        time_used = self.budget @ values
        used = self.usage @ values
        counts = self.problem.worker_counts
        factor = min(
            1.0,
            float(np.min(1.0 / np.maximum(time_used, 1.0), initial=1.0)),
            float(np.min(np.where(used > counts, counts / np.maximum(used, 1e-300), 1.0), initial=1.0)),
        )
        return values * factor

    def grouped(self, values: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Variable values -> (x (C, K), class pairs (P, 2), pair time W (P, K)), exactly feasible.

        Partner variables are laid out as class pairs first (transport between the two sides of
        each job-type pair, or pairing within one job type), then every class whose time exceeds
        1, and every type whose GPUs are exceeded (solver tolerance), is scaled down.
        """
        num_types = self.problem.num_types
        if values is None:
            values = np.zeros(self.num_vars)
        values = np.asarray(values, float)
        if not np.isfinite(values).all():  # (nan_to_num costs ~30 us even when it has nothing to do)
            values = np.nan_to_num(values)
        values = np.clip(values, 0.0, None)
        values[values < NOISE_FRACTION] = 0.0
        x = np.zeros((self.num_classes, num_types))
        mask = self.x_mask
        # x's variables are numbered in mask order (build_space), so its values are the first
        # ones, as they come
        x[mask] = values[: self.num_x_vars] if self.mode != "none" else values
        if self.mode == "none":  # no pair variables (every unpacked program): _repair's own branch
            return _repair(x, _NO_PAIRS, _no_pair_time(num_types), self.classes.sizes.astype(float), self.class_scale_factors, self.problem.worker_counts)
        if self.mode == "class_pairs":
            w = np.zeros(self.pair_index.shape)
            mask = self.pair_index >= 0
            w[mask] = values[self.pair_index[mask]]
            pairs = self.pairs.pairs
        elif self.mode == "partner_keys":
            z = np.zeros(self.pair_index.shape)
            mask = self.pair_index >= 0
            z[mask] = values[self.pair_index[mask]]
            pairs, w = partners_to_class_pairs(self.problem, self.classes, self.partners, z)
        else:  # no pair variables: nothing to select
            pairs, w = np.zeros((0, 2), np.int64), np.zeros((0, num_types))
        if len(pairs):
            used = w.sum(axis=1) > 0
            pairs, w = pairs[used], w[used]
        sizes = self.classes.sizes.astype(float)
        return _repair(x, pairs, w, sizes, self.class_scale_factors, self.problem.worker_counts)

    def allocation(
        self, values: np.ndarray | None, *, policy: str, status: Status, objective: float | None,
        started_s: float, reason: str = "", timings: Mapping[str, float] | None = None,
    ) -> Allocation:
        """Expand variable values to an Allocation (job fractions per job, pair time by class)."""
        problem = self.problem
        num_types = problem.num_types
        x, pairs, w = self.grouped(values)
        job_fractions = x[self.classes.class_of_job] if problem.num_jobs else np.zeros((0, num_types))
        if len(pairs):
            shares = PairShares(
                group_of_job=_readonly(self.classes.class_of_job.copy()),
                group_pairs=_readonly(pairs),
                pair_time=_readonly(w),
            )
        else:
            shares = _no_pair_shares(problem.num_jobs, num_types)
        return Allocation(
            policy=policy,
            status=status,
            job_ids=problem.job_ids,
            worker_types=problem.worker_types,
            job_fractions=_readonly(np.ascontiguousarray(job_fractions)),
            pairs=shares,
            objective=objective,
            solve_time_s=time.perf_counter() - started_s,
            reason=reason,
            timings=MappingProxyType(dict(timings or {})),
        )


@functools.lru_cache(maxsize=16)
def _none_pairs(num_types: int) -> PairClasses:
    """PairClasses.none, made once per K (read-only: a space without pairs never writes them)."""
    pairs = PairClasses.none(num_types)
    for array in (pairs.pairs, pairs.throughputs_steps_per_s):
        array.setflags(write=False)
    return pairs


@functools.lru_cache(maxsize=16)
def _none_pair_index(num_types: int) -> np.ndarray:
    """(0, K) pair_index of a space without pair variables, made once per K (read-only)."""
    index = np.zeros((0, num_types), dtype=np.int64)
    index.setflags(write=False)
    return index


# A space's class pairs when it has none, shared (read-only): (0, 2) class indices
_NO_PAIRS = np.zeros((0, 2), np.int64)
_NO_PAIRS.setflags(write=False)


@functools.lru_cache(maxsize=16)
def _no_pair_time(num_types: int) -> np.ndarray:
    """(0, K) pair time of a space without pairs, made once per K (read-only)."""
    w = np.zeros((0, num_types))
    w.setflags(write=False)
    return w


@functools.lru_cache(maxsize=256)
def _no_pair_shares(num_jobs: int, num_types: int) -> PairShares:
    """PairShares.none, made once per shape: its arrays are read-only and the dataclass frozen,
    so the allocations of a simulation's hundreds of unpacked answers can share it."""
    return PairShares.none(num_jobs, num_types)


def _repair(
    x: np.ndarray, pairs: np.ndarray, w: np.ndarray, sizes: np.ndarray, scale_factors: np.ndarray, counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scale down classes over 100% of their time, then types over their GPU count."""
    if not len(pairs):  # the same arithmetic without the pairs' terms (most answers have none)
        factor = np.minimum(1.0, 1.0 / np.maximum(x.sum(axis=1), 1e-300))
        x = x * factor[:, None]
        used = ((sizes * scale_factors)[:, None] * x).sum(axis=0)
        type_factor = np.where(used > counts, counts / np.maximum(used, 1e-300), 1.0)
        return x * type_factor, pairs.astype(np.int64), w * type_factor
    a, b = pairs[:, 0], pairs[:, 1]
    same = a == b
    time_used = x.sum(axis=1)
    per_pair = w.sum(axis=1)
    np.add.at(time_used, a, np.where(same, 2.0, 1.0) * per_pair / sizes[a])
    np.add.at(time_used, b[~same], per_pair[~same] / sizes[b[~same]])
    factor = np.minimum(1.0, 1.0 / np.maximum(time_used, 1e-300))
    x = x * factor[:, None]
    w = w * np.minimum(factor[a], factor[b])[:, None]
    used = ((sizes * scale_factors)[:, None] * x).sum(axis=0)
    used = used + (scale_factors[a][:, None] * w).sum(axis=0)
    type_factor = np.where(used > counts, counts / np.maximum(used, 1e-300), 1.0)
    return x * type_factor, pairs.astype(np.int64), w * type_factor


def _pair_columns(
    pairs: PairClasses, allowed: np.ndarray, num_x: int, sizes: np.ndarray, class_sf: np.ndarray
) -> tuple[np.ndarray, int, tuple[list, list, list], tuple[list, list, list]]:
    """Class-pair variables after the ``num_x`` x variables: (pair_index (P, K), number of
    variables, budget (rows, cols, values) and usage (rows, cols, values) to append)."""
    pair_index = np.full(allowed.shape, -1, dtype=np.int64)
    pair_index[allowed] = num_x + np.arange(int(allowed.sum()))
    p_idx, pk_idx = np.nonzero(allowed)
    a, b = pairs.pairs[p_idx, 0], pairs.pairs[p_idx, 1]
    same = a == b
    cols = pair_index[p_idx, pk_idx]
    budget = ([a, b[~same]], [cols, cols[~same]], [np.where(same, 2.0, 1.0) / sizes[a], 1.0 / sizes[b[~same]]])
    usage = ([pk_idx], [cols], [class_sf[a]])
    return pair_index, num_x + len(cols), budget, usage
