"""What an allocation achieves: per-job throughputs and each policy's objective, for any
allocation (used by the POP wrapper to score merged parts, by tests to compare policies in one
objective, and by anyone who wants to know how an allocation scores).

All functions take a Problem and an Allocation over the same jobs and worker types.
"""

from __future__ import annotations

import numpy as np

from policy_service.core.allocation import Allocation, _first_member_of_groups
from policy_service.core.baselines import equal_share_throughputs, isolated_throughputs
from policy_service.core.problem import Problem


def job_throughputs(problem: Problem, allocation: Allocation, *, per_type: np.ndarray | None = None) -> np.ndarray:
    """(n,) steps/s each job makes under the allocation (alone and packed); ``per_type`` (K,)
    weights each type's contribution (e.g. 1 / price)."""
    scale = np.ones(problem.num_types) if per_type is None else np.asarray(per_type, float)
    result = (problem.throughputs_steps_per_s * allocation.job_fractions * scale).sum(axis=1)
    pairs = allocation.pairs
    if pairs.num_pairs == 0:
        return result
    member = _first_member_of_groups(pairs)
    sizes = pairs.group_sizes().astype(float)
    a, b = pairs.group_pairs[:, 0], pairs.group_pairs[:, 1]
    _, packed = problem.colocation.job_pair_throughputs(member[a], member[b])  # (P, K, 2)
    same = (a == b)[:, None]
    per_group = np.zeros((len(sizes),))
    gain_a = (packed[:, :, 0] * pairs.pair_time * scale).sum(axis=1) * np.where(same[:, 0], 2.0, 1.0) / sizes[a]
    gain_b = (packed[:, :, 1] * pairs.pair_time * scale).sum(axis=1) * np.where(same[:, 0], 0.0, 1.0) / sizes[b]
    np.add.at(per_group, a, gain_a)
    np.add.at(per_group, b, gain_b)
    grouped = pairs.group_of_job >= 0
    result[grouped] += per_group[pairs.group_of_job[grouped]]
    return result


def fairness_levels(problem: Problem, allocation: Allocation) -> np.ndarray:
    """(n,) s_j * throughput_j / (w_j * E_j): max-min fairness measures the smallest."""
    return job_throughputs(problem, allocation) * problem.scale_factors / (
        problem.priority_weights * equal_share_throughputs(problem)
    )


def makespan_s(problem: Problem, allocation: Allocation) -> float:
    """Time until every job finishes at its allocated rate (inf if one makes no progress)."""
    tput = job_throughputs(problem, allocation)
    busy = problem.steps_remaining > 0
    if not busy.any():
        return 0.0
    with np.errstate(divide="ignore"):
        return float(np.max(np.where(tput[busy] > 0, problem.steps_remaining[busy] / tput[busy], np.inf)))


def finish_time_fairness_rho(problem: Problem, allocation: Allocation) -> np.ndarray:
    """(n,) w_j * rho_j: finish-time fairness measures the largest (see ftf.py)."""
    tput = job_throughputs(problem, allocation)
    baseline_s = problem.isolated_time_s + problem.steps_remaining / np.maximum(isolated_throughputs(problem), 1e-300)
    with np.errstate(divide="ignore", invalid="ignore"):
        remaining_s = np.where(problem.steps_remaining > 0, problem.steps_remaining / tput, 0.0)
    return problem.priority_weights * (problem.time_since_arrival_s + remaining_s) / baseline_s


def objective_value(policy: object, problem: Problem, allocation: Allocation) -> float | None:
    """The objective ``policy`` optimises, evaluated on any allocation (None for heuristics)."""
    from policy_service.core.fairness import MaxMinFairness, fairness_view
    from policy_service.core.ftf import FinishTimeFairness
    from policy_service.core.makespan import MinTotalDuration
    from policy_service.core.throughput import MaxSumThroughput
    from policy_service.core.baselines import agnostic_reference_throughputs
    from policy_service.core.waterfilling import WaterFilling

    if problem.num_jobs == 0:
        return None
    if isinstance(policy, (MaxMinFairness, WaterFilling)):
        view = fairness_view(problem, policy.heterogeneity_aware)
        return float(fairness_levels(view, allocation).min())
    if isinstance(policy, MinTotalDuration):
        view = problem if policy.heterogeneity_aware else agnostic_reference_throughputs(problem, policy.reference_type)
        return makespan_s(view, allocation)
    if isinstance(policy, FinishTimeFairness):
        view = problem if policy.heterogeneity_aware else agnostic_reference_throughputs(problem, policy.reference_type)
        return float(finish_time_fairness_rho(view, allocation).max())
    if isinstance(policy, MaxSumThroughput):
        if policy.cost_normalized and problem.prices_per_hour is not None:
            per_type = 1.0 / np.where(problem.prices_per_hour > 0, problem.prices_per_hour, np.inf)
            return float((job_throughputs(problem, allocation, per_type=per_type) / problem.scale_factors).sum())
        return float(job_throughputs(problem, allocation).sum())
    return None
