"""Policy solve times (issue 3): median of 3 runs per case, with the targets beside them.

    .venv/bin/python bench/policy_solve.py [--json] [--runs 3] [--only SUBSTRING] [--extras]

Workload (seeded, numpy Generator): jobs drawn from Gavel's throughput table
(common/data/simulation_throughputs.json) — scale factor 1/2/4/8 with probability
70/10/15/5 %, job type uniform over the types that exist with that scale factor, steps
remaining = V100 run time x V100 throughput with Gavel's run-time distribution (60 x 10^U(1.5,3)
s with probability 0.8, else 60 x 10^U(3,4) s), time since arrival U(0, 10^4) s, priority
weight 1. Cluster: max(8, n/4) GPUs of each of v100, p100, k80 (n/4 each: 1,536 GPUs for 2,048
jobs). Water filling: 4 entities, weights 1, 2, 3, 4, policy "fairness", jobs dealt round-robin.

Each case runs in a fresh process (so peak RSS is the case's own): one untimed warm-up solve of
the same problem (first-call costs: solver library load, cvxpy caches; reported as cold_s),
then ``--runs`` timed calls of ``policy.allocate(problem)``; the table shows the median and
where the time went (our matrix building, cvxpy canonicalisation, the solver).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class Case:
    policy: str
    jobs: int
    target_s: float | None = None
    params: dict = field(default_factory=dict)
    entities: int = 0
    fifo_entities: int = 0
    label: str = ""
    note: str = ""

    @property
    def title(self) -> str:
        return self.label or self.policy


CASES = [
    Case("max_min_fairness_perf", 32),
    Case("max_min_fairness_perf", 256),
    Case("max_min_fairness_perf", 2048, 0.03, note="Gavel+ECOS here: 0.08 s"),
    Case("max_min_fairness_packed", 32),
    Case("max_min_fairness_packed", 256, note="Gavel+ECOS here: 3.8 s"),
    Case("max_min_fairness_packed", 2048, 1.0, note="exact optimum; Gavel POP k=8: 12.6 s, 1.5% off"),
    Case("max_min_fairness_packed", 8192),
    Case("max_min_fairness_water_filling_perf", 2048, 2.0, entities=4, note="4 fairness entities; Gavel: 97 s"),
    Case("min_total_duration_perf", 2048),
    Case("finish_time_fairness_perf", 2048),
]

EXTRAS = [
    Case("max_min_fairness_perf", 2048, params={"solver": "ECOS"}, label="max_min_fairness_perf [ECOS]"),
    Case("max_min_fairness_packed", 2048, params={"solver": "ECOS"}, label="max_min_fairness_packed [ECOS]"),
    Case("max_min_fairness_packed", 256, params={"grouping": False}, label="max_min_fairness_packed [ungrouped]",
         note="Gavel's per-job-pair program"),
    Case("max_min_fairness_water_filling_perf", 2048, entities=4, fifo_entities=2,
         label="water_filling_perf [2 fifo + 2 fair]", note="one LP per FIFO job served"),
    Case("max_min_fairness_water_filling_packed", 2048, entities=4, label="water_filling_packed [4 fair]"),
    Case("min_total_duration_perf", 2048, params={"exact": False}, label="min_total_duration_perf [bisection]",
         note="Gavel's 5% binary search"),
    Case("min_total_duration_packed", 2048),
    Case("finish_time_fairness_packed", 2048),
    Case("max_sum_throughput_perf", 2048),
    Case("allox", 256, note="single-GPU jobs only"),
]


def make_problem(case: Case, seed: int = 0):
    import numpy as np

    from common.throughputs import throughput_table_from_json
    from policy_service.core import Entity, JobSpec, build_problem

    table = throughput_table_from_json(json.loads((ROOT / "common/data/simulation_throughputs.json").read_text()))
    rng = np.random.default_rng(seed)
    keys = sorted(table.job_keys)
    by_scale = {sf: [k for k in keys if k[1] == sf] for sf in (1, 2, 4, 8)}
    multi_gpu = case.policy != "allox"
    names = [f"e{e}" for e in range(case.entities)]
    jobs = []
    for i in range(case.jobs):
        sf = int(rng.choice([1, 2, 4, 8], p=[0.7, 0.1, 0.15, 0.05])) if multi_gpu else 1
        job_type = by_scale[sf][int(rng.integers(len(by_scale[sf])))][0]
        run_time_s = 60 * 10 ** (rng.uniform(1.5, 3) if rng.random() < 0.8 else rng.uniform(3, 4))
        jobs.append(JobSpec(
            id=str(i), job_type=job_type, scale_factor=sf,
            steps_remaining=float(round(run_time_s * table.isolated(job_type, sf, "v100"))),
            time_since_arrival_s=float(rng.uniform(0, 10_000)),
            entity=names[i % len(names)] if names else None,
        ))
    entities = [
        Entity(name, weight=float(e + 1), policy="fifo" if e < case.fifo_entities else "fairness")
        for e, name in enumerate(names)
    ]
    count = max(8, case.jobs // 4)
    return build_problem({"v100": count, "p100": count, "k80": count}, jobs, table=table, entities=entities)


def run_case(case: Case, runs: int, queue) -> None:
    """Child process: build, warm up, time, report."""
    from policy_service.core import make_policy
    from policy_service.core.allocation import expand_pairs

    problem = make_problem(case)
    policy = make_policy(case.policy, **case.params)
    started = time.perf_counter()
    first = policy.allocate(problem)
    cold_s = time.perf_counter() - started
    walls, results = [], []
    for _ in range(runs):
        started = time.perf_counter()
        allocation = policy.allocate(problem)
        walls.append(time.perf_counter() - started)
        results.append(allocation)
    started = time.perf_counter()
    pair_jobs, _ = expand_pairs(results[-1].pairs)
    expand_s = time.perf_counter() - started

    def median_of(key: str) -> float | None:
        values = [r.timings.get(key) for r in results if r.timings.get(key) is not None]
        return statistics.median(values) if values else None

    queue.put({
        "case": case.title,
        "policy": case.policy,
        "jobs": case.jobs,
        "gpus": int(problem.worker_counts.sum()),
        "median_s": statistics.median(walls),
        "runs_s": walls,
        "cold_s": cold_s,
        "target_s": case.target_s,
        "meets_target": None if case.target_s is None else statistics.median(walls) <= case.target_s,
        "build_s": median_of("build_s"),
        "compile_s": median_of("compile_s"),
        "solver_s": median_of("solver_s"),
        "lp_solves": median_of("iterations") or (1.0 if median_of("solver_s") is not None else 0.0),
        "status": str(first.status),
        "objective": first.objective,
        "concrete_pairs": int(len(pair_jobs)),
        "expand_pairs_s": expand_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "note": case.note,
        "params": case.params,
    })


def baseline_rss_mb() -> float:
    """RSS of a process that only imported the library (what every case starts from)."""
    code = (
        "import resource, policy_service.core, cvxpy, clarabel;"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.{digits}f}"


def print_table(rows: list[dict], baseline_mb: float) -> None:
    header = (
        f"{'case':40s} {'jobs':>5s} {'GPUs':>5s} {'median s':>9s} {'target s':>9s} {'ok':>3s} "
        f"{'build':>7s} {'canon':>7s} {'solver':>7s} {'LPs':>4s} {'cold s':>7s} {'RSS MB':>7s}  status / note"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        ok = "" if row["meets_target"] is None else ("yes" if row["meets_target"] else "NO")
        print(
            f"{row['case']:40s} {row['jobs']:5d} {row['gpus']:5d} {_fmt(row['median_s'], 4):>9s} "
            f"{_fmt(row['target_s']):>9s} {ok:>3s} {_fmt(row['build_s']):>7s} {_fmt(row['compile_s']):>7s} "
            f"{_fmt(row['solver_s']):>7s} {int(row['lp_solves'] or 0):4d} {_fmt(row['cold_s']):>7s} "
            f"{row['peak_rss_mb']:7.0f}  {row['status']}{' / ' + row['note'] if row['note'] else ''}"
        )
    print(
        f"\nmedian of runs after one warm-up solve; build = our numpy/scipy matrix assembly, canon = cvxpy "
        f"canonicalisation, solver = the solver's own time (summed over LPs for iterative policies).\n"
        f"RSS MB = peak resident memory of the case's process; importing the library alone: {baseline_mb:.0f} MB."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", default="", help="run cases whose name contains this")
    parser.add_argument("--extras", action="store_true", help="also run the comparison cases")
    args = parser.parse_args()
    cases = CASES + (EXTRAS if args.extras else [])
    cases = [c for c in cases if args.only in c.title]
    context = multiprocessing.get_context("spawn")
    rows = []
    for case in cases:
        queue = context.Queue()
        process = context.Process(target=run_case, args=(case, args.runs, queue))
        process.start()
        row = queue.get()
        process.join()
        rows.append(row)
        if not args.json:
            print(f"  done: {case.title} n={case.jobs} {row['median_s']:.4f} s", file=sys.stderr)
    baseline = baseline_rss_mb()
    if args.json:
        print(json.dumps({"baseline_rss_mb": baseline, "cases": rows}, indent=2))
    else:
        print_table(rows, baseline)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
