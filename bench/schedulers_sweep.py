"""The schedulers of other papers against Gavel's LAS and FIFO (issue 26, item 3): each policy's
average JCT per input rate, over the seeds, and its ratio to the baseline (Gavel's LAS,
heterogeneity-aware: max_min_fairness_perf), read from a `gavel sweep` run's sweep.csv.

The sweep (2 seeds x 3 rates x 13 policies, ~3 min of wall time on 2 cores):

    gavel sweep --policies srtf,srtf_perf,tiresias,tiresias_perf,themis,themis_perf,optimus,\\
        optimus_perf,gandiva_ts,max_min_fairness,max_min_fairness_perf,fifo,fifo_perf \\
        --rates 1,2,3 --seeds 0,1 --jobs 150 --multi-gpu --cluster 8:8:8 --out OUT

Usage: python bench/schedulers_sweep.py OUT [--baseline max_min_fairness_perf]
"""

from __future__ import annotations

import argparse
import collections
import csv
import statistics
import sys
from pathlib import Path


def read(path: Path) -> dict[str, dict[float, list[float]]]:
    """policy -> jobs/hour -> the seeds' average JCTs (h), in the CSV's order of policies."""
    out: dict[str, dict[float, list[float]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if row["avg_jct_s"]:
                out[row["policy"]][float(row["jobs_per_hour"])].append(float(row["avg_jct_s"]) / 3600.0)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the sweep's --out directory (its sweep.csv)")
    parser.add_argument("--baseline", default="max_min_fairness_perf")
    args = parser.parse_args(argv)
    runs = read(args.out / "sweep.csv")
    if args.baseline not in runs:
        print(f"--baseline: {args.baseline} is not in {args.out / 'sweep.csv'}", file=sys.stderr)
        return 2
    base = runs[args.baseline]
    rates = sorted(base)
    print(f"average JCT (h), mean over seeds, and its ratio to {args.baseline}")
    print(f"{'policy':<24}" + "".join(f"{f'{r:g} jobs/h':>22}" for r in rates) + f"{'mean ratio':>12}")
    for policy, by_rate in runs.items():
        cells, ratios = [], []
        for r in rates:
            if by_rate.get(r):
                jct, ratio = statistics.mean(by_rate[r]), statistics.mean(by_rate[r]) / statistics.mean(base[r])
                cells.append(f"{jct:8.2f} h ({ratio:5.2f}x)")
                ratios.append(ratio)
            else:
                cells.append("-")
        mean = f"{statistics.mean(ratios):.2f}x" if ratios else "-"
        print(f"{policy:<24}" + "".join(f"{c:>22}" for c in cells) + f"{mean:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
