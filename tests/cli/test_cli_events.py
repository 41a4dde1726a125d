"""`gavel events` and `gavel top` as a user runs them, without a cluster: bad flags and an
unreachable broker are one line each; an event as one line for people, on a clock tied to the
wall and on one tied to none; `--since` on a scaled clock. (On a running cluster:
tests/e2e/test_watching.py.)"""

from __future__ import annotations

import datetime

import pytest

from services.cli import main
from services.cli.events_cmd import _recent
from services.cli.times import ClockView
from services.cli.watching import Seen, event_line

CLOSED_PORT = "amqp://guest:guest@127.0.0.1:1/"


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (["events", "--since", "3x"], 2, "gavel events: argument --since: must be a duration like 90s, 10m, 2h or 1d, got '3x'"),
        (["top", "--interval-s", "0"], 2, "gavel top: argument --interval-s: must be a finite number > 0, got '0'"),
        (["events", "--amqp", CLOSED_PORT, "--timeout-s", "1"], 1, "gavel: "),
        (["events", "--follow", "--amqp", CLOSED_PORT, "--timeout-s", "1"], 1, "gavel: "),
        (["top", "--once", "--amqp", CLOSED_PORT, "--timeout-s", "1"], 1, "gavel: "),
    ],
)
def test_bad_flags_and_no_broker_are_one_line(argv: list[str], code: int, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        got = main(argv)
    except SystemExit as e:  # argparse's errors exit from the parser
        got = e.code  # type: ignore[assignment]
    err = capsys.readouterr().err.strip().splitlines()
    assert got == code and len(err) == 1 and err[0].startswith(says), err
    assert "Traceback" not in err[0]


EVENT = {
    "id": "placed:12:job-3", "kind": "placed", "time_s": 5_000.0, "round_id": 12, "job_id": "job-3", "worker_id": "v100-0",
    "accelerator_type": "v100", "detail": "started on v100 on v100-0 (1 GPU)",
}


def test_an_event_reads_in_local_wall_time_or_from_the_mechanisms_start() -> None:
    # a scaled clock (x100) whose now (mechanism 6,000 s) is the wall's 1,800,000,000: the event
    # 1,000 mechanism seconds earlier happened 10 wall seconds earlier
    scaled = ClockView("scaled", 100.0, 6_000.0, 1_800_000_000.0)
    when = datetime.datetime.fromtimestamp(1_800_000_000.0 - 10).strftime("%Y-%m-%d %H:%M:%S")
    assert event_line(EVENT, scaled) == f"{when}  round 12   placed             job-3  started on v100 on v100-0 (1 GPU)"
    assert event_line(EVENT, scaled, short=True).startswith(f"{when[11:]} #12   placed ")
    lockstep = ClockView("lockstep", None, 6_000.0, None)
    assert event_line(EVENT, lockstep).startswith("t+1 h 23 min  round 12 ")
    started = {"id": "round_started:12", "kind": "round_started", "time_s": 5_000.0, "round_id": 12, "detail": "3 leases"}
    assert event_line(started, lockstep).endswith("round_started      3 leases")


def test_since_counts_wall_seconds_on_a_scaled_clock() -> None:
    report = {"now_s": 10_000.0, "events": [{**EVENT, "time_s": t} for t in (8_000.0, 9_000.0, 9_900.0, 10_000.0)]}
    scaled = ClockView("scaled", 100.0, 10_000.0, 1_800_000_000.0)
    # the last 10 wall seconds are the last 1,000 mechanism seconds
    assert [e["time_s"] for e in _recent(report, 10.0, scaled)] == [9_000.0, 9_900.0, 10_000.0]
    assert len(_recent(report, None, scaled)) == 4
    lockstep = ClockView("lockstep", None, 10_000.0, None)
    assert [e["time_s"] for e in _recent(report, 100.0, lockstep)] == [9_900.0, 10_000.0]


def test_each_event_is_said_once() -> None:
    seen = Seen(size=2)
    assert [seen.first_time(i) for i in ("a", "b", "a", "c", "a")] == [True, True, False, True, True]  # "a" forgotten
    seen.forget()  # a mechanism started again: ids may repeat (round_started:0 of one without a journal)
    assert seen.first_time("c")
