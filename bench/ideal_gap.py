"""How far the round mechanism is from the fluid run of the same policy (`gavel simulate --ideal`;
docs/simulator.md, "The fluid bound").

For each policy and preset, one real run (the bus-free path) and one fluid run of the same trace:
prints their average JCT and the ratio real / fluid (the baseline is the fluid run: above 1 is
what realising the allocation in rounds costs; below 1 is where the mechanism's gains, time
slicing and filling GPUs the allocation leaves idle, outweigh it), and the share of jobs that
finish sooner in the real run (the fluid run bounds the average, never each job). Each row is
deterministic.

Traces: `generated` (Gavel's generator, seed 0, `--jobs` jobs at `--rate` jobs/hour, 4:4:4, every
job measured), `static` (Gavel's 32-job static calibration trace on 4:4:4) and `continuous`
(Gavel's 1,200-job calibration trace on 8:8:8, jobs 100-299 measured: both runs stop when those
are done). A row takes seconds (the fluid run solves at every arrival and completion).

Usage: python bench/ideal_gap.py [--traces generated,static,continuous] [--jobs 200] [--rate 3]
       [--policies A,B] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.scenario import Scenario, generated_trace, load_context, run_policy
from sim.traces import read_trace

REFERENCE = Path(__file__).resolve().parents[1] / "tests" / "data" / "gavel-reference"
POLICIES = ("max_min_fairness_perf", "finish_time_fairness_perf", "fifo_perf")
PRESETS = ("default", "gavel")


def traces(names: list[str], jobs: int, rate: float, context) -> dict[str, tuple]:
    out = {}
    for name in names:
        if name == "generated":
            out[name] = (generated_trace(jobs, rate, False, 0, context.table), {"v100": 4, "p100": 4, "k80": 4}, None)
        elif name == "static":
            out[name] = (read_trace(REFERENCE / "static_n32_seed0.trace"), {"v100": 4, "p100": 4, "k80": 4}, None)
        elif name == "continuous":
            trace = read_trace(REFERENCE / "continuous_rate1.4_n1200_seed1.trace")
            out[name] = (trace, {"v100": 8, "p100": 8, "k80": 8}, (100, 300))
        else:
            raise SystemExit(f"--traces: unknown trace {name!r} (generated, static, continuous)")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default="generated,static")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--rate", type=float, default=3.0)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    context = load_context(None)
    rows = []
    for name, (trace, cluster, window) in traces(args.traces.split(","), args.jobs, args.rate, context).items():
        for policy in args.policies.split(","):
            for preset in PRESETS:
                scenario = Scenario(trace, cluster, preset, window=window)
                started = time.perf_counter()
                real, real_summary = run_policy(policy, scenario, context)
                real_wall_s = time.perf_counter() - started
                started = time.perf_counter()
                fluid, fluid_summary = run_policy(policy, Scenario(trace, cluster, preset, window=window, engine="ideal"), context)
                fluid_wall_s = time.perf_counter() - started
                fluid_jct = {j.job_id: j.jct_s for j in fluid.jobs if j.jct_s is not None}
                measured = [j for j in real.jobs if j.job_id in set(real.measured_job_ids) and j.jct_s is not None]
                sooner = sum(1 for j in measured if j.job_id in fluid_jct and j.jct_s < fluid_jct[j.job_id])
                rows.append({
                    "trace": name, "policy": policy, "preset": preset,
                    "real_avg_jct_h": real_summary.avg_jct_s / 3600, "fluid_avg_jct_h": fluid_summary.avg_jct_s / 3600,
                    "ratio": real_summary.avg_jct_s / fluid_summary.avg_jct_s,
                    "jobs_sooner_in_real": sooner, "jobs": len(measured),
                    "real_wall_s": real_wall_s, "fluid_wall_s": fluid_wall_s,
                })
                if not args.json:
                    r = rows[-1]
                    print(
                        f"{name:10s} {policy:26s} {preset:7s} real {r['real_avg_jct_h']:7.2f} h  fluid "
                        f"{r['fluid_avg_jct_h']:7.2f} h  real/fluid {r['ratio']:.3f}  sooner in real "
                        f"{sooner}/{len(measured)}  ({real_wall_s:.1f} s + {fluid_wall_s:.1f} s)",
                        flush=True,
                    )
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
