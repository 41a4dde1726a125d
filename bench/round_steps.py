"""CPU time a simulated round spends in each step of the bus-free loop: `gavel simulate` in process,
each step wrapped in a process_time probe (~0.5 us a probe), printed per round.

    PYTHONPATH=CHECKOUT .venv/bin/python bench/round_steps.py --trace T --cluster 36:36:36 \\
        --window 4000:5000 --preset gavel --policy max_min_fairness

Run it with PYTHONPATH set to each checkout to compare (bench/round_cost.py alternates whole
runs). Steps a checkout does not have are left out.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import sys
import time
from collections.abc import Callable

ROUND_STEPS = (
    "type_order", "ledger_lists", "behind_jobs", "held_columns", "fit_held_columns", "plan_queues", "pick_columns",
    "place", "kept_and_stretches", "count_extensions", "record_first_runs",
)
LOOP_STEPS = ("close_round", "admit_arrivals", "begin_reset", "open_round", "_reallocate", "record_round", "apply_allocation")


def probe(module: object, name: str, spent: collections.Counter[str], calls: collections.Counter[str]) -> None:
    step: Callable[..., object] = getattr(module, name)
    clock = time.process_time

    def probed(*args: object, **kwargs: object) -> object:
        started = clock()
        try:
            return step(*args, **kwargs)
        finally:
            spent[name] += clock() - started
            calls[name] += 1

    setattr(module, name, probed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", required=True)
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--window", default="")
    parser.add_argument("--preset", default="default")
    parser.add_argument("--policy", default="max_min_fairness_perf")
    args = parser.parse_args()
    # imported once the arguments are read: from the checkout on PYTHONPATH
    from mechanism_service.core import rounds
    from services.cli import main as gavel
    from sim import fastpath

    spent: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    for name in ROUND_STEPS:
        if hasattr(rounds, name):
            probe(rounds, name, spent, calls)
    for name in LOOP_STEPS:
        if hasattr(fastpath, name):
            probe(fastpath, name, spent, calls)
    sys.argv = [
        "gavel", "simulate", "--trace", args.trace, "--cluster", args.cluster, "--policy", args.policy,
        "--preset", args.preset, "--no-plots", "--out", "/tmp/round_steps_out",
        *(["--window", args.window] if args.window else []),
    ]
    started = time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):
        gavel()
    cpu_s = time.process_time() - started
    rounds_run = calls["open_round"]
    print(f"{args.preset} {args.policy}: {cpu_s:.2f} s of CPU, {rounds_run} rounds planned")
    for name, seconds in spent.most_common():
        print(f"  {name:20s} {seconds:7.2f} s  {1e6 * seconds / rounds_run:7.1f} us a round  ({calls[name]} calls)")


if __name__ == "__main__":
    main()
