"""A job's attempts: how each ended, the failures in a row that end a job, and the bound on
what is kept (core/attempts.py)."""

from __future__ import annotations

import pytest

from common.messages import JobProgress
from mechanism_service.core import attempts as core
from mechanism_service.core.attempts import ATTEMPTS_KEPT, Attempts


def report(outcome: str = "", *, exit_code: int | None = None, error: str = "", steps: int = 10, finished: bool = False) -> JobProgress:
    return JobProgress(
        "j", "w", "0:0", 0, steps, 360.0, 2.5 if outcome != "crashed" else 0.0, finished=finished, outcome=outcome,
        exit_code=exit_code, error=error, startup_s=3.0, restore_s=1.5, stepping_s=4.0, checkpoint_s=0.5,
    )


TRACEBACK = "exit code 1: Traceback (most recent call last):\n  File \"train.py\", line 3\nValueError: bad learning rate\n"


@pytest.mark.parametrize(
    ("given", "worker_lost", "label"),
    [
        (None, False, "no report"),
        (None, True, "worker lost"),
        (report("crashed", exit_code=1), False, "crashed (exit 1)"),
        (report("crashed", exit_code=-9), True, "crashed (exit -9)"),
        (report("crashed"), False, "crashed"),
        (report("killed"), False, "killed"),
        (report("finished"), False, "finished"),
        (report("", finished=True), False, "finished"),  # a simulated fleet says only `finished`
        (report(""), False, "lease ended"),
        (report("lease_end"), False, "lease ended"),
    ],
)
def test_how_a_lease_ended(given: JobProgress | None, worker_lost: bool, label: str) -> None:
    assert core.ended_label(given, worker_lost=worker_lost) == label


def test_crashes_count_in_a_row_a_clean_end_starts_again_and_a_lost_worker_is_neither() -> None:
    count = 0
    for label, expected in [
        ("crashed (exit 1)", 1), ("crashed (exit 1)", 2), ("worker lost", 2), ("no report", 2),
        ("crashed (exit 1)", 3), ("lease ended", 0), ("crashed", 1), ("killed", 0),
    ]:
        count = core.failed_in_a_row(count, label)
        assert count == expected, label


def test_the_failure_reason_names_the_last_error_in_one_line() -> None:
    crash = report("crashed", exit_code=1, error=TRACEBACK)
    assert core.failure_reason(5, crash) == "failed 5 times in a row; last: exit code 1: ValueError: bad learning rate"
    assert core.crash_summary(report("crashed", exit_code=-11, error="")) == "killed by signal 11"
    assert core.crash_summary(report("crashed", exit_code=2, error="exit code 2")) == "exit code 2"


def test_an_attempt_is_a_launch_and_extensions_continue_it() -> None:
    attempts: Attempts = {}
    core.start_attempt(attempts, "j", round_id=0, now_s=0.0, accelerator_type="v100", workers=["a"])
    assert core.end_lease(attempts, "j", "lease ended", 10, report()) == 0
    core.continue_attempt(attempts, "j", round_id=1, now_s=360.0, accelerator_type="v100", workers=["a"])
    assert core.end_lease(attempts, "j", "crashed (exit 1)", 0, report("crashed", exit_code=1, error=TRACEBACK)) == 1
    core.start_attempt(attempts, "j", round_id=2, now_s=720.0, accelerator_type="k80", workers=["b"])

    view = core.attempts_view(attempts, "j")
    assert (view["attempts_total"], view["attempts_older"], view["failed_in_a_row"]) == (2, 0, 1)
    first, second = view["attempts"]  # type: ignore[misc]
    assert (first["attempt"], first["round"], first["last_round"], first["ended"], first["steps"]) == (1, 0, 1, "crashed (exit 1)", 10)
    assert first["error"] == "exit code 1: ValueError: bad learning rate"
    assert (second["attempt"], second["on"], second["workers"], second["ended"]) == (2, "k80", ["b"], "running")
    assert view["last_error"] == TRACEBACK  # the whole tail, for `gavel job`


def test_only_the_newest_attempts_are_kept_and_the_older_counted() -> None:
    attempts: Attempts = {}
    for r in range(ATTEMPTS_KEPT + 7):
        core.start_attempt(attempts, "j", round_id=r, now_s=0.0, accelerator_type="v100", workers=["a"])
    view = core.attempts_view(attempts, "j")
    assert (view["attempts_total"], view["attempts_older"]) == (ATTEMPTS_KEPT + 7, 7)
    assert [a["attempt"] for a in view["attempts"]][:2] == [8, 9]  # type: ignore[index, union-attr]
    assert core.attempts_view({}, "other") == {"attempts_total": 0, "attempts": []}


def test_a_measurement_is_a_report_that_stepped() -> None:
    assert core.measured(report()) == {
        "round": 0, "throughput_steps_per_s": 2.5, "startup_s": 3.0, "restore_s": 1.5, "stepping_s": 4.0, "checkpoint_s": 0.5,
    }
    assert core.measured(report("crashed", exit_code=1)) is None
