"""One re-solve of the default preset, snapshot to installed allocation, per request (issue 27).

The default preset re-solves at every arrival and completion: on the README sweep's point (a
5,500-job trace of `gavel trace generate --jobs 5500 --jobs-per-hour 1 --seed 0`, 36:36:36,
window 4000:5000, max_min_fairness_perf) that is ~9,200 re-solves of ~15 jobs each. The run is
simulated until --requests re-solves have been seen from --first on, every --every-th one kept
as it came in (the mechanism's state pickled, without its completed jobs, which a re-solve never
reads); the run then stops. Each kept re-solve is replayed --runs times on a fresh copy of its
state (the copy made outside the timing), as sim/fastpath.py's _reallocate does it: the snapshot
(admitted_snapshot), the answer (answer_admitted) and the install (apply_allocation), each timed
(CPU time of the process: time.process_time). Printed: the median over the runs of the mean per
re-solve, stage by stage, and a digest of every installed allocation, isolated baseline and
policy state (the same digest before and after a change: the same answers to the bit).

Usage: python bench/resolve_path.py [--trace FILE] [--policy NAME] [--requests 200] [--runs 5]
       [--cluster 36:36:36] [--window 4000:5000]
"""

from __future__ import annotations

import argparse
import hashlib
import pickle
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's packages, not whichever one is installed
TRACE = Path("/tmp/s27/t5500.trace")


class _Enough(Exception):
    """Raised from inside the run once the re-solves wanted are kept."""


def capture(
    trace_path: Path, policy: str, first: int, every: int, wanted: int, cluster: str = "36:36:36",
    window: str = "4000:5000",
) -> tuple[list[tuple[bytes, float]], tuple]:
    """(each kept re-solve's pickled state and time, the run's (config, context, rates))."""
    from sim import fastpath
    from sim.scenario import (
        Scenario,
        load_context,
        load_trace,
        parse_cluster,
        parse_window,
        run_policy,
    )

    context = load_context(None)
    trace = load_trace(str(trace_path))
    scenario = Scenario(trace, parse_cluster(cluster, context.table, 1), window=parse_window(window, len(trace)))
    kept: list[tuple[bytes, float]] = []
    shared: list[tuple] = []
    seen = [0]
    original = fastpath._reallocate

    def keep(state, now_s, config, ctx, rates, learning):
        seen[0] += 1
        if seen[0] >= first and (seen[0] - first) % every == 0:
            completed, state.completed = state.completed, []
            try:
                kept.append((pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL), now_s))
            finally:
                state.completed = completed
            if not shared:
                shared.append((config, ctx, rates))
            if len(kept) >= wanted:
                raise _Enough
        return original(state, now_s, config, ctx, rates, learning)

    fastpath._reallocate = keep
    try:
        run_policy(policy, scenario, context)
    except _Enough:
        pass
    finally:
        fastpath._reallocate = original
    return kept, shared[0]


def replay_once(kept: list[tuple[bytes, float]], shared: tuple) -> tuple[dict[str, float], str]:
    """CPU seconds per stage over every kept re-solve, and the digest of what was installed."""
    from mechanism_service.core.allocation import apply_allocation
    from mechanism_service.core.policy_input import admitted_snapshot
    from policy_service.answer import (
        AdmittedAnswer,
        AdmittedJobs,
        AdmittedRequest,
        answer_admitted,
        reads_previous,
        reads_service,
    )

    config, context, rates = shared
    settings = config.settings
    totals = {"snapshot": 0.0, "answer": 0.0, "install": 0.0}
    digest = hashlib.sha256()
    with_previous = reads_previous(config.policy, settings.preset, config.solver)
    with_service = reads_service(config.policy, settings.preset, config.solver)
    clock = time.process_time
    for blob, now_s in kept:
        state = pickle.loads(blob)
        # the ledgers' copy of the allocation in force, as the run's reset left it (a pickle
        # drops it: ledgers.py)
        state.entries.allocation_matrix(state.allocation)
        seed = config.seed if settings.preset == "gavel" else config.seed + state.resets
        t0 = clock()
        worker_types, columns, previous = admitted_snapshot(
            state, now_s, rates=rates, with_previous=with_previous, with_service=with_service
        )
        t1 = clock()
        answer = answer_admitted(
            AdmittedRequest(
                request_id=f"r{state.resets}", policy=config.policy, worker_types=worker_types,
                jobs=AdmittedJobs(*columns), previous=previous, packing=settings.packing,
                preset=settings.preset, seed=seed, solver=config.solver, policy_state=state.policy_state,
            ),
            context,
        )
        t2 = clock()
        assert isinstance(answer, AdmittedAnswer), answer
        apply_allocation(  # the answer's arrays where it has them (as sim/fastpath.py installs it)
            state, getattr(answer, "columns", None) or answer.fractions, answer.isolated_throughputs_steps_per_s,
            settings, answer.policy_state, answer.valid_for_s,
        )
        t3 = clock()
        totals["snapshot"] += t1 - t0
        totals["answer"] += t2 - t1
        totals["install"] += t3 - t2
        digest.update(repr((sorted(state.allocation.items()), answer.isolated_throughputs_steps_per_s, state.policy_state)).encode())
    return totals, digest.hexdigest()[:16]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--policy", default="max_min_fairness_perf")
    parser.add_argument("--first", type=int, default=2000, help="the first re-solve kept (1-based)")
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--cluster", default="36:36:36")
    parser.add_argument("--window", default="4000:5000")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    kept, shared = capture(args.trace, args.policy, args.first, args.every, args.requests, args.cluster, args.window)
    replay_once(kept, shared)  # warm: caches by shape, the solver's first call
    runs = [replay_once(kept, shared) for _ in range(args.runs)]
    digests = {digest for _, digest in runs}
    n = len(kept)
    print(f"{n} re-solves of {args.policy} on {args.trace.name} (every {args.every}th from the {args.first}th), {args.runs} runs")
    for stage in ("snapshot", "answer", "install"):
        per_ms = [totals[stage] / n * 1e3 for totals, _ in runs]
        print(f"  {stage:<9} {statistics.median(per_ms):6.3f} ms a re-solve")
    whole = [sum(totals.values()) / n * 1e3 for totals, _ in runs]
    print(f"  {'whole':<9} {statistics.median(whole):6.3f} ms a re-solve (runs: {' '.join(f'{v:.3f}' for v in whole)})")
    print(f"  digest of what was installed: {' '.join(sorted(digests))}")
    return 0 if len(digests) == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
