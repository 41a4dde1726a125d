"""From an AllocationRequested to its answer: pure, so it runs the same inline, in a thread or in
a worker process (the service decides where).

    answer(request, context) -> AllocationComputed | AllocationFailed

Bad input (an unknown policy, a job type the table does not know, a NaN throughput, ...) is
answered with AllocationFailed and the reason, never raised.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import operator
from collections.abc import Mapping

import numpy as np

from common.allocation_columns import AnswerColumns, PreviousColumns
from common.errors import GavelError, PluginError, ProblemError
from common.messages import (
    AllocationComputed,
    AllocationEntry,
    AllocationFailed,
    AllocationRequested,
    PolicyJob,
    PolicyProblem,
    SolveStatus,
)
from common.plugins import PLUGIN_FAULTS, one_line
from common.throughputs import ThroughputTable
from policy_service.core import (
    Allocation,
    ClassPairSpec,
    Entity,
    JobSpec,
    PairSpec,
    Policy,
    Problem,
    build_problem,
)
from policy_service.core.admitted import AdmittedJobs
from policy_service.core.admitted_max_min import answer_max_min
from policy_service.core.allocation import NOISE_FRACTION, expand_pairs
from policy_service.core.baselines import isolated_throughputs
from policy_service.core.catalog import REGISTRY
from policy_service.core.formulation import solver_unavailable
from policy_service.core.registry import instantiate
from policy_service.plugins import KIND as PLUGIN_KIND
from policy_service.plugins import allocate, is_builtin, make_plugin, policy_entry

# Preset "gavel": the programs exactly as Gavel writes them, for the simulator to reproduce its
# numbers: per-job (and per-job-pair) variables solved with ECOS, makespan by bisection, Gavel's
# agnostic-FIFO type choice, SLOs dropped when infeasible. Each is passed only to the policies
# whose constructor takes it.
PRESET_PARAMETERS: Mapping[str, Mapping[str, object]] = {
    "default": {},
    "gavel": {
        "solver": "ECOS",
        "grouping": False,
        "prune_dominated": False,
        "exclude_oversized_gangs": False,
        "exact": False,
        "type_choice": "gavel_last_type",
        "on_infeasible_slos": "drop",
        "gavel_state": True,
    },
}


@dataclasses.dataclass(frozen=True)
class SolveContext:
    """What a policy replica knows besides the request: the throughput table it fills omitted
    throughputs and pairs from, and the prices used when a request names none."""

    table: ThroughputTable | None = None
    prices_per_hour: Mapping[str, float] | None = None
    # Policy plug-ins (module:Name specs) this replica was started with, besides the built-ins and
    # the installed entry points (policy_service/plugins.py): specs, not objects, so a context
    # sent to a worker process resolves them there.
    plugins: tuple[str, ...] = ()


def problem_from_message(
    problem: PolicyProblem, context: SolveContext, policy_state: str = "", *, admitted: bool = False
) -> Problem:
    """The core's Problem for a wire snapshot. ProblemError names the offending field.
    ``admitted``: build_problem's (the jobs' own fields were checked when the caller admitted
    them, in this process)."""
    jobs: list[JobSpec] | AdmittedJobs | None = _admitted_jobs(problem.jobs) if admitted else None
    if jobs is None:
        jobs = [
            JobSpec(
                id=j.job_id,
                steps_remaining=j.steps_remaining,
                job_type=j.job_type,
                scale_factor=j.scale_factor,
                priority_weight=j.priority_weight,
                throughputs_steps_per_s=j.throughputs_steps_per_s,
                time_since_arrival_s=j.time_since_arrival_s,
                slo_s=j.slo_s,
                entity=j.entity,
                isolated_time_s=j.isolated_time_s,
                colocation_class=j.colocation_class,
                attained_service_gpu_s=j.attained_service_gpu_s,
                time_since_last_run_s=j.time_since_last_run_s,
                last_run_s=j.last_run_s,
            )
            for j in problem.jobs
        ]
    pairs = None
    if problem.pairs is not None:
        pairs = [
            PairSpec(tuple(p.job_ids), {k: tuple(v) for k, v in p.throughputs_steps_per_s.items()})  # type: ignore[arg-type]
            for p in problem.pairs
        ]
    colocations = None
    if problem.colocations is not None:
        # Lengths are checked by build_problem (which names the path), so no unpacking here.
        colocations = [
            ClassPairSpec(tuple(c.classes), {k: tuple(v) for k, v in c.fractions.items()})  # type: ignore[arg-type]
            for c in problem.colocations
        ]
    return build_problem(
        problem.worker_types,
        jobs,
        pairs=pairs,
        entities=[Entity(e.name, e.weight, e.policy) for e in problem.entities],
        prices_per_hour=problem.prices_per_hour if problem.prices_per_hour is not None else context.prices_per_hour,
        table=context.table,
        # the wire entries as they are: they carry the same two fields (job_ids, fractions)
        previous=problem.previous or None,  # type: ignore[arg-type]
        policy_state=policy_state or None,
        colocations=colocations,
        admitted=admitted,
    )


_JOB_FIELDS = operator.attrgetter(
    "job_id", "job_type", "scale_factor", "priority_weight", "steps_remaining", "time_since_arrival_s", "slo_s",
    "isolated_time_s", "attained_service_gpu_s", "time_since_last_run_s", "last_run_s",
)


def _admitted_jobs(jobs: tuple[PolicyJob, ...]) -> AdmittedJobs | None:
    """An admitting caller's jobs column by column (no JobSpec per job), when none brings its
    own throughputs, entity or colocation class (the rest is build_problem's to check)."""
    if any(j.throughputs_steps_per_s is not None or j.entity is not None or j.colocation_class != "" for j in jobs):
        return None
    if not jobs:
        return AdmittedJobs((), (), (), (), (), (), (), (), (), (), ())
    return AdmittedJobs(*zip(*map(_JOB_FIELDS, jobs)))


@functools.lru_cache(maxsize=256)
def _accepted_parameters(name: str, served: tuple[str, ...] = ()) -> frozenset[str]:
    return frozenset(inspect.signature(policy_entry(name, served).factory).parameters)


def policy_for(request: AllocationRequested, served: tuple[str, ...] = ()) -> Policy:
    """The policy the request names (a built-in, an installed plug-in or one of ``served``:
    policy_service/plugins.py) with the request's preset, solver and seed applied."""
    if request.preset not in PRESET_PARAMETERS:
        raise ProblemError(f"preset: unknown preset {request.preset!r} (known: {', '.join(PRESET_PARAMETERS)})")
    policy_entry(request.policy, served)  # UnknownPolicyError lists the known names; PluginError
    accepted = _accepted_parameters(request.policy, served)
    if request.seed is not None and ("rng" in accepted or "seed" in accepted):
        return _new_policy(request.policy, request.preset, request.solver, request.seed, served)
    return _shared_policy(request.policy, request.preset, request.solver, served)


@functools.lru_cache(maxsize=256)
def _shared_policy(name: str, preset: str, solver: str | None, served: tuple[str, ...] = ()) -> Policy:
    """One policy object per (name, preset, solver) for the policies that draw no random numbers.
    Policies are pure (policy_service/core/registry.py): the same problem gets the same answer
    from any object, so a new one per request only repeated the constructor's checks of its
    parameters against the family's signature (0.2 ms of a 4.7 ms answer: bench/answer_path.py)."""
    return _new_policy(name, preset, solver, None, served)


@functools.lru_cache(maxsize=256)
def reads_previous(name: str, preset: str = "default", solver: str | None = None) -> bool:
    """Whether the policy's answers depend on the allocation in force (``problem.previous``):
    True unless the policy says it never reads it (a ``reads_previous`` of False), and for a
    name or preset it cannot build (the answer then reports the error)."""
    try:
        policy = _new_policy(name, preset, solver, None)
    except (GavelError, KeyError, TypeError, ValueError):
        return True
    return bool(getattr(policy, "reads_previous", True))


@functools.lru_cache(maxsize=256)
def reads_service(name: str, preset: str = "default", solver: str | None = None) -> bool:
    """Whether the policy reads what each job has run (``Problem.attained_service_gpu_s`` and
    the two beside it): only a policy that says so (a ``reads_service`` of True, Tiresias);
    a caller in this process may leave them out for the others (zeros)."""
    try:
        policy = _new_policy(name, preset, solver, None)
    except (GavelError, KeyError, TypeError, ValueError):
        return True
    return bool(getattr(policy, "reads_service", False))


def _new_policy(name: str, preset: str, solver: str | None, seed: int | None, served: tuple[str, ...] = ()) -> Policy:
    entry = policy_entry(name, served)
    accepted = _accepted_parameters(name, served)
    overrides: dict[str, object] = {
        k: v for k, v in PRESET_PARAMETERS[preset].items() if k in accepted and k not in entry.bound
    }
    if solver:
        overrides["solver"] = solver
    if seed is not None and "rng" in accepted:
        overrides["rng"] = np.random.default_rng(seed)
    if seed is not None and "seed" in accepted:
        overrides["seed"] = seed
    return instantiate(entry, **overrides) if is_builtin(name) else make_plugin(entry, overrides)


def solver_unavailable_for(name: str, preset: str, solver: str | None = None) -> str | None:
    """Why the policy ``name`` cannot solve here under ``preset`` (or with ``solver``): the solver
    it would use is not installed (preset "gavel" solves with ECOS, an optional package), with
    what to install; None when it can, or when it takes no solver. Asked before a run starts: a
    missing solver otherwise fails every solve, and a simulation ends saying its jobs can never
    be scheduled. Never loads cvxpy for the default solver. A plug-in's solver is its own
    business: None."""
    if not is_builtin(name) or "solver" not in _accepted_parameters(name):
        return None
    # as _new_policy chooses: the request's solver, else the one the name binds, else the preset's
    bound = REGISTRY.entry(name).bound
    wanted = solver or bound.get("solver", PRESET_PARAMETERS.get(preset, {}).get("solver"))
    if not isinstance(wanted, str):
        return None  # the policy's default: CLARABEL, a dependency of this package
    return solver_unavailable(wanted)


def isolated_baseline(policy: Policy, problem: Problem, name: str | None = None) -> dict[str, float]:
    """Job id -> the isolated-share throughput the policy measures finish times against. A
    plug-in's own (``name`` not a built-in) that raises or is not one number per job is a
    PluginError naming it, as a bad answer is (policy_service/plugins.py)."""
    baseline = getattr(policy, "isolated_baseline", None)
    if baseline is None:
        values = isolated_throughputs(problem)
    elif name is None or is_builtin(name):
        values = baseline(problem)
    else:
        try:
            values = np.asarray(baseline(problem), dtype=float).reshape(-1)
        except PLUGIN_FAULTS as error:  # the plug-in's fault, one answer's worth (sys.exit too)
            raise PluginError(PLUGIN_KIND, name, f"isolated_baseline raised {one_line(error)}") from None
        if len(values) != problem.num_jobs or not np.isfinite(values).all():
            raise PluginError(PLUGIN_KIND, name, f"isolated_baseline returned {len(values)} values, not {problem.num_jobs} finite ones")
    values = np.asarray(values, dtype=float)
    if len(values) != problem.num_jobs:
        raise ValueError(f"isolated baseline: {len(values)} values for {problem.num_jobs} jobs")
    return dict(zip(problem.job_ids, values.tolist()))


def computed_message(request_id: str, allocation: Allocation, **fields: object) -> AllocationComputed:
    """The wire form of an allocation: one entry per job, one per concrete packed pair (what
    allocation_to_json writes, laid out from the arrays directly). ``fields``: the reply's other
    fields (isolated throughputs, policy state)."""
    entries = [AllocationEntry(job_ids, fractions) for job_ids, fractions in entry_fractions(allocation)]
    objective = allocation.objective
    return AllocationComputed(
        request_id=request_id,
        policy=allocation.policy,
        status=SolveStatus(allocation.status),
        objective=float(objective) if objective is not None and math.isfinite(objective) else None,
        solve_time_s=float(allocation.solve_time_s),
        entries=tuple(entries),
        reason=allocation.reason or "",
        refused_job_ids=allocation.refused_job_ids,
        valid_for_s=_valid_for_s(allocation.valid_for_s),
        **fields,  # type: ignore[arg-type]
    )


def _valid_for_s(seconds: float | None) -> float | None:
    """Allocation.valid_for_s as the reply carries it: a float (numpy's too), None for never
    (an infinite one means that, and the wire takes finite numbers only)."""
    return float(seconds) if seconds is not None and math.isfinite(seconds) else None


def entry_fractions(allocation: Allocation) -> list[tuple[tuple[str, ...], dict[str, float]]]:
    """(job ids, worker type -> fraction) of each job, then of each concrete packed pair: the
    reply's entries, as allocation_to_json writes them (answer_columns' entries)."""
    return answer_columns(allocation).entries()


def _cleaned(fractions: np.ndarray) -> np.ndarray:
    """Solver noise (below NOISE_FRACTION) written as 0, as the JSON writer does
    (io_json._fractions)."""
    fractions = np.asarray(fractions, dtype=float)
    return np.where(np.abs(fractions) < NOISE_FRACTION, 0.0, fractions)


def answer_columns(allocation: Allocation) -> AnswerColumns:
    """entry_fractions' entries as arrays (AnswerColumns): the same jobs, pairs and floats, for
    the mechanism in this process to install without a dict per entry made to be read back."""
    num_types = len(allocation.worker_types)
    if allocation.pairs.num_pairs:
        pair_jobs, pair_fractions = expand_pairs(allocation.pairs)
    else:  # nothing packed (an unpacked policy's every answer)
        pair_jobs, pair_fractions = np.zeros((0, 2), dtype=np.int64), np.zeros((0, num_types))
    return AnswerColumns(
        job_ids=allocation.job_ids,
        types=allocation.worker_types,
        job_fractions=_cleaned(allocation.job_fractions),
        pair_members=np.asarray(pair_jobs, dtype=np.int64),
        pair_fractions=_cleaned(pair_fractions),
    )


def answer(
    request: AllocationRequested, context: SolveContext, *, admitted: bool = False
) -> AllocationComputed | AllocationFailed:
    """``admitted``: the request comes from a mechanism in this process (the simulator's fast
    path), whose jobs passed the same field checks at admission; the service, which reads
    requests off the bus, never sets it (validation.build_problem)."""
    try:
        policy = policy_for(request, context.plugins)
        problem = problem_from_message(request.problem, context, request.policy_state, admitted=admitted)
        allocation = allocate(policy, problem, request.policy)
        return computed_message(
            request.request_id, allocation,
            isolated_throughputs_steps_per_s=isolated_baseline(policy, problem, request.policy),
            policy_state=allocation.policy_state or "",
        )
    except GavelError as e:
        return AllocationFailed(request.request_id, request.policy, str(e), refused_job_ids=getattr(e, "job_ids", ()))


@dataclasses.dataclass(frozen=True)
class AdmittedRequest:
    """An AllocationRequested as a mechanism in this process hands it over (the simulator's fast
    path, mechanism_service/core/policy_input.py admitted_snapshot): the same fields, with the
    jobs column by column and no pairs, entities or prices of its own (the table and the
    context's prices stand for them, as for such a request)."""

    request_id: str
    policy: str
    worker_types: Mapping[str, int]
    jobs: AdmittedJobs
    previous: tuple[AllocationEntry, ...] | PreviousColumns
    packing: bool
    preset: str = "default"
    seed: int | None = None
    solver: str | None = None
    policy_state: str = ""


@dataclasses.dataclass(frozen=True)
class AdmittedAnswer:
    """AllocationComputed's content as the mechanism installs it: the entries (one per job, one
    per packed pair, as the reply's) as arrays (AnswerColumns; ``fractions``: as job ids ->
    fractions), each job's isolated baseline, the policy's state."""

    columns: AnswerColumns
    isolated_throughputs_steps_per_s: dict[str, float]
    policy_state: str
    solve_time_s: float
    valid_for_s: float | None = None  # AllocationComputed's

    @property
    def fractions(self) -> dict[tuple[str, ...], dict[str, float]]:
        """The entries as job ids -> type -> fraction (what allocation_fractions reads off the
        reply; apply_allocation takes either)."""
        return self.columns.fractions()


def answer_admitted(request: AdmittedRequest, context: SolveContext) -> AdmittedAnswer | AllocationFailed:
    """answer(admitted=True) for an AdmittedRequest: the same problem (build_problem with the
    arguments problem_from_message passes for such a request), policy and allocation."""
    try:
        policy = policy_for(request, context.plugins)  # type: ignore[arg-type]  # reads policy, preset, solver, seed
        # Unpacked max-min (the default preset's re-solves): from the columns to the fractions
        # matrix, without the Problem, Space and Allocation (core/admitted_max_min.py)
        direct = None if request.packing else answer_max_min(
            policy, request.jobs, request.worker_types, context.table, context.prices_per_hour
        )
        if direct is not None:
            num_types = len(direct.worker_types)
            return AdmittedAnswer(
                columns=AnswerColumns(
                    direct.job_ids, direct.worker_types, direct.fractions, np.zeros((0, 2), dtype=np.int64),
                    np.zeros((0, num_types)),
                ),
                isolated_throughputs_steps_per_s=dict(zip(direct.job_ids, direct.isolated_throughputs_steps_per_s.tolist())),
                policy_state="",
                solve_time_s=direct.solve_time_s,
            )
        problem = build_problem(
            request.worker_types,
            request.jobs,
            pairs=None if request.packing else [],
            entities=[],
            prices_per_hour=context.prices_per_hour,
            table=context.table,
            # (a policy that never reads the last allocation is not handed it: building it is
            # ~10% of such an answer, and the mechanism's own entries need no checking)
            previous=(request.previous or None) if getattr(policy, "reads_previous", True) else None,  # type: ignore[arg-type]
            policy_state=request.policy_state or None,
            admitted=True,
        )
        allocation = allocate(policy, problem, request.policy)
        return AdmittedAnswer(
            columns=answer_columns(allocation),
            isolated_throughputs_steps_per_s=isolated_baseline(policy, problem, request.policy),
            policy_state=allocation.policy_state or "",
            solve_time_s=float(allocation.solve_time_s),
            valid_for_s=allocation.valid_for_s,
        )
    except GavelError as e:
        return AllocationFailed(request.request_id, request.policy, str(e), refused_job_ids=getattr(e, "job_ids", ()))
