"""The policy library's pure core: problems in, allocations out. No I/O, no logging, no asyncio.

    from policy_service.core import problem_from_json, make_policy, allocation_to_json

    problem = problem_from_json(json.load(file), table)     # ProblemError names the bad field
    allocation = make_policy("max_min_fairness_packed").allocate(problem)
    json.dump(allocation_to_json(allocation), out)

Modules: problem (the input value) and validation (build_problem), allocation (the output
value), registry + catalog (policies by name), one module per objective family (fairness,
waterfilling, makespan, ftf, throughput, fifo, isolated, gandiva, allox), pop (partitioning
wrapper), formulation / grouping / packing / solving / compiled / pair_columns / highs_columns
(the shared LP machinery; pair_columns: column generation when every job has its own row,
highs_columns: its restricted programs), baselines
(normalising shares), evaluate (objectives of any allocation), io_json (the JSON formats).
See docs/policies.md.
"""

from policy_service.core.allocation import Allocation, PairShares, Status, expand_pairs
from policy_service.core.allox import AlloX, allox
from policy_service.core.catalog import REGISTRY, default_registry, make_policy, policy_names
from policy_service.core.fairness import MaxMinFairness, max_min_fairness
from policy_service.core.fifo import Fifo, fifo
from policy_service.core.formulation import SolveOptions
from policy_service.core.ftf import FinishTimeFairness, advance_isolated_time, finish_time_fairness
from policy_service.core.gandiva import Gandiva, gandiva
from policy_service.core.io_json import (
    allocation_from_json,
    allocation_to_json,
    prices_from_json,
    problem_from_json,
    problem_to_json,
)
from policy_service.core.isolated import Isolated, Proportional, isolated, proportional
from policy_service.core.makespan import MinTotalDuration, min_total_duration
from policy_service.core.pop import Pop, pop
from policy_service.core.problem import (
    AllocationEntry,
    ClassPairSpec,
    Colocation,
    Entity,
    JobSpec,
    PairSpec,
    PreviousAllocation,
    Problem,
)
from policy_service.core.registry import Policy, Registry
from policy_service.core.throughput import MaxSumThroughput, max_sum_throughput
from policy_service.core.validation import build_problem
from policy_service.core.waterfilling import WaterFilling, water_filling

__all__ = [
    "REGISTRY", "AlloX", "Allocation", "AllocationEntry", "ClassPairSpec", "Colocation", "Entity", "Fifo",
    "FinishTimeFairness", "Gandiva", "Isolated", "JobSpec", "MaxMinFairness", "MaxSumThroughput",
    "MinTotalDuration", "PairShares", "PairSpec", "Policy", "Pop", "PreviousAllocation", "Problem",
    "Proportional", "Registry", "SolveOptions", "Status", "WaterFilling", "advance_isolated_time",
    "allocation_from_json", "allocation_to_json", "allox", "build_problem", "default_registry",
    "expand_pairs", "fifo", "finish_time_fairness", "gandiva", "isolated", "make_policy",
    "max_min_fairness", "max_sum_throughput", "min_total_duration", "policy_names", "pop",
    "prices_from_json", "problem_from_json", "problem_to_json", "proportional", "water_filling",
]
