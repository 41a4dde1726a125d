"""`gavel serve simulator`'s service (sim/sweep_service.py) on the in-memory bus: a cell's result
is the one the local sweep computes; a bad cell and a cell whose process dies are answered with
the reason, and the simulator goes on. Each test starts the simulator's child process (spawned:
~2-4 s of imports on 2 shared cores)."""

from __future__ import annotations

import dataclasses
import os
import signal

import pytest
from structlog.testing import capture_logs

from common.messages import SweepCellFinished, SweepCellStarted
from policy_service.service import shipped_context
from sim.scenario import run_policy
from sim.sweep_cells import SweepSpec, cell_scenario, run_cell, table_digest
from sim.sweep_service import SimulatorService, results_bindings, results_queue
from tests.support.harness import BusHarness
from tests.support.waiting import Collector, eventually

CONTEXT = shipped_context()
DIGEST = table_digest(None)
SPEC = SweepSpec(20, False, {"v100": 2, "p100": 2, "k80": 2}, DIGEST)


@pytest.fixture
async def memory():
    h = BusHarness("memory")
    try:
        yield h
    finally:
        await h.close()


async def started(harness: BusHarness) -> tuple[SimulatorService, object, Collector]:
    simulator = SimulatorService({DIGEST: CONTEXT}, name="sim-test")
    await simulator.start(await harness.connect("simulator"))
    sweep = await harness.connect("sweep")
    answers = Collector()
    await sweep.subscribe(results_queue(SPEC.sweep_id), list(results_bindings(SPEC.sweep_id)), answers)
    return simulator, sweep, answers


def finished(answers: Collector) -> list[SweepCellFinished]:
    return [m for m in answers.messages if isinstance(m, SweepCellFinished)]


@pytest.mark.slow  # ~4-8 s: the child process, two small cells
async def test_a_cell_is_answered_as_the_local_sweep_runs_it_and_a_bad_one_with_why(memory):
    simulator, sweep, answers = await started(memory)
    try:
        good = SPEC.cell("max_min_fairness_perf", 4.0, 1)
        unknown_policy = SPEC.cell("no_such_policy", 4.0, 1)
        gone = SweepSpec(20, False, {"v100": 2}, DIGEST).cell("fifo", 4.0, 0)  # a sweep with no results queue
        with capture_logs() as logs:
            for cell in (unknown_policy, gone, good):
                await sweep.publish(cell)
            await answers.wait_until(lambda: any(r.cell_id == good.cell_id for r in finished(answers)), timeout_s=60)
        # the cell of a sweep that is over: acknowledged without running
        assert [e["cell_id"] for e in logs if e["event"] == "sweep_gone"] == [gone.cell_id]
        assert gone.cell_id not in {e.get("cell_id") for e in logs if e["event"] == "cell_started"}
        by_id = {r.cell_id: r for r in finished(answers)}
        assert set(by_id) == {unknown_policy.cell_id, good.cell_id}
        assert "unknown policy 'no_such_policy'" in by_id[unknown_policy.cell_id].error
        result = by_id[good.cell_id]
        local = run_cell(good, {DIGEST: CONTEXT}, "sim-test")  # what a local sweep's worker computes
        assert dataclasses.replace(result, wall_s=0.0) == dataclasses.replace(local, wall_s=0.0)
        _, summary = run_policy(good.policy, cell_scenario(good, CONTEXT), CONTEXT)
        assert (result.error, result.avg_jct_s, result.jobs_completed) == ("", summary.avg_jct_s, 20)
        assert {m.cell_id for m in answers.messages if isinstance(m, SweepCellStarted)} == {unknown_policy.cell_id, good.cell_id}
    finally:
        await simulator.stop()


def test_a_cell_of_a_table_the_simulator_lacks_says_which_and_how():
    cell = SweepSpec(20, False, {"v100": 2}, "ab" * 32).cell("fifo", 4.0, 0)
    answer = run_cell(cell, {DIGEST: CONTEXT}, "sim")
    assert "no throughput table with digest abababababab" in answer.error and "--throughputs" in answer.error
    bad_option = SweepSpec(20, False, {"v100": 2}, DIGEST, scenario_json='{"no_such_field": 1}').cell("fifo", 4.0, 0)
    assert "no field 'no_such_field'" in run_cell(bad_option, {DIGEST: CONTEXT}, "sim").error


@pytest.mark.slow  # ~5-10 s: two child processes, a cell of 400 jobs killed mid-run, then a small one
async def test_a_cell_whose_process_dies_is_answered_and_the_next_cell_runs(memory):
    simulator, sweep, answers = await started(memory)
    try:
        # 8 GPUs a type: every job of the trace fits (on 2, a tenth cannot, and the cell is
        # answered at once, before the kill)
        doomed = SweepSpec(400, True, {"v100": 8, "p100": 8, "k80": 8}, DIGEST).cell("max_min_fairness_perf", 1.0, 0)
        doomed = dataclasses.replace(doomed, sweep_id=SPEC.sweep_id)  # answered on this sweep's key
        after = SPEC.cell("fifo", 4.0, 0)
        await sweep.publish(doomed)
        await sweep.publish(after)
        await answers.wait_until(lambda: any(isinstance(m, SweepCellStarted) for m in answers.messages), timeout_s=60)
        children = list(simulator._pool._processes.values())  # type: ignore[union-attr]
        await eventually(lambda: bool(children) and children[0].pid is not None)
        os.kill(children[0].pid, signal.SIGKILL)  # as the kernel's OOM killer would
        await answers.wait_until(lambda: len(finished(answers)) == 2, timeout_s=60)
        first, second = finished(answers)
        assert first.cell_id == doomed.cell_id and "child process died" in first.error
        assert second.cell_id == after.cell_id and second.error == "" and second.jobs_completed == 20
    finally:
        await simulator.stop()



@pytest.mark.slow  # ~5-10 s: two child processes, a cell of 400 jobs stopped at its bound, then a small one
async def test_a_cell_past_its_time_bound_is_stopped_and_answered_and_the_next_cell_runs(memory):
    # RabbitMQ takes back a delivery unacknowledged past its consumer_timeout and hands it to the
    # next simulator: a cell that outlasted it would go round the simulators for ever. The
    # simulator's own bound, below the broker's, answers it instead.
    simulator = SimulatorService({DIGEST: CONTEXT}, name="sim-test", cell_timeout_s=0.5)
    await simulator.start(await memory.connect("simulator"))
    sweep = await memory.connect("sweep")
    answers = Collector()
    await sweep.subscribe(results_queue(SPEC.sweep_id), list(results_bindings(SPEC.sweep_id)), answers)
    try:
        long = SweepSpec(400, True, {"v100": 8, "p100": 8, "k80": 8}, DIGEST).cell("max_min_fairness_perf", 1.0, 0)
        long = dataclasses.replace(long, sweep_id=SPEC.sweep_id)  # answered on this sweep's key
        await sweep.publish(long)
        await answers.wait_until(lambda: len(finished(answers)) == 1, timeout_s=60)
        (stopped,) = finished(answers)
        assert stopped.cell_id == long.cell_id and "ran longer than the simulator's --cell-timeout-s (0.5 s)" in stopped.error
        simulator._cell_timeout_s = 60.0  # the next cell, small, within its bound on a new child
        after = SPEC.cell("fifo", 4.0, 0)
        await sweep.publish(after)
        await answers.wait_until(lambda: len(finished(answers)) == 2, timeout_s=60)
        assert finished(answers)[1].cell_id == after.cell_id and finished(answers)[1].error == ""
    finally:
        await simulator.stop()


def test_the_time_bound_must_be_positive():
    with pytest.raises(ValueError, match="cell_timeout_s"):
        SimulatorService({DIGEST: CONTEXT}, cell_timeout_s=0)
