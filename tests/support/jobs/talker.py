"""A training script that says what it does: ``hello <job>`` on stdout at its start, ``step <n>``
on stdout at each step (its step counter: a resumed job goes on counting), ``checkpoint <n>`` on
stderr at each save, and ``bye <n>`` on stdout at its end. Standard library only (starts in
~0.1 s); what `gavel logs` must show is known line by line.

Flags: --step-s S: each step takes S seconds; --steps N: the job's steps (outside a worker).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from worker_service.training import LeaseIterator


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--step-s", type=float, default=0.01)
    p.add_argument("--steps", type=int)
    args = p.parse_args()
    print(f"hello {os.environ.get('GAVEL_JOB_ID', '')}", flush=True)

    def save(directory: Path) -> None:
        (directory / "saved").write_text("")
        print(f"checkpoint {batches.step}", file=sys.stderr, flush=True)

    batches = LeaseIterator(range(10), save_checkpoint=save, load_checkpoint=lambda _: None, steps=args.steps)
    for _ in batches:
        time.sleep(args.step_s)
        print(f"step {batches.step + 1}", flush=True)
    print(f"bye {batches.step}", flush=True)


if __name__ == "__main__":
    main()
