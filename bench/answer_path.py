"""Where one policy answer's time goes, for the programs the default preset solves most (issue 12,
item 4): Gavel's calibration trace (1,200 jobs, 8:8:8, jobs 100-299) under max_min_fairness_perf
with the default preset, the run `gavel simulate` makes.

The run is simulated once (the bus-free path) and every AllocationRequested it sends is kept, with
the time the mechanism took to build it (mechanism_service/core/policy_input.py). Then the
requests are answered again, --runs times, stage by stage as policy_service/answer.py does:
the policy object (policy_for), the message to the core's Problem (problem_from_message, as the
simulator builds it: the jobs' own fields were checked at admission; the service's, with every
field checked, is timed beside it), the policy's allocate (of which: the solver's own call, CLARABEL's solve, timed
by a wrapper, and the grouping into classes, formulation.build_space), the reply
(computed_message) and the isolated baseline. Medians over the runs of the per-answer mean, in
ms; the share that is not the solver is the point.

Usage: python bench/answer_path.py [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's packages, not whichever one is installed
TRACE = ROOT / "tests" / "data" / "gavel-reference" / "continuous_rate1.4_n1200_seed1.trace"


class _Timer:
    """Total seconds spent in the wrapped callables since the last reset."""

    def __init__(self) -> None:
        self.s = 0.0

    def wrap(self, fn: Callable) -> Callable:
        def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.s += time.perf_counter() - began

        return timed


def record_requests() -> tuple[list, float, float]:
    """(the run's requests, seconds building them, the run's wall seconds)."""
    import sim.fastpath as fastpath
    from sim.scenario import Scenario, load_context, load_trace, parse_cluster, parse_window, run_policy

    context = load_context(None)
    trace = load_trace(str(TRACE))
    scenario = Scenario(trace, parse_cluster("8:8:8", context.table, 1), window=parse_window("100:300", len(trace)))
    requests = []
    building = _Timer()
    original_request, original_answer = fastpath.allocation_request, fastpath.answer
    fastpath.allocation_request = building.wrap(original_request)

    def keep(request, ctx, **kwargs):  # noqa: ANN001, ANN003, ANN202
        requests.append(request)
        return original_answer(request, ctx, **kwargs)

    fastpath.answer = keep
    # The simulator answers in process from the ledgers' columns (answer_admitted) when it can;
    # without that path it builds the message the policy service would receive: the same
    # problems, and the messages this bench replays.
    original_snapshot = getattr(fastpath, "admitted_snapshot", None)
    if original_snapshot is not None:
        fastpath.admitted_snapshot = lambda *args, **kwargs: None
    try:
        began = time.perf_counter()
        run_policy("max_min_fairness_perf", scenario, context)
        wall_s = time.perf_counter() - began
    finally:
        fastpath.allocation_request, fastpath.answer = original_request, original_answer
        if original_snapshot is not None:
            fastpath.admitted_snapshot = original_snapshot
    return requests, building.s, wall_s


def record_admitted() -> list:
    """The requests of the simulator's in-process path (answer_admitted), as the run makes them;
    [] for a checkout without that path."""
    import sim.fastpath as fastpath
    from sim.scenario import Scenario, load_context, load_trace, parse_cluster, parse_window, run_policy

    if not hasattr(fastpath, "answer_admitted"):
        return []
    context = load_context(None)
    trace = load_trace(str(TRACE))
    scenario = Scenario(trace, parse_cluster("8:8:8", context.table, 1), window=parse_window("100:300", len(trace)))
    requests = []
    original = fastpath.answer_admitted

    def keep(request, ctx):  # noqa: ANN001, ANN202
        requests.append(request)
        return original(request, ctx)

    fastpath.answer_admitted = keep
    try:
        run_policy("max_min_fairness_perf", scenario, context)
    finally:
        fastpath.answer_admitted = original
    return requests


def admitted_once(requests: list) -> float:
    """Seconds to answer the in-process requests again, as the simulator does."""
    from policy_service import answer as answering
    from policy_service.service import shipped_context

    context = shipped_context()
    began = time.perf_counter()
    for request in requests:
        answering.answer_admitted(request, context)
    return time.perf_counter() - began


def stages_once(requests: list) -> dict[str, float]:
    """Seconds per stage over all requests, answered as policy_service/answer.py does for the
    simulator (admitted jobs: their own fields not checked again), with the problem as the
    policy service builds it from the bus (every field checked) timed beside it."""
    import inspect

    import clarabel

    import policy_service.core.compiled as compiled
    import policy_service.core.fairness as fairness
    from policy_service import answer as answering
    from policy_service.service import shipped_context

    context = shipped_context()
    solver, grouping = _Timer(), _Timer()
    # A baseline checkout from before the admitted problems checks every field in both.
    admitted = {"admitted": True} if "admitted" in inspect.signature(answering.problem_from_message).parameters else {}

    class TimedSolver:
        def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
            self._solver = clarabel.DefaultSolver(*args, **kwargs)

        def solve(self):  # noqa: ANN202
            return solver.wrap(self._solver.solve)()

    class ClarabelTimed:
        DefaultSolver = TimedSolver

        def __getattr__(self, name: str) -> object:
            return getattr(clarabel, name)

    patched = [(compiled, "clarabel", ClarabelTimed())]
    if hasattr(fairness, "build_space"):
        patched.append((fairness, "build_space", grouping.wrap(fairness.build_space)))
    saved = [(module, name, getattr(module, name)) for module, name, _ in patched]
    for module, name, value in patched:
        setattr(module, name, value)
    totals = dict.fromkeys(("policy_for", "problem_from_message", "allocate", "computed_message", "isolated_baseline"), 0.0)
    checked = 0.0
    try:
        for request in requests:
            c0 = time.perf_counter()
            answering.problem_from_message(request.problem, context, request.policy_state)
            checked += time.perf_counter() - c0
            t0 = time.perf_counter()
            policy = answering.policy_for(request)
            t1 = time.perf_counter()
            problem = answering.problem_from_message(request.problem, context, request.policy_state, **admitted)
            t2 = time.perf_counter()
            allocation = policy.allocate(problem)
            t3 = time.perf_counter()
            answering.computed_message(request.request_id, allocation)
            t4 = time.perf_counter()
            answering.isolated_baseline(policy, problem)
            t5 = time.perf_counter()
            for name, s in zip(totals, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
                totals[name] += s
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
    totals["allocate: solver (CLARABEL solve)"] = solver.s
    totals["allocate: grouping (build_space)"] = grouping.s
    totals["problem_from_message, all checked (service)"] = checked
    return totals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    requests, building_s, wall_s = record_requests()
    n = len(requests)
    if n == 0:
        print("answer_path: the run sent no request to record (the simulator's answer path changed?)", file=sys.stderr)
        return 1
    admitted = record_admitted()
    runs = [stages_once(requests) for _ in range(args.runs)]
    ms = {name: statistics.median(r[name] for r in runs) / n * 1e3 for name in runs[0]}
    if admitted:
        ms["answer_admitted (the simulator's own path)"] = (
            statistics.median(admitted_once(admitted) for _ in range(args.runs)) / len(admitted) * 1e3
        )
    ms["request (policy_input.allocation_request)"] = building_s / n * 1e3
    answer_ms = sum(ms[k] for k in ("policy_for", "problem_from_message", "allocate", "computed_message", "isolated_baseline"))
    solver_ms = ms["allocate: solver (CLARABEL solve)"]
    if args.json:
        print(json.dumps({"answers": n, "run_wall_s": wall_s, "per_answer_ms": ms, "answer_ms": answer_ms}, indent=2))
        return 0
    print(
        f"{n} answers of the calibration run (max_min_fairness_perf, default preset; the run took {wall_s:.2f} s); "
        f"ms per answer, median of {args.runs} replays (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    )
    for name, value in ms.items():
        print(f"  {name:44} {value:7.3f}")
    print(f"  {'answer in all (answer.py)':44} {answer_ms:7.3f}")
    print(f"the solver's own call: {solver_ms:.3f} ms, {solver_ms / answer_ms:.0%} of the answer; the rest is not the solver")
    return 0


if __name__ == "__main__":
    sys.exit(main())
