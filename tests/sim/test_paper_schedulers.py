"""The schedulers of other papers end to end (SRTF, Tiresias, Themis, Optimus, Gandiva's
time-slicing): a short simulation with arrivals and multi-GPU gangs completes every job, on the
bus-free path and on the services (the same schedule). Each case ~1-3 s."""

from __future__ import annotations

import numpy as np
import pytest

from mechanism_service.core.settings import preset
from policy_service.service import shipped_context
from sim.driver import simulate_services
from sim.fastpath import RunConfig, simulate
from sim.traces import TraceSpec, generate_trace
from tests.sim.test_equivalence import assert_same_schedule

CONTEXT = shipped_context()
CLUSTER = {"v100": 8, "p100": 4, "k80": 4}


def _trace():
    spec = TraceSpec(num_jobs=24, jobs_per_hour=4.0, multi_gpu=True)
    return generate_trace(spec, CONTEXT.table, np.random.default_rng(5))


@pytest.mark.parametrize(
    "policy",
    ["srtf", "srtf_perf", "tiresias", "tiresias_perf", "themis", "themis_perf", "optimus", "optimus_perf", "gandiva_ts"],
)
async def test_every_job_completes_and_both_engines_agree(policy):
    trace = _trace()
    config = RunConfig(policy, CLUSTER, preset("default", policy), seed=0)
    fast = simulate(trace, config, CONTEXT)
    assert len(fast.jobs) == len(trace) and not fast.rejected_job_ids
    assert all(j.completion_s is not None for j in fast.jobs)
    assert_same_schedule(fast, await simulate_services(trace, config, CONTEXT))
