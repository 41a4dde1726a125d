"""Estimator accuracy, leave one job type out (estimator_service/core/holdout.py).

Every job type of the shipped throughput table (common/data/simulation_throughputs.json) is held
out in turn: the estimator's reference set is the table without it, the held-out job is measured
alone on one feature type and packed with references on a fraction f of the (feature type,
reference) cells, seeded; its figures are then compared with the table's. Per f, over every
held-out type and seed:

- isolated: absolute percentage error of its steps/s alone on the types it was not measured on
  (median, p90);
- colocated: of the packed fractions on the cells not measured, both directions, where the true
  fraction is positive (median, p90); zero misses: true zeros estimated positive;
- matched: the share of trials whose matched reference is the true nearest one;
- wall s: the time the trials of that f took (the estimator's core, no bus).

Goal (issue 11): median colocated error <= 10% at f = 0.25, scale factor 1. The figures are
printed, not asserted; tests/unit/estimator/test_estimator.py holds the goal for seed 0.

Usage: python bench/estimator_accuracy.py [--fractions 0.1,0.25,0.5] [--seeds 3] [--all-sizes] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GOAL_FRACTION = 0.25
GOAL_COLOCATED_MEDIAN = 0.10
LARGER_SIZES = (2, 4, 8)  # --all-sizes: the gang sizes of Gavel's table


def fractions(raw: str) -> list[float]:
    try:
        values = [float(part) for part in raw.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected fractions like 0.1,0.25,0.5, got {raw!r}") from None
    if not values or any(not 0 < f <= 1 for f in values):
        raise argparse.ArgumentTypeError(f"each fraction must be in (0, 1], got {raw!r}")
    return values


def trials_of(table, scale_factors: list[int]) -> list[tuple[str, int]]:  # noqa: ANN001
    """(job type, scale factor) for every type of the table that has that size."""
    return [(t, sf) for sf in scale_factors for t in sorted({t for t, s in table.job_keys if s == sf})]


def run(fractions_: list[float], seeds: int, scale_factors: list[int]) -> dict[str, object]:
    from estimator_service.core.holdout import holdout, summarise
    from policy_service.service import shipped_context
    from sim.progress import ProgressBar

    table = shipped_context().table
    cases = trials_of(table, scale_factors)
    total = len(fractions_) * len(cases) * seeds
    bar = ProgressBar("estimator accuracy", sys.stderr, simulated=False)
    rows, by_size, done = [], [], 0
    for f in fractions_:
        started = time.perf_counter()
        results = []
        for job_type, sf in cases:
            for seed in range(seeds):
                results.append(holdout(table, job_type, f, seed, scale_factor=sf))
                done += 1
                bar(0.0, done, total)
        wall_s = time.perf_counter() - started
        rows.append({"fraction": f, **summarise(results), "wall_s": wall_s})
        if len(scale_factors) > 1:
            sizes = [sf for _, sf in cases for _ in range(seeds)]  # the order results were made in
            for size in scale_factors:
                mine = [r for r, s in zip(results, sizes, strict=True) if s == size]
                by_size.append({"fraction": f, "scale_factor": size, **summarise(mine)})
    bar.close()
    # The goal is stated for single-GPU jobs: with --all-sizes, its row is the scale-factor-1 one.
    goal_rows = [r for r in (by_size or rows) if r["fraction"] == GOAL_FRACTION and r.get("scale_factor", 1) == 1]
    goal_value = goal_rows[0]["colocated_median"] if goal_rows else None
    return {
        "scale_factors": scale_factors,
        "seeds": list(range(seeds)),
        "job_types": len({t for t, _ in cases}),
        "rows": rows,
        "by_scale_factor": by_size,
        "goal": {
            "fraction": GOAL_FRACTION,
            "colocated_median_at_most": GOAL_COLOCATED_MEDIAN,
            "colocated_median": goal_value,
            "met": None if goal_value is None else bool(goal_value <= GOAL_COLOCATED_MEDIAN),
        },
    }


def _pct(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{100 * value:.1f}"


def print_rows(rows: list[dict], first: str) -> None:
    header = (
        f"{first:>6s} {'trials':>6s} {'iso med %':>9s} {'iso p90 %':>9s} {'co med %':>8s} {'co p90 %':>8s} "
        f"{'zero miss':>9s} {'matched %':>9s}{'':>1s}{'wall s':>7s}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        key = f"{r['fraction']:g}" if first == "f" else f"{r['fraction']:g}/{r['scale_factor']}"
        wall = f"{r['wall_s']:7.1f}" if "wall_s" in r else f"{'':>7s}"
        print(
            f"{key:>6s} {r['trials']:6d} {_pct(r['isolated_median']):>9s} {_pct(r['isolated_p90']):>9s} "
            f"{_pct(r['colocated_median']):>8s} {_pct(r['colocated_p90']):>8s} {r['zero_misses']:9d} "
            f"{_pct(r['matched_share']):>9s} {wall}"
        )


def _json_safe(value: object) -> object:
    """NaN (nothing to take a median of) as null: JSON has no NaN."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fractions", type=fractions, default=[0.1, 0.25, 0.5], help="f: share of packed cells measured")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per job type and f (default 3)")
    parser.add_argument("--all-sizes", action="store_true", help="also hold out the types of scale factor 2, 4, 8")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    report = run(args.fractions, args.seeds, [1, *LARGER_SIZES] if args.all_sizes else [1])
    if args.json:
        print(json.dumps(_json_safe(report), indent=2))
        return 0
    sizes = ", ".join(str(sf) for sf in report["scale_factors"])
    print(
        f"leave one job type out: {report['job_types']} job types of the shipped table, scale factor {sizes}, "
        f"seeds 0..{args.seeds - 1}; absolute percentage errors"
    )
    print_rows(report["rows"], "f")
    if report["by_scale_factor"]:
        print("\nby scale factor (f/size):")
        print_rows(report["by_scale_factor"], "f/size")
    goal = report["goal"]
    if goal["colocated_median"] is None:
        print(f"goal: median colocated error <= 10% at f = {GOAL_FRACTION:g}: not evaluated (f = {GOAL_FRACTION:g} not run)")
    else:
        verdict = "met" if goal["met"] else "not met"
        print(f"goal: median colocated error <= 10% at f = {GOAL_FRACTION:g}: {verdict} ({100 * goal['colocated_median']:.1f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
