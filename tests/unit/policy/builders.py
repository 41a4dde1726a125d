"""Builders for policy tests: Gavel's throughput table, random problems drawn from it, small
hand-made problems, and the feasibility check every allocation must pass."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from common.throughputs import ThroughputTable, throughput_table_from_json
from policy_service.core import Allocation, JobSpec, Problem, build_problem

DATA = Path(__file__).resolve().parents[3] / "common" / "data"
TYPES = ("v100", "p100", "k80")
PRICES = {"v100": 2.48, "p100": 1.46, "k80": 0.45}


@lru_cache(maxsize=1)
def gavel_table() -> ThroughputTable:
    return throughput_table_from_json(json.loads((DATA / "simulation_throughputs.json").read_text()))


def random_jobs(
    n: int,
    seed: int,
    *,
    multi_gpu: bool = True,
    with_slos: bool = False,
    entities: tuple[str, ...] = (),
    weights: bool = False,
) -> list[JobSpec]:
    """n jobs drawn like Gavel's generator: job type uniform, scale factors 1/2/4/8 at
    70/10/15/5 % (or all 1), steps = V100 run time of 60 * 10^U(1.5, 3) s (80%) or
    60 * 10^U(3, 4) s, arrivals spread over the last 10,000 s."""
    rng = np.random.default_rng(seed)
    table = gavel_table()
    keys = sorted(table.job_keys)
    jobs = []
    for i in range(n):
        sf = int(rng.choice([1, 2, 4, 8], p=[0.7, 0.1, 0.15, 0.05])) if multi_gpu else 1
        candidates = [k for k in keys if k[1] == sf]
        job_type = candidates[int(rng.integers(len(candidates)))][0]
        exponent = rng.uniform(1.5, 3) if rng.random() < 0.8 else rng.uniform(3, 4)
        run_time_s = 60 * 10**exponent
        steps = run_time_s * table.isolated(job_type, sf, "v100")
        jobs.append(
            JobSpec(
                id=f"j{i}",
                job_type=job_type,
                scale_factor=sf,
                priority_weight=float(rng.choice([1.0, 2.0])) if weights else 1.0,
                steps_remaining=float(round(steps)),
                time_since_arrival_s=float(rng.uniform(0, 10_000)),
                slo_s=float(rng.uniform(3, 20) * run_time_s) if with_slos and rng.random() < 0.3 else None,
                entity=entities[i % len(entities)] if entities else None,
            )
        )
    return jobs


def random_problem(
    n: int,
    seed: int,
    *,
    gpus_per_type: int | None = None,
    packing: bool = True,
    **job_options: object,
) -> Problem:
    """A problem on v100/p100/k80 with max(8, n / 4) GPUs of each type (or ``gpus_per_type``)."""
    count = gpus_per_type if gpus_per_type is not None else max(8, n // 4)
    jobs = random_jobs(n, seed, **job_options)  # type: ignore[arg-type]
    from policy_service.core import Entity

    entity_names = job_options.get("entities", ())
    entities = [Entity(name, weight=float(e + 1)) for e, name in enumerate(entity_names)]  # type: ignore[arg-type]
    return build_problem(
        dict.fromkeys(TYPES, count), jobs, table=gavel_table(), prices_per_hour=PRICES,
        pairs=None if packing else [], entities=entities,
    )


def simple_problem(
    counts: dict[str, int],
    throughputs: list[dict[str, float]],
    *,
    steps: list[float] | None = None,
    scale_factors: list[int] | None = None,
    weights: list[float] | None = None,
    **kwargs: object,
) -> Problem:
    """Hand-made problems: one job per throughputs row, ids "0", "1", ..."""
    jobs = [
        JobSpec(
            id=str(i),
            steps_remaining=(steps or [1000.0] * len(throughputs))[i],
            scale_factor=(scale_factors or [1] * len(throughputs))[i],
            priority_weight=(weights or [1.0] * len(throughputs))[i],
            throughputs_steps_per_s=row,
        )
        for i, row in enumerate(throughputs)
    ]
    return build_problem(counts, jobs, **kwargs)  # type: ignore[arg-type]


def assert_feasible(problem: Problem, allocation: Allocation, tol: float = 1e-6) -> None:
    """The invariants every allocation must hold."""
    assert allocation.job_ids == problem.job_ids
    assert allocation.worker_types == problem.worker_types
    assert allocation.job_fractions.shape == (problem.num_jobs, problem.num_types)
    assert np.all(allocation.job_fractions >= -tol)
    assert np.all(allocation.pairs.pair_time >= -tol)
    assert np.all(allocation.total_time_per_job() <= 1 + tol)
    assert np.all(allocation.gpus_used(problem.scale_factors) <= problem.worker_counts + tol)
    if allocation.pairs.num_pairs:
        sf = problem.scale_factors
        members = allocation.pairs.group_of_job
        # Packed jobs share one scale factor.
        for a, b in allocation.pairs.group_pairs[allocation.pairs.pair_time.sum(axis=1) > tol]:
            assert len({int(s) for s in sf[(members == a) | (members == b)]}) == 1
