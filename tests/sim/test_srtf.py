"""SRTF in the simulator: on a short trace with arrivals and multi-GPU gangs it beats FIFO's
average JCT (both engines agreeing on its schedule: test_paper_schedulers.py)."""

from __future__ import annotations

import numpy as np

from mechanism_service.core.settings import preset
from policy_service.service import shipped_context
from sim.fastpath import RunConfig, simulate
from sim.traces import TraceSpec, generate_trace

CONTEXT = shipped_context()
CLUSTER = {"v100": 8, "p100": 4, "k80": 4}  # an 8-GPU gang fits the v100s


def _trace():
    spec = TraceSpec(num_jobs=24, jobs_per_hour=4.0, multi_gpu=True)
    return generate_trace(spec, CONTEXT.table, np.random.default_rng(5))


def _average_jct_s(result) -> float:
    return float(np.mean([j.completion_s - j.arrival_s for j in result.jobs]))


def test_srtf_perf_has_a_lower_average_jct_than_fifo_perf():
    trace = _trace()
    results = {
        p: simulate(trace, RunConfig(p, CLUSTER, preset("default", p), seed=0), CONTEXT)
        for p in ("srtf_perf", "fifo_perf")
    }
    assert _average_jct_s(results["srtf_perf"]) < _average_jct_s(results["fifo_perf"])
