"""Gavel's published figures the tests check against, copied into tests/data (MIT licence,
see tests/data/gavel/README.md): its traces, and what its own simulator recorded on two of them."""

from __future__ import annotations

import pathlib

DATA = pathlib.Path(__file__).resolve().parents[1] / "data"
REFERENCE = DATA / "gavel-reference"  # results.json, per_job_jct/, the two calibration traces
GAVEL_TRACES = DATA / "gavel" / "traces"  # physical_cluster/*.trace, msr/seed=N/*.trace
