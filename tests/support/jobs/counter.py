"""A training script that needs no torch: its "model" is a running sum of the batches it has seen,
so a test can check from the checkpoint files that a resumed job continued where it stopped.

Flags: --fail-unless FILE: raise until FILE exists (a script fixed mid-way); --fail: always raise;
--step-s S: each step takes S seconds of work (busy-waiting, like compute).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from worker_service.training import LeaseIterator


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--fail", action="store_true")
    p.add_argument("--fail-unless")
    p.add_argument("--step-s", type=float, default=0.01)
    p.add_argument("--steps", type=int)
    args = p.parse_args()
    if args.fail or (args.fail_unless and not Path(args.fail_unless).exists()):
        raise ValueError("the learning rate is not a number")
    model = {"sum": 0, "steps": 0}

    def save(directory: Path) -> None:
        (directory / "model.json").write_text(json.dumps(model))

    def load(directory: Path) -> None:
        model.update(json.loads((directory / "model.json").read_text()))

    for batch in LeaseIterator(range(1, 11), save_checkpoint=save, load_checkpoint=load, steps=args.steps):
        until = time.perf_counter() + args.step_s
        while time.perf_counter() < until:
            pass
        model["sum"] += batch
        model["steps"] += 1


if __name__ == "__main__":
    main()
