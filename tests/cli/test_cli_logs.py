"""`gavel logs`: what it prints from the workers' answers (services/cli/logs_view.py, pure), and its
refusals as a user meets them. The answers of real workers: tests/service/test_worker_logs.py; on
a running cluster: tests/e2e/test_job_logs.py."""

from __future__ import annotations

import pytest

from common.messages import LogsReported
from services.cli import main
from services.cli.logs_view import LogsView, when

T0 = 1_800_000_000.0


def part(request: str, worker: str, attempt: int, text: str, offset: int, *, started: float, ended: str = "", k: int = 0, of: int = 1, **more: object) -> LogsReported:
    return LogsReported(
        request, "asker", worker, "j", attempt, started_unix_s=started, ended=ended, ended_unix_s=started + 5 if ended else 0.0,
        offset=offset, next_offset=offset + len(text.encode()), text=text, part=k, parts=of, **more,  # type: ignore[arg-type]
    )


def test_attempts_print_in_the_order_they_started_whichever_worker_ran_them() -> None:
    view = LogsView("j")
    # the second worker's answer comes first; its attempt started later
    view.add(part("r", "k80-a", 1, "moved\n", 0, started=T0 + 100))
    view.add(part("r", "v100-a", 1, "one\ntw", 0, started=T0, ended="stopped: its GPUs are leased to another job", k=0, of=2))
    view.add(part("r", "v100-a", 1, "o\n", 6, started=T0, ended="stopped: its GPUs are leased to another job", k=1, of=2))
    assert view.render(follow=False).splitlines() == [
        f"==> j on v100-a, attempt 1: started {when(T0)}, ended {when(T0 + 5)}: stopped: its GPUs are leased to another job <==",
        "one",
        "two",
        f"==> j on k80-a, attempt 1: started {when(T0 + 100)}, running <==",
        "moved",
    ]
    # what to ask next: the running attempt from its end; the ended one, answered in full, not again
    assert view.offsets() == {"k80-a/1": 6}
    assert view.done() == ("v100-a/1",)
    assert view.running_on() == {"k80-a"}


def test_following_prints_only_what_is_new_and_a_line_when_an_attempt_ends() -> None:
    view = LogsView("j")
    view.add(part("r1", "w", 1, "step 1\nstep", 0, started=T0))
    first = view.render(follow=True)
    assert first == f"==> j on w, attempt 1: started {when(T0)}, running <==\nstep 1\nstep"
    assert view.offsets() == {"w/1": len(b"step 1\nstep")}
    view.add(part("r2", "w", 1, " 2\n", 11, started=T0, ended="finished"))
    assert view.render(follow=True) == f" 2\n==> j on w, attempt 1: ended {when(T0 + 5)}: finished <==\n"
    assert view.render(follow=True) == ""  # nothing new
    assert view.done() == ("w/1",) and view.offsets() == {}


def test_following_attempts_that_overlap_says_whose_lines_come_again() -> None:
    view = LogsView("j")
    view.add(part("r1", "a", 1, "a1\n", 0, started=T0))
    view.add(part("r1", "b", 1, "b1\n", 0, started=T0 + 1))
    view.render(follow=True)
    # the first worker's last lines come after the second began
    view.add(part("r2", "a", 1, "a2\n", 3, started=T0, ended="stopped: the worker is shutting down"))
    view.add(part("r2", "b", 1, "b2\n", 3, started=T0 + 1))
    assert view.render(follow=True).splitlines() == [
        "==> j on a, attempt 1, continued <==",
        "a2",
        f"==> j on a, attempt 1: ended {when(T0 + 5)}: stopped: the worker is shutting down <==",
        "==> j on b, attempt 1, continued <==",
        "b2",
    ]


def test_an_answer_in_parts_is_whole_only_with_every_part() -> None:
    view = LogsView("j")
    view.add(part("r", "w", 1, "a\n", 0, started=T0, ended="finished", k=1, of=2))
    assert not view.answered("r", "w") and view.incomplete_answers("r") == {"w"} and view.done() == ()
    view.add(part("r", "w", 2, "b\n", 0, started=T0 + 9, k=0, of=2))
    assert view.answered("r", "w") and view.incomplete_answers("r") == set()
    assert view.done() == ("w/1",)


def test_tail_keeps_the_last_lines_of_every_attempt_together() -> None:
    view = LogsView("j")
    view.add(part("r", "a", 1, "1\n2\n3\n", 0, started=T0, ended="finished"))
    view.add(part("r", "b", 1, "4\n5\n", 0, started=T0 + 10, ended="finished"))
    view.add(part("r", "c", 1, "6\n", 0, started=T0 + 20))
    view.keep_last_lines(4)
    shown = view.render(follow=False).splitlines()
    assert [line for line in shown if not line.startswith("==>")] == ["3", "4", "5", "6"]
    view = LogsView("j")
    view.add(part("r", "a", 1, "1\n2\n", 0, started=T0, ended="finished"))
    view.add(part("r", "b", 1, "3\n", 0, started=T0 + 10))
    view.keep_last_lines(1)
    shown = view.render(follow=False).splitlines()
    assert shown[0].startswith("==> j on b, attempt 1") and shown[1:] == ["3"]  # a has none of them: not shown


def test_output_the_worker_no_longer_keeps_is_said_not_hidden() -> None:
    view = LogsView("j")
    view.add(part("r", "w", 1, "late\n", 9_000_000, started=T0, kept_from=9_000_000))
    assert "[the first 9,000,000 bytes of this attempt are no longer kept by the worker]" in view.render(follow=False)


def test_a_note_instead_of_output_and_answers_about_other_jobs_are_set_apart() -> None:
    view = LogsView("j")
    view.add(LogsReported("r", "asker", "v100-0", "j", note="a simulated job has no output"))
    view.add(LogsReported("r", "asker", "w", "other", 1, text="not this one\n", next_offset=13))
    assert view.notes == {"v100-0": "a simulated job has no output"} and view.attempts == {}


@pytest.mark.parametrize("job_id", ["", "two words", "tab\tid"])
def test_a_bad_job_id_is_one_line(job_id: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["logs", job_id]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gavel: JOB: ") and len(err.strip().splitlines()) == 1
