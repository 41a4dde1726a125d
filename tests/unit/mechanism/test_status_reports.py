"""What the status reports say where a user looks (issue 23): the workers the mechanism refused (a
fleet on another clock made the cluster look empty, its refusal only in the mechanism's log), and
`gavel cluster`'s counts (failed jobs were counted as completed)."""

from __future__ import annotations

from mechanism_service.core.reducers import NewJob
from mechanism_service.core.status import Observations, cluster_report, jobs_report, pending_row, refused_note, workers_report
from tests.unit.mechanism.builders import state

CLOCK = "worker 'v100-0' runs on the wall clock and this mechanism on the scaled x500 clock"


def test_gavel_workers_lists_the_refused_with_why() -> None:
    rows = workers_report(None, {"k80": [("k80-0", 1)]}, refused={"v100-0": CLOCK})
    assert [(r["worker_id"], r["state"], r.get("reason")) for r in rows] == [("k80-0", "up", None), ("v100-0", "refused", CLOCK)]


def test_a_job_that_waits_for_workers_says_some_were_refused() -> None:
    job = NewJob("a", "A3C", 1, 1000, 0.0)
    held = pending_row(job, "held", "needs 1 GPU of one accelerator type where 'A3C' runs, and there is none here: it waits for workers to join")
    other = pending_row(NewJob("b", "A3C", 1, 1000, 0.0), "held", "something else")
    rows = jobs_report(None, 0.0, Observations(held=[held, other], workers_refused={"v100-0": CLOCK, "k80-0": CLOCK}))
    assert rows[0]["reason"] == (
        f"{held['reason']}; 2 workers tried to join and were refused (`gavel workers`), e.g. k80-0: {CLOCK}"
    )
    assert rows[1]["reason"] == "something else"  # not waiting for workers: nothing to add
    assert jobs_report(None, 0.0, Observations(held=[held]))[0]["reason"] == held["reason"]
    assert refused_note({"v100-0": CLOCK}).startswith("; 1 worker tried to join and was refused")


def test_gavel_cluster_counts_failed_jobs_apart_from_completed_ones() -> None:
    s = state(v100=2).jobs(3).done(0, 1000).done(1, 10).remove(0).remove(1).reset_at(0.0, resets=4).build()
    report = cluster_report(s, {"v100": [("v100-0", 2)]}, "fifo", 0.0, Observations(), rounds=7)
    assert (report["jobs_completed"], report["jobs_failed"], report["jobs_active"]) == (1, 1, 1)
    assert report["allocation_resets"] == 4 and "resets" not in report
