"""What each difference between the `gavel` and `default` presets does to average JCT.

Starts from Gavel's mechanism (preset gavel) and changes one setting at a time, then all of them
(preset default), on Gavel's two calibration traces. Prints a table (and --json) for
bench/RESULTS.md. Each row is one deterministic run (no medians needed: the simulator is exact).

`--migration` measures instead what the default preset does about moves (docs/mechanism.md,
"What a move costs"): from the default preset as it was before migration-aware rounds (20 s
restores, every round decided afresh) it switches each piece on in turn, beside Gavel's
mechanism (which pays nothing for a move), on the continuous calibration trace, on the trace of
issue 23 (Gavel's generator with seed 0, the calibration trace's shape: 1,200 jobs at 1.4/h on
8:8:8, jobs 100-299 measured; `generated`) and on a generated trace at Gavel's paper scale
(36:36:36, 4 jobs/h, Gavel's generator with seed 0, 3,000 jobs, jobs 1000-1499 measured), and
prints average JCT, the worst finish-time-fairness ratio and the share of leases that move
(every lease that is not an extension pays the restore). bench/catch_up.py measures the last
piece, catching up, on more traces and against the noise of close settings.

Packed at paper scale is left out unless --paper-packed. A run with the default preset makes
~3,100 answers of 60-80 jobs: 240 s of CPU measured before the packed program went straight to
CLARABEL (compiled_packed.py) and the pair expansion was vectorised (pair_expansion.py), which
saved ~23 ms of the ~77 ms of CPU an answer cost (~70 s a run); Gavel's preset (ECOS over every
job pair through cvxpy, ~930 answers) measured 190 s. On a shared machine the wall time is
several times that (15 min each with the load at 5-10 on 2 cores). --variants runs only the rows whose label holds one
of its words, so that the rows can run as separate processes.

Usage: python bench/preset_differences.py [--json] [--migration [--traces continuous,generated,paper] [--policies A,B] [--paper-packed] [--variants W1,W2]]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mechanism_service.core.settings import (  # noqa: E402
    DEFAULT_CATCH_UP_RATIO,
    DEFAULT_MOVE_CHARGE_RESTORES,
    DEFAULT_RESTORE_S,
    DEFAULT_STEADY_TYPES_TOLERANCE,
    PACKING_POLICIES,
    gavel_preset,
    preset,
)
from policy_service.service import shipped_context  # noqa: E402
from sim.fastpath import RunConfig, simulate  # noqa: E402
from sim.metrics import finish_time_fairness, isolated_throughputs_from_table, summarize  # noqa: E402
from sim.traces import TraceSpec, TraceStreams, generate_trace, read_trace  # noqa: E402

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


MIGRATION_POLICIES = ["max_min_fairness_perf", "max_min_fairness_packed"]


def migration_traces(context, names):
    """(name, trace, cluster, window, seed) for --migration."""
    if "continuous" in names:
        trace = read_trace(REFERENCE / "continuous_rate1.4_n1200_seed1.trace")
        yield "continuous 8:8:8", trace, {"v100": 8, "p100": 8, "k80": 8}, (100, 300), 1
    if "generated" in names:  # issue 23's: the calibration trace's shape, Gavel's generator with seed 0
        trace = generate_trace(TraceSpec(num_jobs=1200, jobs_per_hour=1.4), context.table, TraceStreams.gavel(0))
        yield "generated 8:8:8", trace, {"v100": 8, "p100": 8, "k80": 8}, (100, 300), 0
    if "paper" in names:
        trace = generate_trace(TraceSpec(num_jobs=3000, jobs_per_hour=4.0), context.table, TraceStreams.gavel(0))
        yield "paper scale 36:36:36", trace, {"v100": 36, "p100": 36, "k80": 36}, (1000, 1500), 0


def migration_variants(policy: str):
    """Each piece of migration-aware rounds switched on in turn, then alternatives to the default;
    the row the default preset is is named so (a piece it leaves off for this policy shows as
    the same figures twice)."""
    default = preset("default", policy)
    before = dataclasses.replace(
        default, extensions_first=False, charge_moves=False, move_overhead_share=None, allocated_first=False,
        steady_types_tolerance=None, catch_up_ratio=None,
    )
    charged_once = dataclasses.replace(before, extensions_first=True, charge_moves=True, move_charge_restores=1.0)
    holds = dataclasses.replace(charged_once, move_overhead_share=default.move_overhead_share)
    allocated_first = dataclasses.replace(holds, allocated_first=True)
    steady = dataclasses.replace(allocated_first, steady_types_tolerance=DEFAULT_STEADY_TYPES_TOLERANCE)
    yield "gavel (no cost for a move)", preset("gavel", policy)
    yield "default before (20 s restores)", before
    yield "+ extensions before fresh placements", dataclasses.replace(before, extensions_first=True)
    yield "+ moves charged in the priorities (one restore)", charged_once
    yield "+ holds until a move is paid", holds
    yield "+ allocated entries picked first", allocated_first
    yield "+ steady allocation (1e-4)", steady
    # the default: for packed policies without the steady allocation (settings.default_preset)
    yield f"+ {DEFAULT_MOVE_CHARGE_RESTORES:.0f} restores charged per job restarted", dataclasses.replace(default, catch_up_ratio=None)
    yield f"+ jobs behind catch up ({DEFAULT_CATCH_UP_RATIO:g})", default
    yield "  steady allocation alone (no allocated-first)", dataclasses.replace(
        holds, steady_types_tolerance=DEFAULT_STEADY_TYPES_TOLERANCE, move_charge_restores=DEFAULT_MOVE_CHARGE_RESTORES,
        catch_up_ratio=DEFAULT_CATCH_UP_RATIO,
    )
    yield "  default, 4 restores charged", dataclasses.replace(default, move_charge_restores=4.0)
    yield "  default, 8 restores charged", dataclasses.replace(default, move_charge_restores=8.0)
    yield "  default, holds at 0.5% overhead", dataclasses.replace(default, move_overhead_share=0.005)
    yield "  default, holds overshooting 30 moves", dataclasses.replace(default, move_overshoot_moves=30.0)
    yield "  default, catching up at 1.25", dataclasses.replace(default, catch_up_ratio=1.25)
    yield "  default, catching up at 1.4", dataclasses.replace(default, catch_up_ratio=1.4)
    yield "  default before without a restore cost", dataclasses.replace(before, restore_s=0.0)


def migration(
    context, traces: list[str], policies: list[str], as_json: bool, paper_packed: bool = False,
    only: list[str] | None = None,
) -> int:
    """``only``: run just the variants whose label contains one of these words (a paper-scale
    packed run takes minutes: the rows can be run in separate processes)."""
    rows = []
    for name, trace, cluster, window, seed in migration_traces(context, traces):
        for policy in policies:
            if name.startswith("paper") and policy in PACKING_POLICIES and not paper_packed:
                # minutes of CPU a run (the module docstring); --paper-packed runs it anyway.
                continue
            default = preset("default", policy)
            for label, settings in migration_variants(policy):
                if settings == default:
                    label += " (default)"
                if only and not any(word in label for word in only):
                    continue
                result = simulate(trace, RunConfig(policy, cluster, settings, seed=seed, window=window), context)
                isolated = isolated_throughputs_from_table(result, context.table)
                s = summarize(result, context.prices_per_hour or {}, isolated)
                # the worst ratio is one job's (it jumps between close variants): the next one beside it
                ratios = sorted(finish_time_fairness(result, isolated).values())
                leases = sum(r.leases for r in result.rounds)
                moved = leases - sum(r.leases_extended for r in result.rounds)
                rows.append({
                    "trace": name, "policy": policy, "variant": label, "avg_jct_s": s.avg_jct_s,
                    "rho_worst": s.rho_worst, "rho_second": ratios[-2] if len(ratios) > 1 else None, "leases": leases, "moved_share": moved / leases if leases else None,
                    "wall_s": result.wall_s,
                })
                r = rows[-1]
                print(f"  {name:22} {policy:26} {label:52} {r['avg_jct_s']:9.0f} s {r['rho_worst']:6.3f} {r['rho_second']:6.3f}"
                      f" {100 * r['moved_share']:5.1f}% {r['wall_s']:6.1f} s", file=sys.stderr, flush=True)
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    for name in dict.fromkeys(r["trace"] for r in rows):
        for policy in policies:
            mine = [r for r in rows if r["trace"] == name and r["policy"] == policy]
            if not mine:
                continue
            gavel = next((r["avg_jct_s"] for r in mine if r["variant"].startswith("gavel")), mine[0]["avg_jct_s"])
            print(f"\n{name}, {policy}: avg JCT (s, vs Gavel's mechanism), worst and second worst FTF ratio, leases that move")
            for r in mine:
                print(f"{r['variant']:52} {r['avg_jct_s']:9.0f} ({100 * (r['avg_jct_s'] / gavel - 1):+5.1f}%)"
                      f" {r['rho_worst']:7.3f} {r['rho_second']:7.3f} {100 * r['moved_share']:6.1f}%")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--migration", action="store_true", help="what the default preset does about moves")
    parser.add_argument("--traces", default="continuous,generated,paper", help="--migration: continuous, generated, paper (comma-separated)")
    parser.add_argument("--policies", default=",".join(MIGRATION_POLICIES), help="--migration: the policies")
    parser.add_argument("--paper-packed", action="store_true", help="--migration: packed at paper scale too (slow)")
    parser.add_argument("--variants", default="", help="--migration: only the rows whose label contains one of these (comma-separated)")
    args = parser.parse_args()
    context = shipped_context()
    if args.migration:
        return migration(context, args.traces.split(","), args.policies.split(","), args.json, args.paper_packed,
                         [w for w in args.variants.split(",") if w])
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
