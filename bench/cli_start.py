"""How long a `gavel` command takes to start, as a user feels it (issue 12, item 4).

Whole process, from exec to exit: `gavel --version`, `gavel jobs --help`, `gavel submit --help`
(target <= 0.3 s each, median of 5), and for context `gavel --help`, `gavel simulate --help` and
a bare interpreter (`python -c pass`, the floor nobody can go below). Each command runs through
the virtualenv's interpreter as `python -m services.cli` (what the `gavel` script does).

`--baseline DIR` runs the same commands from another checkout (e.g. `git worktree add
/tmp/base <commit>`), with the same interpreter: this tree and the baseline alternate run by run,
so a machine whose load drifts treats both alike. What gets imported is tested, not timed, in
tests/cli/test_cli_imports.py.

Usage: python bench/cli_start.py [--runs 5] [--baseline DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 0.3
COMMANDS = (
    ("gavel --version", ["--version"], True),
    ("gavel jobs --help", ["jobs", "--help"], True),
    ("gavel submit --help", ["submit", "--help"], True),
    ("gavel --help", ["--help"], False),
    ("gavel simulate --help", ["simulate", "--help"], False),
)


def wall_s(argv: list[str], tree: Path) -> float:
    """One whole process from ``tree``: its packages come first on the path (the venv's editable
    install points at /work/main, but a finder on sys.path wins over it)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    began = time.perf_counter()
    subprocess.run([sys.executable, *argv], cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - began


def measure(trees: dict[str, Path], runs: int) -> dict[str, dict[str, list[float]]]:
    cases = [("python -c pass", ["-c", "pass"])] + [(name, ["-m", "services.cli", *argv]) for name, argv, _ in COMMANDS]
    times: dict[str, dict[str, list[float]]] = {label: {name: [] for name, _ in cases} for label in trees}
    for _ in range(runs):
        for name, argv in cases:
            for label, tree in trees.items():  # alternate: the same load for both
                times[label][name].append(wall_s(argv, tree))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", type=Path, metavar="DIR", help="another checkout to compare with")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    trees = {"this": ROOT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    times = measure(trees, args.runs)
    medians = {label: {name: statistics.median(t) for name, t in by_name.items()} for label, by_name in times.items()}
    if args.json:
        print(json.dumps({"runs": args.runs, "target_s": TARGET_S, "median_s": medians, "times_s": times}, indent=2))
        return 0
    load = os.getloadavg()[0]
    print(f"whole process, median of {args.runs}, s (load average at the end: {load:.1f} on {os.cpu_count()} cores)")
    header = f"{'command':24} {'this':>7}" + (f" {'baseline':>9} {'ratio':>6}" if "baseline" in trees else "") + "  target"
    print(header)
    targets = {name: target for name, _, target in COMMANDS}
    for name in times["this"]:
        line = f"{name:24} {medians['this'][name]:7.3f}"
        if "baseline" in trees:
            base = medians["baseline"][name]
            line += f" {base:9.3f} {base / medians['this'][name]:5.1f}x"
        if targets.get(name):
            line += f"  <= {TARGET_S} s: {'met' if medians['this'][name] <= TARGET_S else 'NOT met'}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
