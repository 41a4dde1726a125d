"""Load-based admission's curve (Blox, EuroSys 2024, figures 12-13): as the bound on the scheduled
jobs' GPU demand tightens, where do jobs wait? A generated trace (Gavel's generator, gangs of 1-8
GPUs) on 4:4:4 with 2-GPU servers, max_min_fairness_perf, default preset, bus-free path.

For each bound (max_load: scheduled GPU demand per GPU of the cluster; "none": accept_all, the
baseline) it prints, over the completed jobs, the mean JCT from arrival, the mean JCT from
admission (Blox's "JCT of admitted jobs"), the mean wait before admission and in the scheduler
(admitted, not running), in hours, and the JCT from admission as a ratio to the baseline's.
Deterministic (simulated figures): the same on any machine.

Usage: python bench/admission_load.py [--jobs 60] [--jobs-per-hour 6] [--bounds none,2,1.5,1,0.75,0.5] [--seed 7]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mechanism_service.core.settings import preset
from policy_service.service import shipped_context
from sim.admission_curve import waits
from sim.fastpath import RunConfig, simulate
from sim.traces import TraceSpec, generate_trace

POLICY = "max_min_fairness_perf"
CLUSTER = {"v100": 4, "p100": 4, "k80": 4}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--jobs-per-hour", type=float, default=6.0)
    parser.add_argument("--bounds", default="none,2,1.5,1,0.75,0.5")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    context = shipped_context()
    spec = TraceSpec(num_jobs=args.jobs, jobs_per_hour=args.jobs_per_hour, multi_gpu=True)
    trace = generate_trace(spec, context.table, np.random.default_rng(args.seed))
    base = preset("default", POLICY, gpus_per_server=2)
    print(
        f"{args.jobs} jobs at {args.jobs_per_hour:g}/h (trace seed {args.seed}, gangs of 1-8), 4:4:4 in 2-GPU servers, "
        f"{POLICY}, default preset; hours, over completed jobs"
    )
    print(f"{'max_load':>8} {'done':>5} {'JCT':>8} {'JCT from admission':>19} {'before admission':>17} {'in scheduler':>13} {'vs none':>8}")
    baseline = None
    for bound in args.bounds.split(","):
        fields = {} if bound == "none" else {"admission": "load", "admission_params": (("max_load", bound),)}
        result = simulate(trace, RunConfig(POLICY, CLUSTER, dataclasses.replace(base, **fields), seed=0), context)
        w = waits(result)
        if baseline is None:
            baseline = w.jct_from_admission_s
        print(
            f"{bound:>8} {w.jobs:5d} {w.jct_s / 3600:8.1f} {w.jct_from_admission_s / 3600:19.1f} "
            f"{w.admission_wait_s / 3600:17.1f} {w.scheduler_wait_s / 3600:13.2f} {w.jct_from_admission_s / baseline:7.2f}x"
        )


if __name__ == "__main__":
    main()
