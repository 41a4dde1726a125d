"""The decision variables every convex policy shares, as sparse matrices over one flat vector.

Variables (paper section 4, X): one time fraction x[c, k] per class of interchangeable jobs c and
worker type k (each job of the class gets x[c, k]), and, with space sharing, pair variables in
one of two exact forms (packing.py):

- "class_pairs": one total pair time W[p, k] per unordered class pair p (per job pair when
  ungrouped: Gavel's program);
- "partner_keys": Z[c, h, k], the time class c spends packed with jobs of job type h, with one
  balance equality per job-type pair and type, and a no-self-pairing row per single-job class.
  Linear in the classes where class pairs are quadratic; chosen automatically when the classes
  are much finer than job types (FTF, makespan, water filling with entities).

They live in one nonnegative vector v; every constraint and objective is a sparse matrix times
v, so cvxpy canonicalises a handful of matrix products whatever the number of jobs:

    throughput  (C, V)  steps/s of one job of class c          u = throughput @ v
    budget      (C, V)  time fraction used by one job of c      budget @ v <= 1
    usage       (K, V)  GPUs busy on type k (scale factor x     usage @ v <= worker_counts
                        fraction; a pair counts once)
    balance     (B, V)  partner keys only                       balance @ v == 0
    no_self     (S, V)  partner keys only                       no_self @ v <= 0

Variables that cannot matter are not created: types with no GPUs, gangs larger than the type
(``exclude_oversized_gangs``; Gavel lets the LP give a job with 8 GPUs time on a 4-GPU type,
which its mechanism can never run), and dominated placements (``prune_dominated``):

- a job alone on a type where its throughput is 0 (it only consumes capacity);
- a pair on a type where its normalised packed throughput T'_a/T_a + T'_b/T_b <= 1. Time-sharing
  the same GPUs instead (a alone for a fraction T'_a/T_a of the pair's time, b alone for the
  rest) uses the same GPU time, no more of either job's time, and gives each job at least its
  packed throughput; so no objective that is monotone in the jobs' throughputs (all of ours)
  loses anything. In Gavel's table this removes ~70% of the pair variables.

Turning both off and ``grouping`` off gives exactly Gavel's per-job (and per-job-pair) program.

When every job brings its own throughput row, classes are single jobs and class pairs are job
pairs again (O(n^2)). A policy that can solve by column generation (pair_columns.py) then gets a
Space with no pair variable yet and the candidate pairs kept aside as a ``PairPool``
(``pair_variables="generated"``, or "auto" above ``GENERATE_ABOVE`` candidate pair variables);
``Space.with_pairs`` adds the columns the prices ask for.

build_space (here) picks and lays out the variables; the Space it returns, its matrices and the
way back from values to an allocation are in space.py.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from common.errors import PolicyParameterError
from policy_service.core.grouping import group_jobs
from policy_service.core.packing import (
    PairClasses,
    cell_colocation,
    cell_partner_count,
    class_pair_count,
    key_throughputs,
    pair_classes,
    partner_entries,
    partner_rows,
)
from policy_service.core.problem import Problem

# The variables and their matrices live in space.py; their names are kept here, where callers
# (and tests) have always imported them.
from policy_service.core.space import (  # noqa: F401 - re-exported
    PairPool,
    Space,
    _no_pair_shares,
    _no_pair_time,
    _none_pair_index,
    _none_pairs,
    _pair_columns,
    _repair,
)
from policy_service.core.sparse import sp

PAIR_VARIABLES = ("auto", "class_pairs", "partner_keys", "generated")

# "auto" generates pair columns (pair_columns.py) instead of materialising them all when the
# candidate class-pair variables (before pruning) exceed this: ~80 jobs with rows of their own,
# where the full program still solves in ~0.1 s (128 jobs: 0.8 s full, 0.2 s generated). Jobs
# grouped by a table's rows stay below it whatever their number (Gavel's 83 keys: ~2,800; with
# two priority weights 10,700, but then partner keys are the smaller form and stay), so the
# simulator's programs are unchanged.
GENERATE_ABOVE = 10_000


@functools.cache
def installed_solvers() -> tuple[str, ...]:
    """cvxpy's installed solvers, looked up once (each lookup costs about 1.5 ms, and policies
    are built per request)."""
    import cvxpy as cp  # noqa: PLC0415 - loaded when a program is built, not when the package is imported
    return tuple(cp.installed_solvers())


# How to install a solver that is not a dependency of this package. ECOS is the solver of preset
# "gavel" (Gavel's); pyproject.toml lists it as the optional extra [ecos] (and in [dev]), so a
# plain `pip install` of the project has no ECOS.
SOLVER_INSTALL = {"ECOS": "pip install 'gavel-scheduler[ecos]' (or: pip install ecos)"}


def solver_unavailable(solver: str) -> str | None:
    """Why cvxpy cannot solve with ``solver`` (any case) here, in one line naming what to install
    when cvxpy knows the solver but its package is missing; None when it can. CLARABEL, a
    dependency, is never looked up (that would load cvxpy)."""
    name = solver.upper()
    if name == "CLARABEL" or name in installed_solvers():
        return None
    import cvxpy as cp  # noqa: PLC0415 - loaded by installed_solvers() already

    installed = ", ".join(installed_solvers())
    if name in cp.settings.SOLVERS:
        how = SOLVER_INSTALL.get(name, f"install the package cvxpy calls {name} with (cvxpy's documentation lists them)")
        return f"the solver {name} is not installed: {how}; installed cvxpy solvers: {installed}"
    return f"unknown solver {solver!r}; installed cvxpy solvers: {installed}"


@dataclass(frozen=True)
class SolveOptions:
    """How a convex policy builds and solves its program (the same for every policy).

    solver: any installed cvxpy LP/SOCP solver (``cvxpy.installed_solvers()``, any case);
        CLARABEL by default, ECOS to get what Gavel got.
    grouping: one set of variables per class of interchangeable jobs (False: per job and per
        job pair, as Gavel).
    pair_variables: "auto" (the smaller of the two exact forms, generated above
        GENERATE_ABOVE candidate class-pair variables where the policy can), "class_pairs",
        "partner_keys" or "generated" (class pairs by column generation where the policy can,
        all class pairs elsewhere); ungrouped always uses every per-job pair.
    """

    solver: str = "CLARABEL"
    grouping: bool = True
    exclude_oversized_gangs: bool = True
    prune_dominated: bool = True
    canon_backend: str | None = None
    solver_options: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    pair_variables: str = "auto"

    def __post_init__(self) -> None:
        # Checked here, where every convex policy gets its options: cvxpy only refuses an
        # unknown solver inside solve(), which a policy turns into status "failed" and which
        # reads as "no feasible allocation" rather than the bad parameter it is. CLARABEL, the
        # default, is a dependency of this package: asking cvxpy would load it (~1.7 s) for
        # programs that go to CLARABEL without it (compiled.py).
        if not isinstance(self.solver, str):
            raise PolicyParameterError(
                f"unknown solver {self.solver!r}; installed cvxpy solvers: {', '.join(installed_solvers())}"
            )
        unavailable = solver_unavailable(self.solver)
        if unavailable is not None:
            raise PolicyParameterError(unavailable)
        # cvxpy takes any case; one spelling keeps comparisons such as the compiled max-min
        # path's (solver == "CLARABEL") true for "clarabel" too.
        object.__setattr__(self, "solver", self.solver.upper())
        if self.pair_variables not in PAIR_VARIABLES:
            raise PolicyParameterError(
                f"pair_variables must be one of {', '.join(PAIR_VARIABLES)}, got {self.pair_variables!r}"
            )


def build_space(
    problem: Problem,
    *,
    packing: bool,
    options: SolveOptions,
    columns: Sequence[np.ndarray] = (),
    can_generate: bool = False,
) -> Space:
    """Group the jobs (by throughputs, scale factor, colocation key and ``columns``), pick and
    enumerate the pair variables when ``packing``, and build the constraint matrices.

    ``can_generate``: the caller solves by column generation (pair_columns.py) when the space
    comes back with a ``pool``; other callers always get every pair variable they need."""
    num_jobs, num_types = problem.num_jobs, problem.num_types
    key_columns = [problem.throughputs_steps_per_s, problem.scale_factors, *columns]
    if packing:
        key_columns.append(problem.colocation.key_of_job)
    classes = group_jobs(key_columns, num_jobs, enabled=options.grouping)
    mode = "none"
    cells = None
    if packing and problem.colocation.num_pairs:
        mode = options.pair_variables if options.grouping else "class_pairs"
        if options.grouping:
            cells = cell_colocation(problem)
        if mode == "auto":
            class_pair_vars, partner_vars = class_pair_count(problem, classes)
            if can_generate and class_pair_vars <= partner_vars and class_pair_vars * num_types > GENERATE_ABOVE:
                # One key per job (its own row): generated job pairs. Measured faster than cell
                # partners at 256-2,048 jobs for max-min (a simplex re-solve per round against
                # an interior-point solve whose factorisation fills in); docs/policies.md.
                mode = "generated"
            else:
                if cells is not None:
                    partner_vars = min(partner_vars, cell_partner_count(problem, classes, cells))
                mode = "partner_keys" if partner_vars < class_pair_vars else "class_pairs"
        if mode == "generated" and not can_generate:
            mode = "class_pairs"
    counts = problem.worker_counts
    reps = classes.representative
    class_tput = problem.throughputs_steps_per_s[reps] if num_jobs else np.zeros((0, num_types))
    class_sf = problem.scale_factors[reps].astype(float) if num_jobs else np.zeros(0)
    sizes = classes.sizes.astype(float)
    fits = (counts > 0)[None, :] & (
        class_sf[:, None] <= problem.gang_capacity[None, :] if options.exclude_oversized_gangs else True
    )
    if fits.shape != (classes.num_classes, num_types):  # (C, K) even when not excluding
        fits = np.broadcast_to(fits, (classes.num_classes, num_types))

    x_allowed = fits.copy()
    if options.prune_dominated:
        x_allowed &= class_tput > 0
    num_x = int(np.count_nonzero(x_allowed))
    x_index = np.full((classes.num_classes, num_types), -1, dtype=np.int64)
    x_index[x_allowed] = np.arange(num_x)
    c_idx, k_idx = np.nonzero(x_allowed)
    x_cols = x_index[c_idx, k_idx]  # (read-only below: both triplets may share it)
    b_rows, b_cols, b_vals = [c_idx], [x_cols], [np.ones(len(c_idx))]
    u_rows, u_cols, u_vals = [k_idx], [x_cols], [sizes[c_idx] * class_sf[c_idx]]

    pairs, partners = _none_pairs(num_types), None
    pair_index = _none_pair_index(num_types)
    balance = no_self = None
    num_vars = num_x
    pool = None
    if mode in ("class_pairs", "generated"):
        pairs = pair_classes(problem, classes)
        allowed = _pair_allowed(pairs, fits, class_tput, options)
        if mode == "generated":
            # Only the candidates: the caller's column generation adds pair variables.
            useful = allowed.any(axis=1)
            pool = PairPool(PairClasses(pairs.pairs[useful], pairs.throughputs_steps_per_s[useful]), allowed[useful])
            pairs, allowed = PairClasses.none(num_types), np.zeros((0, num_types), dtype=bool)
            mode = "class_pairs"
        pair_index, num_vars, budget_parts, usage_parts = _pair_columns(pairs, allowed, num_x, sizes, class_sf)
        for target, parts in ((b_rows, budget_parts[0]), (b_cols, budget_parts[1]), (b_vals, budget_parts[2]),
                              (u_rows, usage_parts[0]), (u_cols, usage_parts[1]), (u_vals, usage_parts[2])):
            target.extend(parts)
    elif mode == "partner_keys":
        if cells is not None and cell_partner_count(problem, classes, cells) >= class_pair_count(problem, classes)[1]:
            cells = None  # rows shared by whole cells: the colocation's own keys are as coarse
        partners = partner_entries(problem, classes, cells)
        allowed = fits[partners.cls].copy()
        if cells is not None and options.prune_dominated and partners.num_entries:
            # Normalised packed throughput of the pair = the sum of the two fractions, whatever
            # the two rows: dominance is a property of the two cells.
            allowed &= partners.fractions.sum(axis=2) > 1.0 + 1e-12
        elif options.prune_dominated and partners.num_entries:
            # Dominance is a property of the two job types: one job of this class against one of the
            # partner key (every class of a key has the key's throughputs).
            key_pairs = problem.colocation.key_pairs[partners.key_pair]
            partner_key = np.where(partners.side == 0, key_pairs[:, 1], key_pairs[:, 0])
            partner_alone = key_throughputs(problem)[partner_key]
            packed = np.stack([partners.throughputs_steps_per_s, partners.partner_throughputs_steps_per_s], axis=2)
            alone = np.stack([class_tput[partners.cls], partner_alone], axis=2)
            allowed &= _normalised_packed_throughput(packed, alone) > 1.0 + 1e-12
        pair_index = np.full(allowed.shape, -1, dtype=np.int64)
        pair_index[allowed] = num_x + np.arange(int(allowed.sum()))
        num_z = int(allowed.sum())
        e_idx, ek_idx = np.nonzero(allowed)
        cols = pair_index[e_idx, ek_idx]
        cls = partners.cls[e_idx]
        b_rows.append(cls)
        b_cols.append(cols)
        b_vals.append(1.0 / sizes[cls])
        u_rows.append(ek_idx)
        u_cols.append(cols)
        u_vals.append(class_sf[cls] / 2.0)  # a pair's time is counted from both of its sides
        balance, no_self, num_aux = partner_rows(problem, classes, partners, e_idx, ek_idx, cols, num_x + num_z)
        num_vars = num_x + num_z + num_aux
        balance = sp.csr_matrix(balance, shape=(balance.shape[0], num_vars))
        no_self = sp.csr_matrix(no_self, shape=(no_self.shape[0], num_vars))
    return Space(
        problem=problem,
        classes=classes,
        mode=mode,
        pairs=pairs,
        partners=partners,
        x_index=x_index,
        pair_index=pair_index,
        num_vars=num_vars,
        budget_triplets=(b_rows, b_cols, b_vals),
        usage_triplets=(u_rows, u_cols, u_vals),
        balance=balance,
        no_self=no_self,
        class_throughputs=class_tput,
        class_scale_factors=class_sf,
        pool=pool,
        num_x=num_x if pool is not None else -1,
        pool_rows=np.zeros(0, np.int64) if pool is not None else None,
    )


def _pair_allowed(pairs: PairClasses, fits: np.ndarray, class_tput: np.ndarray, options: SolveOptions) -> np.ndarray:
    """(P, K): where a class pair's column may exist (the gang fits the type; not dominated)."""
    allowed = fits[pairs.pairs[:, 0]].reshape(pairs.num_pairs, fits.shape[1]).copy()
    if options.prune_dominated and pairs.num_pairs:
        alone = np.stack([class_tput[pairs.pairs[:, 0]], class_tput[pairs.pairs[:, 1]]], axis=2)
        allowed &= _normalised_packed_throughput(pairs.throughputs_steps_per_s, alone) > 1.0 + 1e-12
    return allowed


def _normalised_packed_throughput(packed: np.ndarray, alone: np.ndarray) -> np.ndarray:
    """(P, K) T'_a / T_a + T'_b / T_b from (P, K, 2) packed and alone steps/s (infinite where a
    job runs packed but not alone)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(alone > 0, packed / np.where(alone > 0, alone, 1.0), np.where(packed > 0, np.inf, 0.0))
    return ratio.sum(axis=2)
