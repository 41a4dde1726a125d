"""What each difference between the `gavel` and `default` presets does to average JCT.

Starts from Gavel's mechanism (preset gavel) and changes one setting at a time, then all of them
(preset default), on Gavel's two calibration traces. Prints a table (and --json) for
docs/mechanism.md. Each row is one deterministic run (no medians needed: the simulator is exact).

Usage: python bench/preset_differences.py [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mechanism_service.core.settings import DEFAULT_RESTORE_S, gavel_preset, preset  # noqa: E402
from policy_service.service import shipped_context  # noqa: E402
from sim.fastpath import RunConfig, simulate  # noqa: E402
from sim.metrics import summarize  # noqa: E402
from sim.traces import read_trace  # noqa: E402

REFERENCE = Path(__file__).resolve().parents[1] / "tests" / "data" / "gavel-reference"
RUNS = [  # trace, cluster, window, seed
    ("static_n32_seed0.trace", {"v100": 4, "p100": 4, "k80": 4}, None, 0),
    ("continuous_rate1.4_n1200_seed1.trace", {"v100": 8, "p100": 8, "k80": 8}, (100, 300), 1),
]
POLICIES = ["max_min_fairness_perf", "max_min_fairness_packed", "fifo_perf", "finish_time_fairness_perf"]


def variants(policy: str):
    gavel = gavel_preset(policy)
    yield "gavel (Gavel's simulator)", gavel
    yield "re-solve at the next boundary", dataclasses.replace(gavel, min_reset_interval_s=0.0, reset_quirk_at_zero=False)
    yield "run picked jobs without an allocation", dataclasses.replace(gavel, run_unallocated=True)
    yield "credit rounds from their dispatch", dataclasses.replace(gavel, round_start_from_previous_end=False)
    yield f"{DEFAULT_RESTORE_S:.0f} s restore when a job moves", dataclasses.replace(gavel, restore_s=DEFAULT_RESTORE_S)
    yield "our policy programs (CLARABEL, grouped, exact)", dataclasses.replace(gavel, preset="default")
    yield "default (all of the above)", preset("default", policy)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    context = shipped_context()
    rows = []
    for trace_name, cluster, window, seed in RUNS:
        trace = read_trace(REFERENCE / trace_name)
        for policy in POLICIES:
            for label, settings in variants(policy):
                result = simulate(trace, RunConfig(policy, cluster, settings, seed=seed, window=window), context)
                s = summarize(result, context.prices_per_hour or {})
                rows.append(
                    {
                        "trace": trace_name.removesuffix(".trace"),
                        "policy": policy,
                        "variant": label,
                        "avg_jct_h": s.avg_jct_s / 3600,
                        "utilization": s.cluster_utilization,
                        "resets": s.num_resets,
                        "wall_s": result.wall_s,
                    }
                )
                print(f"  {rows[-1]['trace']:32} {policy:28} {label:46} {rows[-1]['avg_jct_h']:8.2f} h", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for trace_name, _, _, _ in RUNS:
        name = trace_name.removesuffix(".trace")
        print(f"\n{name}: average JCT (h), change against Gavel's mechanism")
        print(f"{'variant':48}" + "".join(f"{p:>30}" for p in POLICIES))
        for label, _ in variants(POLICIES[0]):
            cells = []
            for policy in POLICIES:
                base = next(r for r in rows if r["trace"] == name and r["policy"] == policy and r["variant"].startswith("gavel"))
                row = next(r for r in rows if r["trace"] == name and r["policy"] == policy and r["variant"] == label)
                change = 100 * (row["avg_jct_h"] / base["avg_jct_h"] - 1)
                cells.append(f"{row['avg_jct_h']:10.2f} ({change:+6.1f}%)")
            print(f"{label:48}" + "".join(f"{c:>30}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
