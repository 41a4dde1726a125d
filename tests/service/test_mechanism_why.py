"""`gavel jobs` and `gavel job ID` from a live mechanism with the real policy service on the
in-memory bus (every message through the codec): reason codes and ETAs as the status desk sends
them, the why block, and the clock basis the command line reads its times with."""

from __future__ import annotations

from common.messages import JobSpec, ProfileCell, ProfilingRequest, ThroughputEstimated
from mechanism_service.core import why
from services.cli.status_cmd import ask_on
from tests.support.waiting import eventually
from tests.support.world import RESNET, simulated_world, world


async def test_reason_codes_etas_and_the_why_of_a_running_a_waiting_and_a_held_job() -> None:
    w = await world()
    await w.worker("v0", "v100")
    # one v100: "a" and "b" share it (max-min fairness: 0.5 each); "gang" needs 4 GPUs: held
    await w.submit(JobSpec("a", RESNET, 10**6), JobSpec("b", RESNET, 10**6), JobSpec("gang", RESNET, 10**6, scale_factor=4))

    def planned() -> bool:
        state = w.memory.state
        return (
            state is not None and len(state.jobs) == 2 and {i for entry in state.allocation for i in entry} == {0, 1}
            and bool(state.previous_assignment) and len(w.memory.held) == 1
        )

    await eventually(planned)
    rows = {row["id"]: row for row in await ask_on(w.bus, "jobs")}  # type: ignore[union-attr]
    running = next(job_id for job_id in ("a", "b") if rows[job_id]["state"] == "running")
    waiting = "b" if running == "a" else "a"
    assert rows[running]["reason_code"] == "Running"
    assert rows[waiting]["reason_code"] == "Priority" and "jobs ahead of it" in rows[waiting]["reason"]
    assert rows["gang"]["reason_code"] == "Held" and "waits for workers" in rows["gang"]["reason"]
    assert "eta_s" not in rows["gang"] or rows["gang"]["eta_s"] is None
    # both share the v100 at half time: the same rate, so the same ETA from now
    assert rows[running]["eta_s"] == rows[waiting]["eta_s"] > w.clock.now_s()

    job = await ask_on(w.bus, "job", job_id=waiting)
    assert isinstance(job, dict)
    assert job["why"]["code"] == "Priority" and job["why"]["shares"] == {"v100": 0.5}
    assert [h["ids"] for h in job["why"]["holders"]] == [[running]]
    assert job["eta_s"] == rows[waiting]["eta_s"] and "if the allocation holds" in job["eta_basis"]
    low, high = job["eta_range_s"]
    assert low < job["eta_s"] and high is None  # alone on the v100 it would go twice as fast; no step done yet
    assert job["clock"]["now_s"] == w.clock.now_s() and job["clock"]["kind"] == "virtual"  # the test's stepped clock
    held = await ask_on(w.bus, "job", job_id="gang")
    assert isinstance(held, dict) and held["why"]["code"] == "Held" and held["eta_s"] is None
    clock = await ask_on(w.bus, "clock")  # (`gavel jobs` and `gavel workers` ask for it apart: their answer is a list)
    assert isinstance(clock, dict) and (clock["kind"], clock["now_s"]) == ("virtual", w.clock.now_s())
    await w.mechanism.stop()
    await w.bus.close()


async def test_a_job_the_estimator_asked_to_measure_on_the_k80_is_profiling_there() -> None:
    """The real mechanism on estimates, the simulated fleet in virtual time: the estimator (here,
    the test) asks to measure a job alone on the K80; while that lease runs, its code is
    Profiling, and its why says so, whatever its share."""
    w = await simulated_world("max_min_fairness_perf", fleet={"v100": 1, "k80": 1}, estimates=True)
    await w.submit(JobSpec("p", RESNET, 10**6))
    await w.run_until(lambda: bool(w.memory.state and w.memory.state.previous_assignment))
    await w.bus.publish(ThroughputEstimated(profiling=(ProfilingRequest("p", (ProfileCell("k80"),)),), profiling_share=1.0))

    def profiled() -> bool:
        running = w.memory.running
        return running is not None and bool(running[1].profiled) and why.reason_codes(w.memory) == {"p": why.PROFILING}

    await w.run_until(profiled)
    placement = next(iter(w.memory.state.previous_assignment.values()))  # type: ignore[union-attr]
    assert placement.accelerator_type == "k80"
    detail = why.explain(w.memory, "p", w.clock.now_s())
    assert detail is not None and "to measure its speed for the estimator" in str(detail["reason"])
    await w.mechanism.stop()
    await w.bus.close()
