"""Every policy, registered under Gavel's names (utils.get_available_policies at commit c4fa400,
plus ``proportional``), and schedulers of other papers (``srtf``, ``tiresias``, ``themis``, ``optimus``, each with
its ``_perf`` variant; ``gandiva_ts``). Each name
binds parameters of a family constructor; ``make_policy`` accepts overrides
(``make_policy("max_min_fairness_perf", solver="ECOS", grouping=False)``).
"""

from __future__ import annotations

from policy_service.core.allox import allox
from policy_service.core.fairness import max_min_fairness
from policy_service.core.fifo import fifo
from policy_service.core.ftf import finish_time_fairness
from policy_service.core.gandiva import gandiva
from policy_service.core.gandiva_ts import gandiva_time_slicing
from policy_service.core.isolated import isolated, proportional
from policy_service.core.makespan import min_total_duration
from policy_service.core.registry import Policy, Registry
from policy_service.core.srtf import srtf
from policy_service.core.throughput import max_sum_throughput
from policy_service.core.optimus import optimus
from policy_service.core.themis import themis
from policy_service.core.tiresias import tiresias
from policy_service.core.waterfilling import water_filling


def default_registry() -> Registry:
    """A fresh registry holding every built-in policy."""
    registry = Registry()
    add = registry.register
    for base, family, what in (
        ("max_min_fairness", max_min_fairness, "max-min fairness (LAS)"),
        ("max_min_fairness_water_filling", water_filling, "hierarchical max-min fairness (water filling)"),
        ("min_total_duration", min_total_duration, "minimum makespan"),
        ("finish_time_fairness", finish_time_fairness, "finish-time fairness (Themis rho)"),
        ("fifo", fifo, "first in, first out"),
    ):
        add(base, family, heterogeneity_aware=False, summary=f"{what}, heterogeneity-agnostic")
        add(base + "_perf", family, summary=f"{what}, heterogeneity-aware")
        add(base + "_packed", family, space_sharing=True, summary=f"{what}, aware, with space sharing")
    add("max_sum_throughput_perf", max_sum_throughput, summary="maximum total throughput")
    add(
        "max_sum_throughput_normalized_by_cost_perf", max_sum_throughput, cost_normalized=True,
        summary="maximum total throughput per dollar",
    )
    add(
        "max_sum_throughput_normalized_by_cost_perf_SLOs", max_sum_throughput, cost_normalized=True,
        enforce_slos=True, summary="maximum total throughput per dollar, meeting every SLO",
    )
    add(
        "max_sum_throughput_normalized_by_cost_packed_SLOs", max_sum_throughput, space_sharing=True,
        cost_normalized=True, enforce_slos=True,
        summary="maximum total throughput per dollar, meeting every SLO, with space sharing",
    )
    add("isolated", isolated, summary="1/n of every type's GPUs per job")
    add("proportional", proportional, summary="equal share of every type's time, scaled to fit")
    add("gandiva", gandiva, summary="Gandiva: random packing when oversubscribed, equal shares")
    add("allox", allox, summary="AlloX: minimum sum of completion times by assignment")
    add("srtf", srtf, heterogeneity_aware=False, summary="shortest remaining time first, heterogeneity-agnostic")
    add("srtf_perf", srtf, summary="shortest remaining time first, heterogeneity-aware")
    add("tiresias", tiresias, heterogeneity_aware=False, summary="Tiresias: discretised 2D-LAS, heterogeneity-agnostic")
    add("tiresias_perf", tiresias, summary="Tiresias: discretised 2D-LAS, heterogeneity-aware")
    add("themis", themis, heterogeneity_aware=False, summary="Themis: finish-time fairness auctions, heterogeneity-agnostic")
    add("themis_perf", themis, summary="Themis: finish-time fairness auctions, heterogeneity-aware")
    add("optimus", optimus, heterogeneity_aware=False, summary="Optimus: greedy progress per GPU, heterogeneity-agnostic")
    add("optimus_perf", optimus, summary="Optimus: greedy progress per GPU, heterogeneity-aware")
    add("gandiva_ts", gandiva_time_slicing, summary="Gandiva: round-robin time-slicing, introspective packing")
    return registry


REGISTRY = default_registry()


def make_policy(name: str, **params: object) -> Policy:
    """The policy registered as ``name`` (UnknownPolicyError lists the known names)."""
    return REGISTRY.create(name, **params)


def policy_names() -> tuple[str, ...]:
    return REGISTRY.names()
