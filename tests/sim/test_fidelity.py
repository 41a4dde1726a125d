"""Fidelity: the `gavel` preset reproduces what Gavel's own simulator recorded
(../shared/data/gavel-reference): average JCT within 3% for deterministic policies and 10% for
the ones that draw random numbers (issue 4), and, where no LP optimum is involved, every job's
JCT to the millisecond."""

from __future__ import annotations

import json

import pytest

from mechanism_service.core.settings import gavel_preset
from policy_service.service import shipped_context
from sim.fastpath import RunConfig, simulate
from sim.traces import read_trace
from tests.support.data import REFERENCE

RESULTS = json.loads((REFERENCE / "results.json").read_text())["experiments"]
CONTEXT = shipped_context()

# Policies that draw random numbers (Gavel: the agnostic ones shuffle type order; fifo and gandiva
# draw inside the policy); the issue allows them 10%.
RANDOM = {"fifo", "gandiva", "isolated", "max_min_fairness", "finish_time_fairness", "min_total_duration"}
# No LP involved: the schedule is fully determined, so every job must match exactly.
EXACT = {"fifo", "fifo_perf", "fifo_packed", "gandiva", "isolated", "allox"}


def run(experiment: str, policy: str):
    exp = RESULTS[experiment]
    cluster = dict(zip(("v100", "p100", "k80"), map(int, exp["cluster_spec"].split(":")), strict=True))
    window = tuple(exp["window"]) if exp.get("window") else None
    trace = read_trace(REFERENCE / exp["trace_file"])
    config = RunConfig(policy, cluster, gavel_preset(policy), seed=exp["scheduler_seed"], window=window)
    return simulate(trace, config, CONTEXT), exp["policies"][policy]


def measured_jcts(result) -> dict[str, float]:
    measured = set(result.measured_job_ids)
    return {j.job_id: j.jct_s for j in result.jobs if j.job_id in measured and j.jct_s is not None}


@pytest.mark.parametrize("policy", sorted(RESULTS["static_n32_seed0"]["policies"]))
def test_static_trace_matches_gavel(policy):
    result, reference = run("static_n32_seed0", policy)
    jcts = measured_jcts(result)
    assert len(jcts) == reference["num_jobs_measured"]
    average = sum(jcts.values()) / len(jcts)
    tolerance = 0.10 if policy in RANDOM else 0.03
    assert average == pytest.approx(reference["avg_jct_s"], rel=tolerance)
    if policy in EXACT:
        recorded = json.loads((REFERENCE / "per_job_jct" / f"static_n32_seed0__{policy}.json").read_text())
        assert jcts == pytest.approx(recorded, abs=0.01)
        assert len(result.rounds) == reference["num_rounds"]
        assert result.makespan_s == pytest.approx(reference["makespan_s"], abs=0.01)


@pytest.mark.slow  # ~3-15 s a policy: Gavel's 1,200-job calibration trace
@pytest.mark.parametrize("policy", ["fifo_perf", "max_min_fairness_perf"])
def test_continuous_trace_matches_gavel(policy):
    result, reference = run("continuous_rate1.4_n1200_seed1", policy)
    jcts = measured_jcts(result)
    assert len(jcts) == 200
    assert sum(jcts.values()) / len(jcts) == pytest.approx(reference["avg_jct_s"], rel=0.03)
    extended = sum(r.leases_extended for r in result.rounds)
    opportunities = sum(r.lease_opportunities for r in result.rounds)
    recorded = reference["lease_extensions"]  # "Extended leases X% of the time (a/b)"
    a, b = map(int, recorded.split("(")[1].rstrip(")").split("/"))
    assert extended / opportunities == pytest.approx(a / b, abs=0.01)
