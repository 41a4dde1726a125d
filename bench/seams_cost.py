"""What the mechanism's seams (core/seams/) cost the default path, and what a non-default choice
costs: the bus-free simulator on Gavel's calibration trace (1,200 jobs at 1.4/h, 8:8:8, jobs
100-299 measured, max_min_fairness_perf), CPU seconds of the run in a fresh process each time.

Arms, alternated run by run:
  this         this checkout, every seam at its default (accept_all, consolidated, priority)
  baseline     --baseline DIR: another checkout (a `git worktree` of the commit before the seams,
               or this one with their calls taken out), the same run
  load, spread this checkout with --admission load (max_load 2.0) / --placement spread: what a
               choice through the seam costs (their schedules differ, so only the time per round
               is compared)

Prints each arm's median CPU s and rounds, CPU ms per round, and the ratio of each arm's CPU
ms/round to the baseline's (without --baseline: to `this`). Target: the default path no slower
than the baseline beyond noise.

Usage: python bench/seams_cost.py [--runs 5] [--baseline DIR] [--preset gavel|default] [--arms this,baseline,...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "data" / "gavel-reference" / "continuous_rate1.4_n1200_seed1.trace"

# One run in a fresh process, from the checkout on PYTHONPATH: (CPU s of simulate(), rounds).
RUN = """
import dataclasses, json, sys, time
from mechanism_service.core.settings import preset
from policy_service.service import shipped_context
from sim.fastpath import RunConfig, simulate
from sim.traces import read_trace
preset_name, trace_path, fields = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
settings = preset(preset_name, "max_min_fairness_perf")
if fields:
    settings = dataclasses.replace(settings, **{k: (tuple(map(tuple, v)) if isinstance(v, list) else v) for k, v in fields.items()})
config = RunConfig("max_min_fairness_perf", {"v100": 8, "p100": 8, "k80": 8}, settings, seed=0, window=(100, 300))
context, trace = shipped_context(), read_trace(trace_path)
start = time.process_time()
result = simulate(trace, config, context)
print(json.dumps([time.process_time() - start, len(result.rounds)]))
"""

CHOICES = {
    "this": {},
    "load": {"admission": "load", "admission_params": [["max_load", "2.0"]]},
    "spread": {"placement": "spread"},
}


def run(tree: Path, preset_name: str, fields: dict[str, object]) -> tuple[float, int]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", RUN, preset_name, str(TRACE), json.dumps(fields)],
        cwd=tree, env=env, capture_output=True, text=True, check=True,
    ).stdout
    cpu_s, rounds = json.loads(out.strip().splitlines()[-1])
    return float(cpu_s), int(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="another checkout to run the same default run from")
    parser.add_argument("--preset", default="gavel", choices=("gavel", "default"))
    parser.add_argument("--arms", default="this,baseline,load,spread", help="which arms to run (comma-separated)")
    args = parser.parse_args()
    wanted = set(args.arms.split(","))
    arms: dict[str, tuple[Path, dict[str, object]]] = {"this": (ROOT, {})}
    if args.baseline is not None:
        arms["baseline"] = (args.baseline.resolve(), {})
    arms.update({name: (ROOT, fields) for name, fields in CHOICES.items() if name != "this"})
    arms = {name: arm for name, arm in arms.items() if name in wanted or name == "this"}
    samples: dict[str, list[tuple[float, int]]] = {name: [] for name in arms}
    for _ in range(args.runs):
        for name, (tree, fields) in arms.items():
            samples[name].append(run(tree, args.preset, fields))
    reference = "baseline" if "baseline" in arms else "this"
    per_round = {
        name: statistics.median(cpu / rounds * 1000 for cpu, rounds in runs) for name, runs in samples.items()
    }
    print(f"calibration trace, 8:8:8, jobs 100-299, max_min_fairness_perf, preset {args.preset}; medians of {args.runs}")
    print(f"{'arm':10} {'CPU s':>8} {'rounds':>7} {'CPU ms/round':>13} {'vs ' + reference:>12}")
    for name, runs in samples.items():
        cpu = statistics.median(c for c, _ in runs)
        rounds = runs[0][1]
        ratio = per_round[name] / per_round[reference]
        print(f"{name:10} {cpu:8.3f} {rounds:7d} {per_round[name]:13.4f} {ratio:11.3f}x")


if __name__ == "__main__":
    main()
