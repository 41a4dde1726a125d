"""The seams in whole simulations: load-based admission reproduces the shape of Blox's finding
(EuroSys 2024, figures 12-13) on a generated trace, both engines agree through the seams, and a
plug-in that raises gives each round to the default with one error line, the run going on."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest
import structlog

from common.errors import ServiceError
from mechanism_service.core.seams.admission import AdmissionDecision
from mechanism_service.core.settings import preset
from policy_service.service import shipped_context
from sim.admission_curve import waits
from sim.clock import SimulationStalled
from sim.driver import simulate_services
from sim.fastpath import RunConfig, new_job, simulate
from sim.learning import spec_of
from sim.traces import TraceSpec, generate_trace, read_trace, write_trace
from sim.traces.job import TraceJob, to_job_spec

CONTEXT = shipped_context()
POLICY = "max_min_fairness_perf"
CLUSTER = {"v100": 4, "p100": 4, "k80": 4}


def _trace(num_jobs: int = 60):
    """Gavel's generator, gangs of 1-8 GPUs, 6 jobs an hour on 12 GPUs: a queue builds up."""
    return generate_trace(TraceSpec(num_jobs=num_jobs, jobs_per_hour=6.0, multi_gpu=True), CONTEXT.table, np.random.default_rng(7))


def _config(**fields):
    settings = dataclasses.replace(preset("default", POLICY, gpus_per_server=2), **fields)
    return RunConfig(POLICY, CLUSTER, settings, seed=0)


@pytest.mark.slow  # ~3-5 s: three runs of 60 jobs
def test_load_based_admission_shifts_queueing_from_the_scheduler_to_admission():
    """~3-5 s: three runs of 60 jobs on the bus-free path. As the bound tightens (no bound; GPU
    demand at most 1.0, then 0.5 x the cluster's GPUs), the admitted jobs' average JCT counted
    from admission falls, their wait in the scheduler falls, and the wait before admission
    grows: Blox's figures 12-13 in shape. Measured (hours; no bound / 1.0 / 0.5): JCT from
    admission 35.1 / 14.9 / 13.3, in the scheduler 20.3 / 0.25 / 0.01, before admission 0 / 35.7
    / 82.6 (bench/admission_load.py prints the curve)."""
    trace = _trace()
    curve = [
        waits(simulate(trace, _config(), CONTEXT)),
        waits(simulate(trace, _config(admission="load", admission_params=(("max_load", "1.0"),)), CONTEXT)),
        waits(simulate(trace, _config(admission="load", admission_params=(("max_load", "0.5"),)), CONTEXT)),
    ]
    assert [w.jobs for w in curve] == [56, 56, 56]  # every job the cluster can run (4 gangs of 8 are refused)
    from_admission = [w.jct_from_admission_s for w in curve]
    assert from_admission[0] > 1.5 * from_admission[1]  # falls, by much at first
    assert from_admission == sorted(from_admission, reverse=True) and len(set(from_admission)) == 3
    scheduler = [w.scheduler_wait_s for w in curve]
    assert scheduler == sorted(scheduler, reverse=True) and len(set(scheduler)) == 3
    admission = [w.admission_wait_s for w in curve]
    assert admission[0] == 0.0 and admission == sorted(admission) and len(set(admission)) == 3
    # the whole wait (arrival to completion) is not what load-based admission improves here
    assert curve[2].jct_s > curve[0].jct_s


@pytest.mark.slow  # ~6-10 s: 40 jobs on both engines
async def test_both_engines_make_the_same_schedule_through_every_seam():
    trace = _trace(40)
    config = _config(
        admission="load", admission_params=(("max_load", "0.75"),), placement="checkpoint_local", launch="non_preemptive"
    )
    fast = simulate(trace, config, CONTEXT)
    services = await simulate_services(trace, config, CONTEXT)
    assert [(j.job_id, j.admitted_s, j.start_s, j.completion_s) for j in services.jobs] == [
        (j.job_id, j.admitted_s, j.start_s, j.completion_s) for j in fast.jobs
    ]
    assert services.rounds == fast.rounds
    assert any(j.admitted_s is not None and j.admitted_s > j.arrival_s for j in fast.jobs)  # some waited in admission


class RaisingPlacement:
    """A plug-in placement that raises in every round (named by module:Name in the test)."""

    def place(self, request):
        raise RuntimeError("plug-in bug")


class RaisingAdmission:
    def admit(self, view):
        raise ValueError("plug-in bug")


def test_plugins_that_raise_leave_the_default_schedule_and_one_error_line_each_time():
    """~1 s: 20 jobs twice on the bus-free path."""
    trace = _trace(20)
    default = simulate(trace, _config(), CONTEXT)
    with structlog.testing.capture_logs() as logs:
        broken = simulate(trace, _config(
            placement=f"{__name__}:RaisingPlacement", admission=f"{__name__}:RaisingAdmission",
        ), CONTEXT)
    assert [(j.job_id, j.start_s, j.completion_s) for j in broken.jobs] == [
        (j.job_id, j.start_s, j.completion_s) for j in default.jobs
    ]
    failures = [e for e in logs if e["event"] == "plugin_failed"]
    placement = [e for e in failures if e["seam"] == "placement"]
    admission = [e for e in failures if e["seam"] == "admission"]
    # it fails at every round that placed a gang afresh (an extension is kept before the strategy
    # is asked), and the log says the 1st, 2nd, 4th, ... of those failures, each with its count
    failed = sum(1 for r in default.rounds if r.leases > r.leases_extended)
    assert failed > 8
    assert [e["failures"] for e in placement] == [2**k for k in range(failed.bit_length())]
    assert placement[0] | {"t_s": 0} == {
        "event": "plugin_failed", "log_level": "error", "seam": "placement", "plugin": f"{__name__}:RaisingPlacement",
        "reason": placement[0]["reason"], "fallback": "consolidated", "failures": 1, "t_s": 0,
    }
    assert placement[0]["reason"].endswith("raised RuntimeError: plug-in bug")
    assert admission and all(e["fallback"] == "accept_all" for e in admission)


def _in_flight(trace, unit):
    """At each boundary while both teams still have jobs not admitted: (A's, B's) jobs scheduled."""
    per_team = collections.Counter(job.entity for job in trace)
    seen = []

    def observe(state, now_s):
        scheduled = collections.Counter(job.entity for job in state.jobs.values())
        admitted = scheduled + collections.Counter(job.entity for job in state.completed)
        if admitted["A"] < per_team["A"] and admitted["B"] < per_team["B"]:
            seen.append((scheduled["A"], scheduled["B"]))

    settings = dataclasses.replace(
        preset("default", POLICY), admission="quota", admission_params=(("hours", "2"), ("unit", unit))
    )
    simulate(trace, RunConfig(POLICY, {"v100": 1, "k80": 1}, settings, seed=0), CONTEXT, observe=observe)
    return seen


def test_a_quota_in_v100_hours_holds_both_teams_to_the_same_work_on_a_mixed_cluster():
    """~1 s: 10 jobs twice on the bus-free path. Teams A and B each submit five jobs of one V100-
    hour (ResNet-50: 4.39 steps/s on a v100, 0.62 on a k80) on one v100 and one k80; quota 2
    hours each. In V100-hours each team holds two jobs, 2 V100-hours, at every boundary while
    both have jobs waiting, wherever the policy runs them; in device-hours a team whose job ran on
    the k80 is charged up to 7x more for the same work, and the two teams' work in flight differs."""
    steps = round(CONTEXT.table.isolated("ResNet-50 (batch size 64)", 1, "v100") * 3600)
    trace = [TraceJob(f"{team}{i}", "ResNet-50 (batch size 64)", steps, 1, 0.0, entity=team) for i in range(5) for team in "AB"]
    in_v100 = _in_flight(trace, "v100")
    assert len(in_v100) > 20 and set(in_v100) == {(2, 2)}
    in_gpu = _in_flight(trace, "gpu")
    assert {a != b for a, b in in_gpu} == {True, False}  # equal device-hours: unequal work, at times


def test_a_traces_entity_reaches_the_mechanism_and_round_trips_through_json_lines(tmp_path):
    job = TraceJob("a0", "ResNet-50 (batch size 64)", 100, 1, 0.0, entity="vision")
    path = tmp_path / "t.jsonl"
    write_trace([job, dataclasses.replace(job, job_id="a1", entity=None)], path)
    assert [j.entity for j in read_trace(path)] == ["vision", None]
    assert '"entity"' not in path.read_text().splitlines()[1]  # a job without one is written as before
    assert to_job_spec(job).entity == "vision" and spec_of(job).entity == "vision" and new_job(job).entity == "vision"


class AdmitsNothing:
    def admit(self, view):
        return AdmissionDecision((), reason="closed")


async def test_an_admission_policy_that_admits_nothing_stops_a_simulation_saying_why():
    """~1 s: 3 jobs on both engines; neither hangs."""
    trace = _trace(3)
    config = _config(admission=f"{__name__}:AdmitsNothing")
    with pytest.raises(SimulationStalled, match=r"3 jobs wait in the admission queue of tests.sim.test_seams:AdmitsNothing"):
        simulate(trace, config, CONTEXT)
    with pytest.raises(ServiceError, match=r"3 jobs wait in the admission queue with nothing scheduled"):
        await simulate_services(trace, config, CONTEXT)


@pytest.mark.slow  # ~3-6 s: 40 jobs three times on the bus-free path
def test_placements_in_a_whole_run_spread_gangs_over_servers_or_keep_them_whole():
    """Packed max-min fairness on 8:8:8 in 4-GPU servers, 40 generated jobs with gangs: counted
    over every round's leases, the gangs whose workers straddle servers. Measured: consolidated
    1,043 of 3,269 gang leases, packing_aware 1,010 (best fit keeps more whole), spread 2,563; no
    pair straddles under any. The simulated physics does not depend on which worker of a type a
    job runs on, so the JCTs are the same."""
    policy = "max_min_fairness_packed"
    trace = generate_trace(TraceSpec(num_jobs=40, jobs_per_hour=8.0, multi_gpu=True), CONTEXT.table, np.random.default_rng(3))
    straddling, jcts = {}, {}
    for placement in ("consolidated", "packing_aware", "spread"):
        counts = collections.Counter()

        def observe(state, now_s, counts=counts):
            for entry, lease in state.previous_assignment.items():
                servers = {k for k, server in enumerate(state.servers[lease.accelerator_type]) if set(server) & set(lease.worker_ids)}
                kind = "pair" if len(entry) == 2 else "gang" if len(lease.worker_ids) > 1 else "one"
                counts[kind] += 1
                counts[f"{kind} straddling"] += len(servers) > 1

        settings = dataclasses.replace(preset("default", policy, gpus_per_server=4), placement=placement)
        result = simulate(trace, RunConfig(policy, {"v100": 8, "p100": 8, "k80": 8}, settings, seed=0), CONTEXT, observe=observe)
        straddling[placement] = (counts["gang straddling"], counts["gang"], counts["pair straddling"], counts["pair"])
        jcts[placement] = [j.jct_s for j in result.jobs]
    gangs = {placement: straddle / total for placement, (straddle, total, _, _) in straddling.items()}
    assert gangs["spread"] > 2 * gangs["consolidated"] > 0  # spread sends most gangs over several servers
    assert gangs["packing_aware"] <= gangs["consolidated"]  # best fit keeps at least as many whole
    assert straddling["packing_aware"][2] == 0 < straddling["packing_aware"][3]  # pairs ran, never straddling
    assert jcts["consolidated"] == jcts["packing_aware"] == jcts["spread"]
