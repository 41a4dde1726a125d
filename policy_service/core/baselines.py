"""Reference shares the policies normalise by, and the agnostic views of throughputs.

All pure numpy, shapes (n,) or (n, K). The formulas follow Gavel (stanford-futuredata/gavel,
scheduler/policies/proportional.py and isolated.py) because the `gavel` simulator preset must
solve the same programs.
"""

from __future__ import annotations

import numpy as np

from common.errors import ProblemError
from policy_service.core.problem import Problem


def equal_share_throughputs(problem: Problem) -> np.ndarray:
    """(n,) steps/s each job would get from an equal share of every worker type:
    sum_k T[j, k] * N_k / sum_k N_k.

    This is Gavel's "proportional" normalisation of max-min fairness (paper section 4.1: the
    throughput with 1/n of the cluster, up to the factor 1/n common to all jobs, which does not
    change the argmax). It ignores the scale factor: the LP multiplies by it separately.
    """
    counts = problem.worker_counts
    return problem.throughputs_steps_per_s @ counts / counts.sum()


def isolated_fractions(problem: Problem) -> np.ndarray:
    """(n, K) Gavel's "isolated" allocation: every job gets 1/n of each type's GPUs,
    x[j, k] = N_k / (n * s_j), scaled down so that no job exceeds 100% of its time.

    This is the baseline of finish-time fairness (Themis' rho) and the `isolated` policy.
    """
    num_jobs = problem.num_jobs
    if num_jobs == 0:
        return np.zeros((0, problem.num_types))
    x = problem.worker_counts[None, :] / num_jobs / problem.scale_factors[:, None].astype(float)
    row = x.sum(axis=1)
    return x / np.maximum(row, 1.0)[:, None]


def isolated_throughputs(problem: Problem) -> np.ndarray:
    """(n,) steps/s of each job under :func:`isolated_fractions`."""
    return (problem.throughputs_steps_per_s * isolated_fractions(problem)).sum(axis=1)


def agnostic_unit_throughputs(problem: Problem) -> Problem:
    """The problem as a heterogeneity-agnostic policy sees it for max-min fairness: every
    throughput is 1, so a job's "throughput" is the time it gets (Gavel's MaxMinFairnessPolicy)."""
    return problem.with_throughputs(np.ones_like(problem.throughputs_steps_per_s))


def reference_type(problem: Problem, name: str | None) -> int:
    """Column of the reference type of agnostic makespan / FTF: ``name``, or "v100" when the
    cluster has it (Gavel hard-codes v100), else the first worker type."""
    if name is None:
        name = "v100" if "v100" in problem.worker_types else problem.worker_types[0]
    if name not in problem.worker_types:
        raise ProblemError(f"worker_types: reference type {name!r} of the agnostic policy is not in the cluster")
    return problem.worker_types.index(name)


def agnostic_reference_throughputs(problem: Problem, name: str | None) -> Problem:
    """The problem as heterogeneity-agnostic makespan and FTF see it: every type runs each job
    at its speed on the reference type (Gavel: "Hardcode worker_type to v100")."""
    column = reference_type(problem, name)
    tput = problem.throughputs_steps_per_s
    return problem.with_throughputs(np.repeat(tput[:, column:column + 1], problem.num_types, axis=1))
