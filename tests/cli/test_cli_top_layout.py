"""`gavel top`'s frame (services/cli/top_layout.py), pure: the mechanism's answers in, lines out, at
80 and 200 columns. No line wider than the terminal, nothing cut at the edge: the least needed
columns go first on a narrow terminal, a wide one shows them all in full, and the height bounds
the rows with a count of the rest."""

from __future__ import annotations

from services.cli.times import ClockView
from services.cli.top_layout import JOB_COLUMNS, Column, Snapshot, cut, fit, frame, job_rows

NOW_S = 1_800_000_000.0
CLOCK = ClockView("wall", 1.0, NOW_S, NOW_S)
LONG_WHY = "waits for a later round: jobs that received less than their share run first"


def job(i: int, state: str, **row: object) -> dict[str, object]:
    return {
        "id": f"job-{i:03d}", "type": "ResNet-50 (batch size 64)", "state": state, "steps_done": 250 * i,
        "steps_total": 10_000, "accelerator_type": "v100" if state == "running" else None, **row,
    }


def snapshot(jobs: int = 6) -> Snapshot:
    rows = [job(i, "running", reason_code="Running", eta_s=NOW_S + 3600 * i) for i in range(1, jobs // 2 + 1)]
    rows += [job(i, "queued", reason_code="Priority", reason=LONG_WHY, eta_s=NOW_S + 7200 * i) for i in range(jobs // 2 + 1, jobs + 1)]
    rows += [job(99, "completed")]  # not shown: neither running nor waiting
    return Snapshot(
        cluster={
            "time_s": NOW_S, "policy": "max_min_fairness_perf", "rounds": 42, "capacity_gpus": {"k80": 4, "v100": 2},
            "in_use_gpus": {"k80": 1, "v100": 2}, "jobs_completed": 7,
        },
        jobs=rows,
        workers=[{"worker_id": "k80-9", "accelerator_type": "k80", "gpus": 4, "state": "lost"}],
        shares={f"job-{i:03d}": {"v100": 0.5, "k80": 0.25} for i in range(1, jobs + 1)},
        events=[
            {"id": "placed:41:job-001", "kind": "placed", "time_s": NOW_S - 10, "round_id": 41, "job_id": "job-001",
             "detail": "moved to v100 on v100-0 (1 GPU), from k80"},
            {"id": "worker_lost:k80-9", "kind": "worker_lost", "time_s": NOW_S - 5, "round_id": 41, "worker_id": "k80-9",
             "detail": "4 GPUs: no heartbeat for 45.0 s (grace 30 s)"},
            {"id": "round_started:42", "kind": "round_started", "time_s": NOW_S, "round_id": 42, "detail": "3 leases"},
        ],
        clock=CLOCK,
    )


def texts(width: int, height: int | None = None, jobs: int = 6) -> list[str]:
    return [line.text for line in frame(snapshot(jobs), width, height)]


def heading(lines: list[str]) -> str:
    return next(line for line in lines if line.startswith("id "))


def test_at_80_columns_no_line_is_wider_and_the_least_needed_columns_go() -> None:
    lines = texts(80)
    assert max(map(len, lines)) <= 80
    assert lines[0].startswith("gavel top · ") and "round 41" in lines[0] and "3 running · 3 waiting" in lines[0]
    assert {"GPUs", "Jobs: 3 running, 3 waiting", "Events"} <= set(lines)
    columns = heading(lines).split()
    assert columns == ["id", "state", "on", "share", "ETA", "done", "why"]
    # the job's type and the shares by type go first
    rows = [line for line in lines if line.startswith("job-")]
    assert [r.split()[0] for r in rows] == [f"job-{i:03d}" for i in range(1, 7)]  # running first, the completed not
    # every row's cells start where their column's name does
    starts = [heading(lines).index(name) for name in ("state", "ETA", "why")]
    assert all(row[start - 2 : start] == "  " and row[start] != " " for row in rows for start in starts)
    queued = next(r for r in rows if "queued" in r)
    assert "Priority: waits for" in queued and queued.endswith("…")  # the reason squeezed, with the mark
    k80 = next(line for line in lines if line.startswith("k80"))
    assert k80.split()[:5] == ["k80", "4", "1", "3", "4"]  # GPUs, busy, idle, lost (a lost worker's 4)


def test_at_200_columns_every_column_is_there_in_full() -> None:
    lines = texts(200)
    assert max(map(len, lines)) <= 200
    assert heading(lines).split() == ["id", "state", "on", "share", "ETA", "done", "why", "share", "by", "type", "type"]
    queued = next(line for line in lines if line.startswith("job-006"))
    assert f"Priority: {LONG_WHY}  " in queued and "k80 0.25, v100 0.50" in queued and queued.endswith("ResNet-50 (batch size 64)")
    running = next(line for line in lines if line.startswith("job-001"))
    assert "0.75" in running and "in 1 h" in running and "2%" in running.split()
    assert "policy max_min_fairness_perf" in lines[0] and "7 completed" in lines[0]
    assert any("worker_lost" in line and "no heartbeat for 45.0 s (grace 30 s)" in line for line in lines)


def test_the_height_bounds_the_rows_and_counts_the_rest() -> None:
    for width, height in ((80, 30), (200, 50)):
        lines = texts(width, height, jobs=80)
        assert len(lines) <= height and max(map(len, lines)) <= width
        more = next(line for line in lines if line.startswith("... and "))
        shown = sum(line.startswith("job-") for line in lines)
        assert more == f"... and {80 - shown} more (gavel jobs)"
        assert lines[-1].endswith("3 leases")  # the newest event is the last line
    assert sum(line.startswith("job-") for line in texts(80, None, jobs=80)) == 80  # a pipe: every job


def test_columns_are_dropped_by_priority_and_grow_to_their_cells() -> None:
    columns = (Column("a", 3, 10, 0), Column("b", 3, 10, 2), Column("c", 3, 20, 1))
    rows = [["aaaaaa", "bbbbbb", "c" * 30]]
    assert fit(columns, rows, 11) == [6, None, 3]  # b does not fit; the room left goes to a first
    assert fit(columns, rows, 25) == [6, 3, 12]  # all fit: a, then c, then b grow
    assert fit(columns, rows, 40) == [6, 6, 20]  # each to its cells, c to its widest
    assert fit(columns, rows, 7) == [6, None, None]  # c does not fit, so b (narrow enough) is not tried
    assert cut("abcdef", 4) == "abc…" and cut("abc", 4) == "abc" and cut("abcdef", 4, "~") == "abc~"
    assert [c.priority for c in JOB_COLUMNS if c.title in ("id", "state")] == [0, 0]


def test_a_frame_without_answers_says_so_and_no_workers_or_jobs() -> None:
    lines = [line.text for line in frame(Snapshot(error="no answer from the mechanism within 5 s"), 80, 30)]
    assert lines[0] == "gavel top · 0 running · 0 waiting"
    assert "(the last refresh failed: no answer from the mechanism within 5 s)" in lines
    assert {"no workers yet", "no job running or waiting", "none yet"} <= set(lines)


def test_a_traces_long_ids_keep_their_ends_at_80_columns() -> None:
    """A trace's ids (`static_n32_seed0-f69f66/12`) share their start: cut, they keep their end,
    and the reason still has a column."""
    s = snapshot()
    jobs = [{**row, "id": f"static_n32_seed0-f69f66/{k}"} for k, row in enumerate(s.jobs)]
    lines = [line.text for line in frame(Snapshot(cluster=s.cluster, jobs=jobs, clock=CLOCK), 80)]
    assert max(map(len, lines)) <= 80
    rows = [line for line in lines if line.startswith("…")]
    # by their numbers (/0 ... /5 among the running, then the waiting), cut at their start
    assert all(r.split()[0].endswith(f"_seed0-f69f66/{k}") for k, r in enumerate(rows)) and len(rows) == 6
    assert heading(lines).split()[-1] == "why" and "Priority: " in rows[-1]
    assert cut("static_n32_seed0-f69f66/12", 16, keep_end=True) == "…seed0-f69f66/12"


def test_jobs_are_listed_running_first_then_by_their_numbers() -> None:
    jobs = [job(0, "queued", id="t/10"), job(0, "held", id="t/2"), job(0, "queued", id="t/9"), job(0, "running", id="t/11")]
    assert [row[0] for row in job_rows(jobs, {}, CLOCK)] == ["t/11", "t/9", "t/10", "t/2"]  # running, queued, held
