"""Times a person reads (services/cli/times.py) and how `gavel jobs`, `gavel job ID --why` and
`gavel workers` print them: dates in local time, durations in wall time whatever the mechanism's
clock (a scaled one runs N times faster), the mechanism's seconds under --json."""

from __future__ import annotations

import datetime

from common.clock import WallClock
from mechanism_service.clocks import LockstepClock, ScaledClock, clock_basis
from services.cli.status_cmd import print_jobs, print_why, print_workers
from services.cli.times import ClockView, duration, readable

WALL_NOW = 1_800_000_000.0  # a fixed wall time: the dates below are this one's, in local time
SCALED = ClockView("scaled", 100.0, 36_000.0, WALL_NOW)  # 10 h into a x100 cluster
LOCKSTEP = ClockView("lockstep", None, 7_200.0, WALL_NOW)


def local(t: float, fmt: str = "%Y-%m-%d %H:%M") -> str:
    return datetime.datetime.fromtimestamp(t).strftime(fmt)


def test_durations_read_as_people_say_them():
    assert [duration(s) for s in (0.4, 1.84, 45, 600, 3 * 3600 + 12 * 60, 7200, 50 * 3600, 48 * 3600, None)] == [
        "0.4 s", "1.8 s", "45 s", "10 min", "3 h 12 min", "2 h", "2 d 2 h", "2 d", "-",
    ]


def test_a_scaled_clocks_times_become_wall_dates_and_its_durations_wall_durations():
    assert SCALED.wall_duration(180.0) == 1.8  # 180 mechanism seconds are 1.8 wall seconds at x100
    assert SCALED.ago(180.0) == "1.8 s ago"
    eta_s = 36_000.0 + 100 * 3600  # 100 mechanism hours ahead: one wall hour
    assert SCALED.date(eta_s) == local(WALL_NOW + 3600)
    assert SCALED.until(eta_s) == "in 1 h"
    assert SCALED.until(36_000.0 - 6000) == "1 min ago"


def test_a_lockstep_clock_is_tied_to_no_wall_time():
    assert LOCKSTEP.date(10_800.0) == "t+3 h" and LOCKSTEP.until(10_800.0) == "in 1 h"
    assert LOCKSTEP.wall_duration(3600.0) == 3600.0
    assert readable({"clock": {}, "eta_s": 10_800.0}, LOCKSTEP)["clock"].startswith("lockstep")  # type: ignore[index, union-attr]


def test_a_job_report_reads_with_dates_and_wall_durations():
    job = {"id": "j", "arrival_s": 36_000.0 - 360.0, "waiting_s": 360.0, "eta_s": 36_000.0 + 720.0, "steps_done": 5,
           "eta_range_s": [36_000.0 + 360.0, None], "why": {"owed_s": {"v100": 180.0}}, "clock": {}}  # fmt: skip
    shown = readable(job, SCALED)
    assert shown == {
        "id": "j", "arrival_s": local(WALL_NOW - 3.6, "%Y-%m-%d %H:%M:%S"), "waiting_s": "3.6 s",
        "eta_s": f"{local(WALL_NOW + 7.2, '%Y-%m-%d %H:%M:%S')} (in 7.2 s)", "steps_done": 5,
        "eta_range_s": f"{local(WALL_NOW + 3.6, '%Y-%m-%d %H:%M:%S')} to unbounded", "why": {"owed_s": {"v100": "1.8 s"}},
        "clock": "scaled x100 (times shown in wall time)",
    }


def test_the_mechanism_says_which_clock_it_runs_on():
    assert clock_basis(WallClock(), lockstep=False, now_s=5.0, wall_s=5.0) == {"kind": "wall", "scale": 1.0, "now_s": 5.0, "wall_s": 5.0}
    assert clock_basis(ScaledClock(50.0), lockstep=False, now_s=9.0, wall_s=WALL_NOW)["scale"] == 50.0
    assert clock_basis(LockstepClock(), lockstep=True, now_s=1.0, wall_s=WALL_NOW)["kind"] == "lockstep"
    assert clock_basis(object(), lockstep=False, now_s=1.0, wall_s=WALL_NOW)["kind"] == "virtual"
    view = ClockView.of(clock_basis(ScaledClock(50.0), lockstep=False, now_s=100.0, wall_s=WALL_NOW))
    assert view is not None and view.wall_time(150.0) == WALL_NOW + 1.0
    assert ClockView.of({"error": "unknown query 'clock'"}) is None  # an older mechanism


def test_gavel_jobs_prints_the_reason_code_and_the_eta_as_a_date(capsys):
    rows = [
        {"id": "a", "type": "t", "state": "running", "reason_code": "Running", "steps_done": 5, "steps_total": 10,
         "attained_service_gpu_s": 3600.0, "waiting_s": 36_000.0, "eta_s": 36_000.0 + 360_000.0},
        {"id": "b", "type": "t", "state": "queued", "reason_code": "Priority", "steps_done": 0, "steps_total": 10,
         "attained_service_gpu_s": 0.0, "waiting_s": 600.0, "eta_s": None, "reason": "its share is on GPUs that jobs ahead of it hold"},
    ]  # fmt: skip
    print_jobs(rows, SCALED)
    header, _, first, second = capsys.readouterr().out.splitlines()
    assert header.split()[:6] == ["id", "type", "state", "reason", "on", "steps"] and "eta" in header and "waited" in header
    assert "Running" in first and "6 min" in first  # 10 mechanism hours waited at x100
    assert f"{local(WALL_NOW + 3600)} (in 1 h)" in first
    assert "Priority" in second and "its share is on GPUs" in second and "6.0 s" in second


def test_gavel_job_why_prints_the_code_the_reason_the_eta_and_who_holds_the_gpus(capsys):
    job = {
        "id": "j1", "state": "queued", "reason_code": "Priority", "eta_s": None, "eta_range_s": [36_000.0 + 360.0, None],
        "eta_basis": "no estimate: the allocation in force gives it no share",
        "why": {
            "code": "Priority", "reason": "its share (v100 0.50) is on GPUs that jobs ahead of it hold this round: j0 (2)",
            "shares": {"v100": 0.5}, "owed_s": {"v100": 380.0}, "priority": {"v100": 0.666667}, "gang_gpus": 1,
            "free_gpus": {"v100": 0}, "failed_attempts_in_a_row": 0,
            "holders": [{"ids": ["j0"], "accelerator_type": "v100", "gpus": 1, "priority": 2.0}],
        },
    }  # fmt: skip
    print_why(job, SCALED)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "j1: Priority" and lines[1].startswith("  its share (v100 0.50)")
    assert "eta: -" in lines and f"  range: {local(WALL_NOW + 3.6, '%Y-%m-%d %H:%M:%S')} (in 3.6 s) to unbounded" in lines
    assert any(line.split()[:2] == ["v100", "0.500"] and "3.8 s" in line for line in lines)  # owed 380 mechanism s
    assert any(line.split()[:4] == ["j0", "v100", "1", "2"] for line in lines)


def test_gavel_workers_says_how_long_ago_in_wall_seconds(capsys):
    print_workers([{"worker_id": "w0", "accelerator_type": "v100", "gpus": 1, "state": "up", "silent_s": 180.0}], SCALED)
    assert "1.8 s ago" in capsys.readouterr().out.splitlines()[-1]
    print_workers([{"worker_id": "w0", "accelerator_type": "v100", "gpus": 1, "state": "up", "silent_s": 180.0}], None)
    assert "3 min ago" in capsys.readouterr().out.splitlines()[-1]
