"""Policy solve times (issue 3): median of 3 runs per case, with the targets beside them.

    .venv/bin/python bench/policy_solve.py [--json] [--runs 3] [--only SUBSTRING] [--extras]

Workload (seeded, numpy Generator): jobs drawn from Gavel's throughput table
(common/data/simulation_throughputs.json) — scale factor 1/2/4/8 with probability
70/10/15/5 %, job type uniform over the types that exist with that scale factor, steps
remaining = V100 run time x V100 throughput with Gavel's run-time distribution (60 x 10^U(1.5,3)
s with probability 0.8, else 60 x 10^U(3,4) s), time since arrival U(0, 10^4) s, priority
weight 1. Cluster: max(8, n/4) GPUs of each of v100, p100, k80 (n/4 each: 1,536 GPUs for 2,048
jobs). Water filling: 4 entities, weights 1, 2, 3, 4, policy "fairness", jobs dealt round-robin.

Per-job rows (issue 12; ``--per-job`` runs only these): every job's row is the table's times a
seeded factor U(0.9, 1.1), drawn independently per job and per type, so no two jobs share a row
and classes of interchangeable jobs are single jobs; packing comes as an estimator sends it,
fractions per pair of colocation classes (the table's pair / alone; class = job type and scale
factor), so every job pair has steps/s of its own (each job's own row times its fraction). The
same problems are solved with the full pair program (``pair_variables="class_pairs"``: every job
pair a variable) at the sizes where it still fits (``--full-up-to``, 256 jobs by default:
227 s and 783 MB at 512), printed beside with the ratio.

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
    per_job_rows: bool = False

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

PER_JOB_NOTE = "per-job rows"
PER_JOB = [
    Case("max_min_fairness_packed", n, target, per_job_rows=True, label="max_min_fairness_packed [per-job rows]")
    for n, target in ((64, None), (128, None), (256, None), (512, 2.0), (2048, 10.0))
] + [
    Case(policy, n, per_job_rows=True, label=f"{policy} [per-job rows]")
    for policy in ("finish_time_fairness_packed", "min_total_duration_packed")
    for n in (256, 512)
]


def full_program(case: Case) -> Case:
    """The same per-job-row case solved with every job pair a variable."""
    return Case(
        case.policy, case.jobs, params={**case.params, "pair_variables": "class_pairs"}, per_job_rows=True,
        label=case.title.replace("[per-job rows]", "[per-job rows, full pair program]"),
    )


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
    counts = {"v100": count, "p100": count, "k80": count}
    if case.per_job_rows:
        jobs, colocations = _own_rows(jobs, table, tuple(counts), np.random.default_rng(seed + 1))
        return build_problem(counts, jobs, table=table, entities=entities, colocations=colocations)
    return build_problem(counts, jobs, table=table, entities=entities)


def _own_rows(jobs, table, types, rng):  # noqa: ANN001, ANN202
    """Each job its own row (the table's times U(0.9, 1.1) per type) and its colocation class;
    the class colocations the table implies (pair / alone per pair of classes and type)."""
    from dataclasses import replace

    import numpy as np

    from common.throughputs import format_job_key
    from policy_service.core import ClassPairSpec

    factors = rng.uniform(0.9, 1.1, size=(len(jobs), len(types)))
    own = []
    for job, factor in zip(jobs, factors):
        row = np.array([table.isolated(job.job_type, job.scale_factor, k) for k in types]) * factor
        own.append(replace(
            job, throughputs_steps_per_s=dict(zip(types, row.tolist())),
            colocation_class=format_job_key(job.job_type, job.scale_factor),
        ))
    present = sorted({(job.job_type, job.scale_factor) for job in jobs})
    colocations = []
    for x, (type_a, sf) in enumerate(present):
        for type_b, sf_b in present[x:]:
            if sf_b != sf:
                continue
            fractions = {}
            for k in types:
                packed = table.pair(type_a, type_b, sf, k)
                if packed is not None:
                    alone = (table.isolated(type_a, sf, k), table.isolated(type_b, sf, k))
                    fractions[k] = tuple(min(1.0, p / a) if a > 0 else 0.0 for p, a in zip(packed, alone))
            if fractions:
                colocations.append(ClassPairSpec((format_job_key(type_a, sf), format_job_key(type_b, sf)), fractions))
    return own, colocations


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
        "pair_columns": median_of("pair_columns"),
        "candidate_columns": median_of("candidate_columns"),
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
    parser.add_argument("--per-job", action="store_true", help="run only the per-job-row cases")
    parser.add_argument("--jobs", default="", help="run only cases of these sizes (comma-separated)")
    parser.add_argument("--full-up-to", type=int, default=256,
                        help="solve per-job-row cases up to this many jobs with the full pair program too")
    args = parser.parse_args()
    per_job = []
    for case in PER_JOB:
        per_job.append(case)
        if case.jobs <= args.full_up_to:
            per_job.append(full_program(case))
    cases = per_job if args.per_job else CASES + per_job + (EXTRAS if args.extras else [])
    cases = [c for c in cases if args.only in c.title]
    if args.jobs:
        cases = [c for c in cases if c.jobs in {int(n) for n in args.jobs.split(",")}]
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
        print_beside(rows)
    return 0


def print_beside(rows: list[dict]) -> None:
    """Per-job-row cases: the fast form beside the full pair program (same problem, same jobs)."""
    full = {(r["policy"], r["jobs"]): r for r in rows if "full pair program" in r["case"]}
    fast = [r for r in rows if "[per-job rows]" in r["case"]]
    if not fast:
        return
    print("\nper-job rows: fast form vs the full pair program (median s, peak RSS MB, objective gap)")
    for row in fast:
        other = full.get((row["policy"], row["jobs"]))
        line = (f"  {row['policy']:32s} {row['jobs']:5d}  {_fmt(row['median_s'], 3):>8s} s {row['peak_rss_mb']:6.0f} MB"
                f"  columns {int(row['pair_columns'] or 0)} of {int(row['candidate_columns'] or 0)}")
        if other is not None:
            gap = abs(row["objective"] - other["objective"]) / max(1.0, abs(other["objective"]))
            line += (f"  | full {_fmt(other['median_s'], 3):>8s} s {other['peak_rss_mb']:6.0f} MB"
                     f"  {other['median_s'] / row['median_s']:5.1f}x  gap {gap:.1e}")
        else:
            line += "  | full: not run (beyond --full-up-to)"
        print(line)


if __name__ == "__main__":
    raise SystemExit(main())
