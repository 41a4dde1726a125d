"""Max-min fairness without packing for admitted jobs, columns to fractions matrix (issue 27).

The simulator's default preset re-solves max_min_fairness(_perf) at every arrival and completion
(~9,200 times on the README sweep's point, ~16 jobs each). Through the general path each answer
builds a Problem (validation.build_problem), a Space of constraint triplets the compiled program
never reads (formulation.build_space), an Allocation, and then per-job dicts. The program
itself (compiled.solve_max_min) is a few arrays of the classes; this module computes them from
admitted.admitted_columns' arrays directly, in the same numpy operations in the same order as
that path (fairness_coefficients, build_space's masks, Space.grouped's clean-up and _repair,
baselines.isolated_throughputs), so the job x type fractions and baselines are the same floats
(tests/unit/policy/test_admitted_max_min.py holds them to the general path).

``answer_max_min`` says None whenever the general path should answer instead: another policy or
options, jobs the shortcut cannot vouch for (the general path then raises the job-by-job
error), a solve that is not optimal (its reason is the general path's to write).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from common.throughputs import ThroughputTable
from policy_service.core.admitted import AdmittedJobs, admitted_columns
from policy_service.core.allocation import NOISE_FRACTION
from policy_service.core.compiled import solve_max_min
from policy_service.core.fairness import MaxMinFairness
from policy_service.core.grouping import group_jobs
from policy_service.core.validation import _validate_prices, _validate_worker_types


@dataclass(frozen=True, eq=False)
class MaxMinAnswer:
    """A max-min answer for admitted jobs: (n, K) each job's time on each type, solver noise
    (below NOISE_FRACTION) written as 0 as the reply's entries write it, in the request's job and
    type order; (n,) each job's isolated baseline (steps/s)."""

    job_ids: tuple[str, ...]
    worker_types: tuple[str, ...]
    fractions: np.ndarray
    isolated_throughputs_steps_per_s: np.ndarray
    solve_time_s: float


def answer_max_min(
    policy: object, jobs: AdmittedJobs, worker_counts: Mapping[str, int], table: ThroughputTable | None,
    prices_per_hour: Mapping[str, float] | None,
) -> MaxMinAnswer | None:
    """What answer_admitted answers for ``policy`` (a built-in MaxMinFairness solved by the
    compiled program) on these jobs, without a Problem, Space or Allocation; None: ask the
    general path (module docstring). Raises what build_problem raises for the cluster and prices."""
    if type(policy) is not MaxMinFairness or not _compiled_route(policy) or table is None or not len(jobs):
        return None
    started = time.perf_counter()
    worker_types, counts = _validate_worker_types(worker_counts, table)
    columns = admitted_columns(jobs, worker_types, counts, table)
    if columns is None:
        return None
    _validate_prices(prices_per_hour, worker_types, counts)  # its error, as build_problem's
    throughputs, scale_factors, weights = columns[0], columns[1], columns[2]
    num_jobs, num_types = throughputs.shape
    view = throughputs if policy.heterogeneity_aware else np.ones_like(throughputs)
    # fairness.fairness_coefficients (baselines.equal_share_throughputs)
    coefficients = scale_factors / (weights * (view @ counts / counts.sum()))
    # formulation.build_space, unpacked: the classes, and where x may be positive
    classes = group_jobs([view, scale_factors, weights], num_jobs)
    reps = classes.representative
    class_tput = view[reps]
    class_sf = scale_factors[reps].astype(float)
    allowed = (counts > 0)[None, :] & (class_sf[:, None] <= counts[None, :])  # the gang fits the type
    allowed &= class_tput > 0  # not dominated
    # fairness.MaxMinFairness._compiled
    x, _, status = solve_max_min(coefficients[reps, None] * class_tput, classes.sizes * class_sf, counts, allowed)
    if status != "optimal":
        return None
    # Space.grouped: the variables' values cleaned, laid out, repaired (formulation._repair)
    values = x[allowed]
    if not np.isfinite(values).all():
        values = np.nan_to_num(values)
    values = np.clip(values, 0.0, None)
    values[values < NOISE_FRACTION] = 0.0
    x = np.zeros((classes.num_classes, num_types))
    x[allowed] = values
    factor = np.minimum(1.0, 1.0 / np.maximum(x.sum(axis=1), 1e-300))
    x = x * factor[:, None]
    used = ((classes.sizes.astype(float) * class_sf)[:, None] * x).sum(axis=0)
    x = x * np.where(used > counts, counts / np.maximum(used, 1e-300), 1.0)
    fractions = x[classes.class_of_job]
    # answer._cleaned: the entries' noise as 0
    fractions = np.where(np.abs(fractions) < NOISE_FRACTION, 0.0, fractions)
    # baselines.isolated_throughputs (the policy's finish-time baseline: its real throughputs)
    isolated = counts[None, :] / num_jobs / scale_factors[:, None].astype(float)
    isolated = isolated / np.maximum(isolated.sum(axis=1), 1.0)[:, None]
    baseline = (throughputs * isolated).sum(axis=1)
    return MaxMinAnswer(jobs.ids, worker_types, fractions, baseline, time.perf_counter() - started)


def _compiled_route(policy: MaxMinFairness) -> bool:
    """Whether MaxMinFairness.allocate solves ``policy``'s program by compiled.solve_max_min with
    build_space's default masks (the only route this module reproduces)."""
    options = policy.options
    return (
        not policy.space_sharing and options.grouping and options.solver == "CLARABEL"
        and options.exclude_oversized_gangs and options.prune_dominated and not options.solver_options
    )
