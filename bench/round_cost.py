"""What a simulated round costs outside the policy's solves: `gavel simulate --json` on one trace
for each preset and policy, (wall - solve time) / rounds, and the same with the process's CPU
time, checkouts alternated run by run (medians of --repeat runs each).

    .venv/bin/python bench/round_cost.py --trace T --cluster 36:36:36 --window 4000:5000 \\
        --policies max_min_fairness,max_min_fairness_perf --trees /tmp/before,. --repeat 3

Each tree is a checkout of this repository, run with PYTHONPATH set to it and this interpreter,
so two commits are compared on the same machine in turn. A simulation that skips quiet rounds
(sim/quiet.py) plans fewer rounds than it records: the figure is over the rounds recorded, so
compare checkouts that plan alike, or pass --no-skip for both.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run_once(tree: Path, args: argparse.Namespace, preset: str, policy: str, skip: bool) -> dict[str, float]:
    """One `gavel simulate` in a child process: its summary's figures and its CPU seconds."""
    with tempfile.TemporaryDirectory() as out:
        command = [
            sys.executable, "-c", "import sys; from services.cli import main; sys.argv[0] = 'gavel'; sys.exit(main())",
            "simulate", "--trace", args.trace, "--cluster", args.cluster, "--policy", policy, "--preset", preset,
            "--no-plots", "--json", "--out", out,
            *(["--window", args.window] if args.window else []),
            *([] if skip else ["--no-skip-quiet-rounds"]),  # (only a checkout that skips knows the flag)
        ]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(
            command, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True, check=True,
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = json.loads(done.stdout)
    rounds = summary["num_rounds"]
    solve_s = summary["solve_time_total_s"]
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "wall_s": summary["wall_s"], "solve_s": solve_s, "rounds": rounds, "cpu_s": cpu_s,
        "round_us": 1e6 * (summary["wall_s"] - solve_s) / rounds, "round_cpu_us": 1e6 * (cpu_s - solve_s) / rounds,
        "avg_jct_s": summary["avg_jct_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", required=True)
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--window", default="")
    parser.add_argument("--presets", default="default,gavel")
    parser.add_argument("--policies", default="max_min_fairness,max_min_fairness_perf")
    parser.add_argument("--trees", default=".", help="checkouts to compare, comma-separated (alternated run by run)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-skip", action="store_true", help="plan every round (--no-skip-quiet-rounds)")
    args = parser.parse_args()
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    cases = [(p, q) for p in args.presets.split(",") for q in args.policies.split(",")]
    results: dict[tuple[str, str, Path], list[dict[str, float]]] = {}
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    for _ in range(args.repeat):
        for preset, policy in cases:
            for tree in trees:
                skip = not args.no_skip or not (tree / "sim" / "quiet.py").exists()
                runs = results.setdefault((preset, policy, tree), [])
                runs.append(run_once(tree, args, preset, policy, skip))
                r = runs[-1]
                print(f"  {preset:8s} {policy:24s} {tree.name:20s} wall {r['wall_s']:6.1f} s  solve {r['solve_s']:5.1f} s  "
                      f"cpu {r['cpu_s']:6.1f} s  {r['round_us']:5.0f} us/round ({r['round_cpu_us']:4.0f} CPU)", flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    print("| preset | policy | tree | rounds | wall s | solve s | per round (wall - solve) | per round (CPU - solve) |")
    print("|---|---|---|---|---|---|---|---|")
    for (preset, policy, tree), runs in results.items():
        median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        print(f"| {preset} | {policy} | {tree.name} | {median['rounds']:,.0f} | {median['wall_s']:.1f} | {median['solve_s']:.1f} | "
              f"{median['round_us']:.0f} us | {median['round_cpu_us']:.0f} us |")


if __name__ == "__main__":
    main()
