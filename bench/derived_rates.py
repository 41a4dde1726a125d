"""How well the simulated fleet's size rule (sim/derived_rates.py) fits the throughput table.

A job at a size the table lacks runs at the table's figure for its type at the nearest size it has,
times (n/s)^SIZE_EXPONENT. Here every figure of the table is predicted from its nearest other size
for the same type on the same accelerator type, as if its own size were missing, and the median
relative error is printed for the rule's exponent beside the two baselines it replaced or was
weighed against: the same rate per GPU (exponent 1) and the nearest size's figure unscaled
(exponent 0), with the ratio of each baseline's error to the rule's, and the best exponent on a
grid. Also the median exponent over every pair of sizes of one type on one accelerator type, and
the packed fractions the rule uses for one GPU. Deterministic: one run, no medians over runs.

Usage: python bench/derived_rates.py [--throughputs TABLE.json] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.throughputs import ThroughputTable, throughput_table_from_json  # noqa: E402
from policy_service.service import shipped_context  # noqa: E402
from sim.derived_rates import SIZE_EXPONENT, TableReference, size_rule_errors  # noqa: E402


def median_error(reference: TableReference, exponent: float) -> tuple[float, int]:
    """(median error, figures predicted) of the size rule with this exponent (size_rule_errors)."""
    errors = size_rule_errors(reference, exponent)
    return statistics.median(errors), len(errors)


def median_exponent(table: ThroughputTable) -> tuple[float, int]:
    """The median of log(f(n) / f(s)) / log(n / s) over pairs of sizes s < n of one type on one
    accelerator type, both figures positive."""
    by_key: dict[tuple[str, str], dict[int, float]] = {}
    for (job_type, sf, w), value in table.isolated_steps_per_s.items():
        if value > 0:
            by_key.setdefault((job_type, w), {})[sf] = value
    exponents = [
        math.log(figures[n] / figures[s]) / math.log(n / s)
        for figures in by_key.values() for s in figures for n in figures if n > s
    ]
    return statistics.median(exponents), len(exponents)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--throughputs", help="a table in Gavel's format (default: the shipped one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.throughputs:
        table = throughput_table_from_json(json.loads(Path(args.throughputs).read_text()))
    else:
        table = shipped_context().table
    assert table is not None
    reference = TableReference(table)
    rule, figures = median_error(reference, SIZE_EXPONENT)
    per_gpu, _ = median_error(reference, 1.0)
    unscaled, _ = median_error(reference, 0.0)
    grid = [round(0.05 * i, 2) for i in range(0, 31)]
    best = min(grid, key=lambda e: median_error(reference, e)[0])
    exponent, pairs = median_exponent(table)
    fractions = {w: round(reference.packed_fraction(1, w), 4) for w in table.accelerator_types if "_" not in w}
    result = {
        "figures_predicted": figures,
        "rule_exponent": SIZE_EXPONENT,
        "median_error_rule": round(rule, 4),
        "median_error_per_gpu": round(per_gpu, 4),
        "median_error_unscaled": round(unscaled, 4),
        "per_gpu_over_rule": round(per_gpu / rule, 2),
        "unscaled_over_rule": round(unscaled / rule, 2),
        "best_grid_exponent": best,
        "median_error_best": round(median_error(reference, best)[0], 4),
        "median_exponent": round(exponent, 3),
        "size_pairs": pairs,
        "packed_fraction_one_gpu": fractions,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{figures} figures of the table, each predicted from its nearest other size (median relative error):")
    rows = [
        (f"rule, (n/s)^{SIZE_EXPONENT:g}", f"{rule:.1%}"),
        ("same rate per GPU, (n/s)^1", f"{per_gpu:.1%}  ({per_gpu / rule:.2f}x the rule's)"),
        ("unscaled, (n/s)^0", f"{unscaled:.1%}  ({unscaled / rule:.2f}x the rule's)"),
        ("best on a 0.05 grid", f"(n/s)^{best:g}, {result['median_error_best']:.1%}"),
    ]
    for label, value in rows:
        print(f"  {label + ':':30} {value}")
    print(f"median exponent over {pairs} pairs of sizes: {exponent:.3f}")
    print("packed fraction for one GPU: " + ", ".join(f"{w} {f:.3f}" for w, f in fractions.items()))


if __name__ == "__main__":
    main()
