"""What catching up (core/catch_up.py, --catch-up-ratio) does to the worst finish-time-fairness
ratio and the average JCT, across traces, and how much of it is noise (issue 23, item 6).

On each trace and max-min policy: Gavel's mechanism (the JCT baseline: it pays nothing for a
move), the default preset as it was before migration-aware rounds (the fairness baseline: no
holds, no charge; 20 s restores), and the default preset without and with catch-up. The last two
run four times: as they are, and under three perturbations that change nothing a user would
notice (six restores charged as 5.95 or 6.05, restores of 20.1 s): the schedule diverges, and the
spread of the four says how far a single run's figures are from the rule's. The worst ratio is
one job's, and the average JCT moves by ~0.2% between close settings (docs/mechanism.md).

Traces: Gavel's continuous calibration trace (1,200 jobs at 1.4/h, 8:8:8, jobs 100-299; `cal`),
and traces of Gavel's generator with the same shape and seeds 0 and 2-8 (`g0`: the issue's,
`g2`...); `paper`: 3,000 jobs at 4/h on 36:36:36, jobs 1000-1499 (perf only unless --policies
names packed: ~100-190 s of CPU a packed run there).

Printed per trace and policy: average JCT against Gavel's, the worst and second worst ratio, for
each row; then per setting, over the runs: how many have a worst ratio at or below the
before-migration-aware default's, the mean worst ratio, and the mean change of average JCT
against the default without catch-up (in points of Gavel's JCT).

Usage: python bench/catch_up.py [--traces cal,g0,g2,...,g8] [--policies A,B] [--ratio 1.3] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mechanism_service.core.settings import preset  # noqa: E402
from policy_service.service import shipped_context  # noqa: E402
from sim.fastpath import RunConfig, simulate  # noqa: E402
from sim.metrics import finish_time_fairness, isolated_throughputs_from_table  # noqa: E402
from sim.traces import TraceSpec, TraceStreams, generate_trace, read_trace  # noqa: E402

REFERENCE = Path(__file__).resolve().parents[1] / "tests" / "data" / "gavel-reference"
TRACES = "cal,g0,g2,g3,g4,g5,g6,g7,g8"
POLICIES = "max_min_fairness_perf,max_min_fairness_packed"
# (label, MechanismSettings fields): the rule's run, then three that differ by nothing that matters
PERTURBATIONS = [("as is", {}), ("5.95 restores", {"move_charge_restores": 5.95}),
                 ("6.05 restores", {"move_charge_restores": 6.05}), ("20.1 s restores", {"restore_s": 20.1})]


def trace_of(name: str, context):  # noqa: ANN001, ANN201 - (trace, cluster, window, seed)
    if name == "cal":
        return read_trace(REFERENCE / "continuous_rate1.4_n1200_seed1.trace"), {"v100": 8, "p100": 8, "k80": 8}, (100, 300), 1
    if name == "paper":
        trace = generate_trace(TraceSpec(num_jobs=3000, jobs_per_hour=4.0), context.table, TraceStreams.gavel(0))
        return trace, {"v100": 36, "p100": 36, "k80": 36}, (1000, 1500), 0
    seed = int(name.removeprefix("g"))
    trace = generate_trace(TraceSpec(num_jobs=1200, jobs_per_hour=1.4), context.table, TraceStreams.gavel(seed))
    return trace, {"v100": 8, "p100": 8, "k80": 8}, (100, 300), seed


def run(trace, cluster, window, seed, policy, settings, context) -> dict:  # noqa: ANN001
    result = simulate(trace, RunConfig(policy, cluster, settings, seed=seed, window=window), context)
    measured = set(result.measured_job_ids)
    jcts = [j.jct_s for j in result.jobs if j.job_id in measured]
    ratios = sorted(finish_time_fairness(result, isolated_throughputs_from_table(result, context.table)).values())
    return {"avg_jct_s": sum(jcts) / len(jcts), "worst": ratios[-1], "second": ratios[-2], "wall_s": result.wall_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default=TRACES)
    parser.add_argument("--policies", default=POLICIES)
    parser.add_argument("--ratio", type=float, default=1.3, help="the catch-up ratio measured (default 1.3)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    context = shipped_context()
    rows = []
    for name in args.traces.split(","):
        trace, cluster, window, seed = trace_of(name, context)
        for policy in args.policies.split(","):
            default = preset("default", policy)
            before = dataclasses.replace(
                default, extensions_first=False, charge_moves=False, move_overhead_share=None, allocated_first=False,
                steady_types_tolerance=None, catch_up_ratio=None,
            )
            cells = [("gavel", "as is", preset("gavel", policy))]
            if name != "paper":  # (at paper scale every ratio is below 1 whatever the setting: JCT only)
                cells.append(("before", "as is", before))
            for setting, ratio in (("off", None), ("on", args.ratio)):
                cells += [(setting, label, dataclasses.replace(default, catch_up_ratio=ratio, **fields)) for label, fields in PERTURBATIONS]
            for setting, label, settings in cells:
                rows.append({"trace": name, "policy": policy, "setting": setting, "perturbation": label,
                             **run(trace, cluster, window, seed, policy, settings, context)})
                r = rows[-1]
                print(f"  {name:6} {policy:24} {setting:7} {label:16} {r['avg_jct_s']:9.0f} s {r['worst']:6.3f} ({r['second']:.3f})"
                      f" {r['wall_s']:5.1f} s", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    runs = sorted({(r["trace"], r["policy"]) for r in rows}, key=lambda k: (args.traces.split(",").index(k[0]), k[1]))

    def cell(trace: str, policy: str, setting: str, label: str = "as is") -> dict | None:
        return next((r for r in rows if (r["trace"], r["policy"], r["setting"], r["perturbation"]) == (trace, policy, setting, label)), None)

    print("average JCT against Gavel's mechanism; worst (second worst) finish-time-fairness ratio; 'off'/'on': the default\n"
          f"preset without / with catch-up at {args.ratio:g}, as is and the mean of the four runs (as is and three perturbations)")
    for trace, policy in runs:
        gavel = cell(trace, policy, "gavel")["avg_jct_s"]  # type: ignore[index]
        print(f"\n{trace}, {policy}:")
        before = cell(trace, policy, "before")
        if before:
            print(f"  before migration-aware rounds   {100 * (before['avg_jct_s'] / gavel - 1):+6.2f}%  {before['worst']:.3f} ({before['second']:.3f})")
        for setting in ("off", "on"):
            mine = [r for r in rows if (r["trace"], r["policy"], r["setting"]) == (trace, policy, setting)]
            nominal = cell(trace, policy, setting)
            mean_jct = statistics.fmean(100 * (r["avg_jct_s"] / gavel - 1) for r in mine)
            print(f"  default, catch-up {setting:3}  as is {100 * (nominal['avg_jct_s'] / gavel - 1):+6.2f}%  {nominal['worst']:.3f}"  # type: ignore[index]
                  f" ({nominal['second']:.3f});  mean of {len(mine)}: {mean_jct:+6.2f}%  {statistics.fmean(r['worst'] for r in mine):.3f}")
    print("\nover the runs (as is / every perturbation; the fairness over those with a before-migration-aware baseline):")
    for setting in ("off", "on"):
        fair = total = fair_all = total_all = 0
        worst, worst_all, change, change_all = [], [], [], []
        for trace, policy in runs:
            before = cell(trace, policy, "before")
            gavel = cell(trace, policy, "gavel")["avg_jct_s"]  # type: ignore[index]
            for label, _ in PERTURBATIONS:
                mine, off = cell(trace, policy, setting, label), cell(trace, policy, "off", label)
                if mine is None or off is None:
                    continue
                change_all.append(100 * (mine["avg_jct_s"] - off["avg_jct_s"]) / gavel)
                if label == "as is":
                    change.append(change_all[-1])
                if before is None:
                    continue
                ok = mine["worst"] <= before["worst"]
                fair_all, total_all = fair_all + ok, total_all + 1
                worst_all.append(mine["worst"])
                if label == "as is":
                    fair, total = fair + ok, total + 1
                    worst.append(mine["worst"])
        fairness = (f"worst ratio at or below before's in {fair}/{total} runs ({fair_all}/{total_all}); mean worst"
                    f" {statistics.fmean(worst):.3f} ({statistics.fmean(worst_all):.3f}); " if worst else "")
        print(f"  catch-up {setting:3}: {fairness}JCT against catch-up off, mean {statistics.fmean(change):+.2f} points"
              f" ({statistics.fmean(change_all):+.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
