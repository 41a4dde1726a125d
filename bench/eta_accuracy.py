"""How right the ETA `gavel job` gives is (mechanism_service/core/eta.py, issue 25): in simulation,
the ETA the mechanism would give each job of a continuous trace at the first boundary where it
has a share (its first after its arrival, or the next solve's), against its real completion.

The ETA says when the job finishes *if the allocation in force holds*. In a continuous trace
jobs keep arriving, so its share shrinks at later solves and the ETA is optimistic; the figures
say by how much. Printed per policy, over the measured jobs (the trace's window): the median and
p90 of the relative error of the job's predicted time in the system (|predicted JCT - real JCT| /
real JCT), the median signed error (negative: optimistic), the median and p90 absolute error in
hours, against a baseline measured side by side (the ETA of the job alone on its fastest type all
the time: what a user would guess from the throughput table), how many finished later than their
ETA, and how often the real completion fell before
the range's soonest bound (never, if the rates are right: it is a true bound).

The fast path (sim/fastpath.py) makes the same schedule as the services engine
(tests/sim/test_equivalence.py); its ``observe`` hook reads the state after each round is
planned and changes nothing (the run's average JCT is printed beside a run without the hook:
the same). Rates are the table's (the oracle), so the error is the allocation's changing, not
the estimates'.

Traces: Gavel's continuous calibration trace (`cal`: 1,200 jobs at 1.4/h, 8:8:8, jobs 100-299
measured), and a busier one of Gavel's generator (`busy`: 1,200 jobs at 3/h on the same cluster,
seed 0, jobs 100-299), where the backlog grows and the allocation shifts more.

Usage: python bench/eta_accuracy.py [--traces cal,busy] [--policies A,B] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mechanism_service.core.eta import allocation_rates, job_eta  # noqa: E402
from mechanism_service.core.model import MechanismState  # noqa: E402
from mechanism_service.core.settings import preset  # noqa: E402
from policy_service.service import shipped_context  # noqa: E402
from sim.fastpath import RunConfig, simulate  # noqa: E402
from sim.traces import TraceSpec, TraceStreams, generate_trace, read_trace  # noqa: E402

REFERENCE = Path(__file__).resolve().parents[1] / "tests" / "data" / "gavel-reference"
CLUSTER = {"v100": 8, "p100": 8, "k80": 8}
WINDOW = (100, 300)
TRACES = "cal,busy"
POLICIES = "max_min_fairness_perf,fifo_perf"


def trace_of(name: str, context):  # noqa: ANN001, ANN201 - (trace, seed)
    if name == "cal":
        return read_trace(REFERENCE / "continuous_rate1.4_n1200_seed1.trace"), 1
    if name == "busy":
        return generate_trace(TraceSpec(num_jobs=1200, jobs_per_hour=3.0), context.table, TraceStreams.gavel(0)), 0
    raise SystemExit(f"--traces: {name!r} is not cal or busy")


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(trace_name: str, policy: str, context) -> dict:  # noqa: ANN001
    trace, seed = trace_of(trace_name, context)
    first: dict[str, tuple[float, float, float | None, int]] = {}  # id -> (at, finish, soonest, boundaries waited)
    boundaries: dict[str, int] = {}

    def observe(state: MechanismState, now_s: float) -> None:
        rates = None
        for job in state.jobs.values():
            if job.job_id in first:
                continue
            if rates is None:
                rates = allocation_rates(state)
            boundaries[job.job_id] = boundaries.get(job.job_id, 0) + 1
            eta = job_eta(state, job, now_s, rate=rates.get(job.index, 0.0))
            if eta.finish_s is not None:
                first[job.job_id] = (now_s, eta.finish_s, eta.soonest_s, boundaries[job.job_id] - 1)

    config = RunConfig(policy, CLUSTER, preset("default", policy), seed=seed, window=WINDOW)
    observed = simulate(trace, config, context, observe=observe)
    plain = simulate(trace, config, context)
    measured = set(observed.measured_job_ids)
    rel, signed, abs_h, late, before_soonest, waited, naive = [], [], [], 0, 0, [], []
    for job in observed.jobs:
        if job.job_id not in measured or job.completion_s is None or job.job_id not in first:
            continue
        _, finish_s, soonest_s, later = first[job.job_id]
        real_jct = job.completion_s - job.arrival_s
        predicted_jct = finish_s - job.arrival_s
        rel.append(abs(predicted_jct - real_jct) / real_jct)
        signed.append((predicted_jct - real_jct) / real_jct)
        abs_h.append(abs(finish_s - job.completion_s) / 3600)
        late += job.completion_s > finish_s
        before_soonest += soonest_s is not None and job.completion_s < soonest_s - 1e-6
        waited.append(later)
        if soonest_s is not None:  # the baseline: the job alone on its fastest type, the range's soonest bound
            naive.append(abs(soonest_s - job.arrival_s - real_jct) / real_jct)
    jcts = [j.jct_s for j in observed.jobs if j.job_id in measured]
    plain_jcts = [j.jct_s for j in plain.jobs if j.job_id in measured]
    return {
        "trace": trace_name, "policy": policy, "jobs": len(rel),
        "median_rel_error": statistics.median(rel), "p90_rel_error": quantile(rel, 0.9),
        "median_signed_rel_error": statistics.median(signed),
        "baseline_median_rel_error": statistics.median(naive), "baseline_p90_rel_error": quantile(naive, 0.9),
        "median_abs_error_h": statistics.median(abs_h), "p90_abs_error_h": quantile(abs_h, 0.9),
        "finished_later_than_eta": late, "finished_before_soonest": before_soonest,
        "boundaries_before_an_eta_median": statistics.median(waited),
        "avg_jct_h": sum(jcts) / len(jcts) / 3600, "avg_jct_h_without_hook": sum(plain_jcts) / len(plain_jcts) / 3600,  # type: ignore[arg-type]
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default=TRACES)
    parser.add_argument("--policies", default=POLICIES)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    context = shipped_context()
    rows = [run(name, policy, context) for name in args.traces.split(",") for policy in args.policies.split(",")]
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return 0
    print(f"ETA at the first boundary with a share vs real completion: 8:8:8, jobs {WINDOW[0]}-{WINDOW[1] - 1}")
    for r in rows:
        print(
            f"{r['trace']:<5} {r['policy']:<22} {r['jobs']} jobs  relative error median {r['median_rel_error']:.2f}, p90 {r['p90_rel_error']:.2f} "
            f"(signed median {r['median_signed_rel_error']:+.2f})  absolute median {r['median_abs_error_h']:.1f} h, "
            f"p90 {r['p90_abs_error_h']:.1f} h  [baseline, alone on its fastest type: median {r['baseline_median_rel_error']:.2f}, "
            f"p90 {r['baseline_p90_rel_error']:.2f}]  later than the ETA {r['finished_later_than_eta']}/{r['jobs']}  "
            f"before the soonest bound {r['finished_before_soonest']}  boundaries before an ETA (median) "
            f"{r['boundaries_before_an_eta_median']:g}  avg JCT {r['avg_jct_h']:.2f} h "
            f"(without the hook {r['avg_jct_h_without_hook']:.2f} h)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
