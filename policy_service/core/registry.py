"""One policy interface, and a registry of policies by name.

A policy is any object with a ``name`` and ``allocate(problem) -> Allocation`` (pure: same
problem, same answer, except for policies given a random Generator). Families are constructors
with parameters (``max_min_fairness(heterogeneity_aware=True, space_sharing=False)``); Gavel's
names are registry entries that bind those parameters, so the mechanism never asks which
policy it runs and Gavel-named experiments run unchanged.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, is_dataclass, replace
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from common.errors import DuplicatePolicyError, PolicyParameterError, UnknownPolicyError
from policy_service.core.allocation import Allocation
from policy_service.core.problem import Problem


@runtime_checkable
class Policy(Protocol):
    """What the mechanism (and the CLI, and the service) call."""

    @property
    def name(self) -> str: ...

    def allocate(self, problem: Problem) -> Allocation: ...


PolicyFactory = Callable[..., Policy]


@dataclass(frozen=True)
class RegistryEntry:
    """A name, the family constructor it calls, and the parameters the name binds."""

    name: str
    factory: PolicyFactory
    bound: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    summary: str = ""


class Registry:
    """Policies by name. Registering a name twice is an error; so is asking for an unknown one."""

    def __init__(self) -> None:
        self._entries: dict[str, RegistryEntry] = {}

    def register(self, name: str, factory: PolicyFactory, *, summary: str = "", **bound: object) -> None:
        if name in self._entries:
            raise DuplicatePolicyError(name)
        _check_parameters(name, factory, bound)
        self._entries[name] = RegistryEntry(name, factory, MappingProxyType(dict(bound)), summary)

    def entry(self, name: str) -> RegistryEntry:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownPolicyError(name, list(self._entries)) from None

    def create(self, name: str, **params: object) -> Policy:
        """The policy registered as ``name``; ``params`` override or extend the bound ones
        (e.g. ``solver="ECOS"``, ``grouping=False``, ``rng=np.random.default_rng(0)``)."""
        return instantiate(self.entry(name), **params)

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._entries))

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[RegistryEntry]:
        return iter(self._entries[name] for name in self.names())


def instantiate(entry: RegistryEntry, **params: object) -> Policy:
    """The policy ``entry`` makes, ``params`` over its bound ones: a built-in's, or a plug-in's
    (policy_service/plugins.py makes entries for those), named as it was asked for."""
    arguments = {**entry.bound, **params}
    _check_parameters(entry.name, entry.factory, arguments)
    try:
        policy = entry.factory(**arguments)
    except (TypeError, ValueError) as error:
        raise PolicyParameterError(f"policy {entry.name!r}: {error}") from None
    return _named(policy, entry.name)


def _check_parameters(name: str, factory: PolicyFactory, arguments: Mapping[str, object]) -> None:
    signature = inspect.signature(factory)
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
    if accepts_any:
        return
    unknown = sorted(set(arguments) - set(signature.parameters))
    if unknown:
        known = ", ".join(p for p in signature.parameters) or "none"
        raise PolicyParameterError(
            f"policy {name!r} has no parameter {', '.join(map(repr, unknown))} (parameters: {known})"
        )


def _named(policy: Policy, name: str) -> Policy:
    """The policy carries the name it was asked for (what the output's "policy" field says)."""
    if getattr(policy, "name", None) == name or not is_dataclass(policy):
        return policy
    return replace(policy, name=name)  # type: ignore[type-var]
