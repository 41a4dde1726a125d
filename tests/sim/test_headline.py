"""The paper's headline at small scale (Gavel, section 7): on a heterogeneous cluster under load,
heterogeneity-aware LAS beats agnostic LAS on average JCT, and space sharing beats it again."""

from __future__ import annotations

import numpy as np
import pytest

from mechanism_service.core.settings import preset
from policy_service.service import shipped_context
from sim.fastpath import RunConfig, simulate
from sim.metrics import summarize
from sim.traces import TraceSpec, generate_trace

CONTEXT = shipped_context()


@pytest.mark.slow  # ~5-9 s: three policies on a trace
def test_aware_beats_agnostic_and_packing_beats_aware():
    # 60 jobs arriving at 2/h on 3 GPUs of each type: the queue builds up (a loaded cluster).
    trace = generate_trace(TraceSpec(num_jobs=60, jobs_per_hour=2.0), CONTEXT.table, np.random.default_rng(1))
    average_h = {}
    for policy in ("max_min_fairness", "max_min_fairness_perf", "max_min_fairness_packed"):
        config = RunConfig(policy, {"v100": 3, "p100": 3, "k80": 3}, preset("default", policy), seed=1, window=(12, 48))
        summary = summarize(simulate(trace, config, CONTEXT), CONTEXT.prices_per_hour or {})
        assert summary.jobs_completed == summary.jobs_measured == 36
        average_h[policy] = summary.avg_jct_s / 3600
    agnostic, aware, packed = average_h.values()
    assert aware < 0.9 * agnostic, average_h
    assert packed < 0.9 * aware, average_h
