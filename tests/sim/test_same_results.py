"""The simulator's speed-ups change no result: the jobs.csv of a run is, byte for byte, the one
written before them (tests/data/golden/jobs_csv_sha256.json: Gavel's two calibration traces,
five policies, both presets), with quiet rounds skipped and every program solved as it is now.
Run in process, written as `gavel simulate` writes it (one run through the command itself is in
test_quiet_rounds.py)."""

from __future__ import annotations

import hashlib
import json

import pytest

from policy_service.service import shipped_context
from sim.output import write_jobs_csv
from sim.scenario import Scenario, run_policy
from sim.traces import read_trace
from tests.support.data import REFERENCE

GOLDEN = json.loads((REFERENCE.parent / "golden" / "jobs_csv_sha256.json").read_text())["runs"]
TRACES = {
    "continuous": (REFERENCE / "continuous_rate1.4_n1200_seed1.trace", {"v100": 8, "p100": 8, "k80": 8}, (100, 300)),
    "static": (REFERENCE / "static_n32_seed0.trace", {"v100": 4, "p100": 4, "k80": 4}, None),
}
CONTEXT = shipped_context()


def jobs_csv_sha256(tmp_path, run: dict) -> str:
    path, cluster, window = TRACES[run["trace"]]
    result, _ = run_policy(run["policy"], Scenario(read_trace(path), cluster, run["preset"], window=window), CONTEXT)
    return hashlib.sha256(write_jobs_csv(result, tmp_path / "jobs.csv").read_bytes()).hexdigest()


def _id(run: dict) -> str:
    return f"{run['trace']}-{run['policy']}-{run['preset']}"


FAST = {("static", "max_min_fairness_perf"), ("static", "max_min_fairness_packed")}
# the calibration trace under the policies of Gavel's README sweep and FIFO (the packed and FTF
# programs on it take ~5-10 s a run: their static runs stand for them)
SLOW = {("static", "max_min_fairness"), ("static", "fifo_perf"), ("static", "finish_time_fairness_perf")} | {
    ("continuous", p) for p in ("max_min_fairness_perf", "max_min_fairness", "fifo_perf")
}


@pytest.mark.parametrize("run", [r for r in GOLDEN if (r["trace"], r["policy"]) in FAST], ids=_id)
def test_the_static_trace_gives_the_same_jobs_csv(run, tmp_path):
    assert jobs_csv_sha256(tmp_path, run) == run["sha256"]


@pytest.mark.slow  # ~0.5 s a static run, ~1-3 s a calibration run (1,200 jobs, 200 measured)
@pytest.mark.parametrize("run", [r for r in GOLDEN if (r["trace"], r["policy"]) in SLOW], ids=_id)
def test_gavels_calibration_traces_give_the_same_jobs_csv(run, tmp_path):
    assert jobs_csv_sha256(tmp_path, run) == run["sha256"]
