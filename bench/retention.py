"""What the mechanism's retention rule saves on a long run (issue 13: memory stays bounded).

The real services on the in-memory bus, in virtual time, with the mechanism on a journal (it
snapshots its whole memory at every boundary that dispatches), replay a generated trace twice in
separate processes: once under the simulator's rule (sim.driver.SIM_RETENTION: nothing that is
over is kept; --rounds N keeps the newest N finished jobs and rounds), once keeping every finished
job and round (the baseline: the mechanism before the rule). Printed per run: wall time; the
snapshot's size at each tenth of the run (it follows the active jobs under the rule, and only
grows without it); the snapshots' median write time and their total; the process's peak resident
memory (the run's, archive and results included); and whether both runs' results are the same
(every job and round). Measured figures: bench/RESULTS.md; the rule: docs/reliability.md.

Usage: python bench/retention.py [--jobs 200] [--jobs-per-hour 6] [--cluster v100=4,p100=4,k80=4]
                                 [--rounds 0] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def child(variant: str, jobs: int, rate: float, cluster: dict[str, int], rounds: int) -> dict[str, object]:
    import hashlib
    import pickle

    import numpy as np

    import sim.driver as driver
    from mechanism_service.core.retention import KEEP_ALL, Retention
    from mechanism_service.core.settings import preset
    from policy_service.service import shipped_context
    from common.journal import Journal
    from sim.fastpath import RunConfig
    from sim.traces import TraceSpec, generate_trace

    if variant == "keep-all":
        driver.SIM_RETENTION = KEEP_ALL
    else:
        driver.SIM_RETENTION = Retention(finished_s=None, finished_jobs=rounds, rounds=rounds, lost_workers=1_000)
    context = shipped_context()
    trace = generate_trace(TraceSpec(num_jobs=jobs, jobs_per_hour=rate), context.table, np.random.default_rng(0))
    config = RunConfig("max_min_fairness", cluster, preset("default", "max_min_fairness"), seed=0)
    writes: list[tuple[float, int]] = []
    with tempfile.TemporaryDirectory() as tmp:
        journal = Journal(pathlib.Path(tmp) / "mechanism.sqlite")
        save = journal.save_snapshot

        def measured(memory: object) -> None:
            started = time.perf_counter()
            save(memory)
            writes.append((time.perf_counter() - started, len(pickle.dumps(memory, protocol=pickle.HIGHEST_PROTOCOL))))

        journal.save_snapshot = measured  # type: ignore[method-assign]
        started = time.perf_counter()
        result = asyncio.run(driver.simulate_services(trace, config, context, journal=journal))
        wall_s = time.perf_counter() - started
        journal.close()
    # (the size is measured apart from the write, so the write's time is the snapshot's alone)
    tenths = [writes[min(len(writes) - 1, (len(writes) * k) // 10)][1] for k in range(1, 11)]
    schedule = [(j.job_id, j.start_s, j.completion_s, j.steps_done) for j in result.jobs], result.rounds
    return {
        "variant": variant, "wall_s": round(wall_s, 1), "rounds": len(result.rounds),
        "completed": sum(j.completion_s is not None for j in result.jobs), "snapshots": len(writes),
        "snapshot_bytes_by_tenth": tenths,
        "snapshot_write_ms_median": round(1000 * float(np.median([t for t, _ in writes])), 2),
        "snapshot_write_s_total": round(sum(t for t, _ in writes), 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "results_digest": hashlib.sha256(repr(schedule).encode()).hexdigest()[:16],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--jobs-per-hour", type=float, default=6.0)
    parser.add_argument("--cluster", default="v100=4,p100=4,k80=4")
    parser.add_argument("--rounds", type=int, default=0, help="the rule: finished jobs and rounds kept (default 0, the simulator's)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cluster = {k: int(v) for k, v in (item.split("=") for item in args.cluster.split(","))}
    if args.child:
        print(json.dumps(child(args.child, args.jobs, args.jobs_per_hour, cluster, args.rounds)))
        return
    runs = []
    for variant in ("retention", "keep-all"):  # one process each: peak memory is the run's own
        out = subprocess.run(
            [sys.executable, __file__, "--child", variant, "--jobs", str(args.jobs), "--jobs-per-hour", str(args.jobs_per_hour),
             "--cluster", args.cluster, "--rounds", str(args.rounds)],
            check=True, capture_output=True, text=True,
        )
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    ruled, baseline = runs
    summary = {
        "runs": runs, "same_results": ruled["results_digest"] == baseline["results_digest"],
        "wall_ratio_vs_keep_all": round(ruled["wall_s"] / baseline["wall_s"], 3),
        "last_snapshot_ratio_vs_keep_all": round(ruled["snapshot_bytes_by_tenth"][-1] / baseline["snapshot_bytes_by_tenth"][-1], 3),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"{args.jobs} jobs at {args.jobs_per_hour:g}/h on {args.cluster}, mechanism on a journal (services engine)")
    for run in runs:
        sizes = ", ".join(f"{b / 1e6:.2f}" for b in run["snapshot_bytes_by_tenth"])
        print(
            f"  {run['variant']:<9}  wall {run['wall_s']:>7.1f} s  rounds {run['rounds']:>6}  completed {run['completed']:>5}  "
            f"snapshots {run['snapshots']:>6}  write median {run['snapshot_write_ms_median']:>6.2f} ms, total "
            f"{run['snapshot_write_s_total']:>6.1f} s  peak RSS {run['peak_rss_mib']:>6.1f} MiB"
        )
        print(f"             snapshot MB at each tenth of the run: {sizes}")
    print(
        f"  same results: {summary['same_results']}; wall {summary['wall_ratio_vs_keep_all']}x the baseline's; "
        f"last snapshot {summary['last_snapshot_ratio_vs_keep_all']}x"
    )


if __name__ == "__main__":
    main()
