"""Gavel's published figures the tests check against, copied into tests/data (MIT licence,
see tests/data/gavel/README.md): its traces, and what its own simulator recorded on two of them."""

from __future__ import annotations

import pathlib

DATA = pathlib.Path(__file__).resolve().parents[1] / "data"
REFERENCE = DATA / "gavel-reference"  # results.json, per_job_jct/, the two calibration traces
GAVEL_TRACES = DATA / "gavel" / "traces"  # physical_cluster/*.trace, msr/seed=N/*.trace


def fewest_steps(trace: pathlib.Path, jobs: int, scratch: pathlib.Path) -> pathlib.Path:
    """The ``jobs`` jobs of a Gavel trace with fewest steps (its sixth column), in the trace's
    order, written under ``scratch``: a shorter run of the same load, for a test's quick tier
    (tests/support/seeds.py)."""
    lines = trace.read_text().splitlines()
    fewest = sorted(range(len(lines)), key=lambda i: int(lines[i].split("\t")[5]))[:jobs]
    path = scratch / f"{trace.stem}_fewest{jobs}.trace"
    path.write_text("".join(lines[i] + "\n" for i in sorted(fewest)))
    return path
