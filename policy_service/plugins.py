"""Policies by plug-in: which names a process answers, what a plug-in's spec loads, and a plug-in's
answer checked before it goes anywhere (docs/extending.md).

A name is served when it is a built-in (the registry, policy_service/core/catalog.py), an
installed entry point of ``gavel.policies``, or one of the specs the process was started with
(``SolveContext.plugins``: ``gavel serve policy --policy pkg.mod:Name``, the simulator's own
``--policy``). Any other ``module:Name`` is refused, never imported: a request names its policy,
and a request is anybody's message on the bus, so importing what it names would run whatever
module a publisher chose.

A plug-in is a factory (a class, a function) that returns an object with ``name`` and
``allocate(problem) -> Allocation``, as the built-ins. It is checked when it is loaded (the
factory callable, one object made, ``allocate`` taking one problem), and its answers at each
call: an exception or an answer that is not a valid allocation costs that answer
(AllocationFailed naming the plug-in), never the process that asked.
"""

from __future__ import annotations

import functools
import inspect
import numbers

import numpy as np

from common.errors import PluginError, UnknownPolicyError
from common.plugins import (
    PLUGIN_FAULTS,
    check_callable,
    check_method,
    installed,
    one_line,
    resolve,
)
from policy_service.core.allocation import Allocation, PairShares, Status
from policy_service.core.catalog import REGISTRY
from policy_service.core.problem import Problem
from policy_service.core.registry import Policy, RegistryEntry

KIND = "policy"
TOLERANCE = 1e-6  # the slack a solver's answer gets on "<= 1" and "<= the GPUs there are"


def is_builtin(name: str) -> bool:
    return name in REGISTRY


def policy_entry(name: str, served: tuple[str, ...] = ()) -> RegistryEntry:
    """The entry ``name`` stands for in a process that serves ``served`` besides the built-ins and
    the installed entry points. An unknown bare name is UnknownPolicyError (it lists the known
    ones); a ``module:Name`` not served, or a plug-in that does not load, PluginError."""
    if name in REGISTRY:
        return REGISTRY.entry(name)
    return _served_plugin(name, served)


@functools.lru_cache(maxsize=64)
def _served_plugin(name: str, served: tuple[str, ...]) -> RegistryEntry:
    # Cached once it loads (a solve asks for its policy's entry every time); a refusal is not
    # cached, so a plug-in installed later is found, at the cost of a scan per refused request.
    points = installed(KIND)
    if name in served or name in points:
        return load_policy(name)
    if ":" not in name:
        raise UnknownPolicyError(name, [*REGISTRY.names(), *points, *served])
    raise PluginError(
        KIND, name,
        "not served here: a policy replica or a gavel serve simulator answers the built-in policies, the installed plug-ins "
        f"({', '.join(sorted(points)) or 'none'}) and those it was started with ({', '.join(served) or 'none'}); "
        "it never imports a module a request names (start it with --policy " + name + ")",
    )


@functools.lru_cache(maxsize=64)
def load_policy(spec: str) -> RegistryEntry:
    """The entry for ``spec`` (a built-in, an installed entry point or ``module:Name``), its
    plug-in checked: the factory callable with no argument, the object it makes with a ``name``
    and an ``allocate(problem)``. PluginError says what is wrong; an unknown bare name is
    UnknownPolicyError (the known ones listed, the installed plug-ins among them)."""
    if ":" not in spec and spec not in REGISTRY and spec.strip() not in (points := installed(KIND)):
        raise UnknownPolicyError(spec, [*REGISTRY.names(), *points])  # a typo is not a plug-in's fault
    found = resolve(KIND, spec, {entry.name: entry for entry in REGISTRY})
    if isinstance(found, RegistryEntry):
        return found
    check_callable(KIND, spec, found, what="its factory")
    policy = _make(spec, found, {})
    check_method(KIND, spec, policy, "allocate", args=("problem",))
    if not isinstance(getattr(policy, "name", None), str):
        raise PluginError(KIND, spec, f"the object its factory makes (a {type(policy).__name__}) has no name (a str)")
    summary = (inspect.getdoc(found) or "").partition("\n")[0]
    return RegistryEntry(spec, found, summary=summary or "a plug-in")


def make_plugin(entry: RegistryEntry, params: dict[str, object]) -> Policy:
    """A plug-in's policy with those of ``params`` (the preset's, the solver, the seed) its
    factory takes: a plug-in that takes no ``solver`` chooses its own, and one that takes
    ``rng`` or ``seed`` gets the request's; the factory raising is the plug-in's fault, said so."""
    parameters = inspect.signature(entry.factory).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        params = {k: v for k, v in params.items() if k in parameters}
    return _make(entry.name, entry.factory, params)


def _make(spec: str, factory: object, params: dict[str, object]) -> Policy:
    try:
        return factory(**params)  # type: ignore[operator,no-any-return]
    except PLUGIN_FAULTS as error:  # a plug-in may raise anything: its one line, named (sys.exit too)
        raise PluginError(KIND, spec, f"its factory raised {one_line(error)}") from None


def allocate(policy: Policy, problem: Problem, name: str) -> Allocation:
    """``policy.allocate(problem)``; for a plug-in (``name`` not a built-in), an exception or an
    answer that is not a valid allocation of this problem is a PluginError naming it."""
    if name in REGISTRY:
        return policy.allocate(problem)
    try:
        allocation = policy.allocate(problem)
    except PLUGIN_FAULTS as error:  # the plug-in's fault, one answer's worth (sys.exit too)
        raise PluginError(KIND, name, f"allocate raised {one_line(error)}") from None
    try:
        problem_with = _invalid(allocation, problem)
    except Exception as error:  # noqa: BLE001 - an answer malformed beyond the checks (fractions of str, ...)
        problem_with = f"an answer that cannot be read ({one_line(error)})"
    if problem_with:
        raise PluginError(KIND, name, f"allocate returned {problem_with}")
    return allocation


def _invalid(allocation: object, problem: Problem) -> str:
    """What makes ``allocation`` no answer to ``problem`` ("" when it is one): the invariants of
    Allocation's docstring, vectorised."""
    if not isinstance(allocation, Allocation):
        return f"a {type(allocation).__name__}, not an Allocation"
    fields = _invalid_fields(allocation)
    if fields:
        return fields
    if tuple(allocation.job_ids) != tuple(problem.job_ids) or tuple(allocation.worker_types) != tuple(problem.worker_types):
        return "an allocation of other jobs or types than the problem's (job_ids and worker_types must be the problem's)"
    fractions = np.asarray(allocation.job_fractions, dtype=float)
    if fractions.shape != (problem.num_jobs, problem.num_types):
        return f"job_fractions of shape {fractions.shape}, not (jobs, types) = {(problem.num_jobs, problem.num_types)}"
    if not np.isfinite(fractions).all() or (fractions < 0).any():
        return "job_fractions that are negative or not finite"
    total = allocation.total_time_per_job()
    if (total > 1 + TOLERANCE).any():
        worst = int(np.argmax(total))
        return f"job {problem.job_ids[worst]!r} scheduled {total[worst]:.4g} of the time (at most 1)"
    used = allocation.gpus_used(problem.scale_factors)
    over = used > problem.worker_counts * (1 + TOLERANCE) + TOLERANCE
    if over.any():
        k = int(np.argmax(over))
        return f"{used[k]:.4g} {problem.worker_types[k]} GPUs in use on average, of {int(problem.worker_counts[k])}"
    return ""


def _invalid_fields(allocation: Allocation) -> str:
    """What of an answer's other fields the mechanism could not take ("" when all can be): each
    travels in AllocationComputed or is read by the caller (a valid_for_s of "soon" failed the
    reply's encoding, so the mechanism heard nothing until its deadline, and stopped a simulation
    with a TypeError)."""
    if allocation.status not in tuple(Status):  # (a Status, or its value as a str)
        return f"status {allocation.status!r}, not one of {', '.join(Status)}"
    if not isinstance(allocation.pairs, PairShares):
        return f"pairs of type {type(allocation.pairs).__name__}, not PairShares"
    for name in ("solve_time_s", "objective", "valid_for_s"):
        value = getattr(allocation, name)
        if name != "solve_time_s" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return f"{name} {value!r}, not a number"
    if not 0 <= allocation.solve_time_s < float("inf"):  # (NaN too)
        return f"solve_time_s {allocation.solve_time_s!r}: seconds >= 0, finite"
    if allocation.valid_for_s is not None and not allocation.valid_for_s >= 0:  # (NaN too)
        return f"valid_for_s {allocation.valid_for_s!r}: seconds >= 0, or None for as long as the job set holds"
    for name in ("policy", "policy_state", "reason"):
        value = getattr(allocation, name)
        if (value is not None or name == "policy") and not isinstance(value, str):
            return f"{name} of type {type(value).__name__}, not a str"
    if not all(isinstance(job_id, str) for job_id in allocation.refused_job_ids):
        return "refused_job_ids that are not job ids (str)"
    return ""
