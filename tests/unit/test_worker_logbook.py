"""What a worker keeps of its jobs' output and how it answers `gavel logs` (worker_service/logbook.py,
pure; worker_service/job_logs.py, its files in a temporary directory)."""

from __future__ import annotations

from pathlib import Path

from common.messages import LogsRequested
from worker_service import logbook
from worker_service.job_logs import PRUNE_EVERY_S, LogStore
from worker_service.logbook import AttemptRecord, AttemptView, KeptAttempt, LogLimits, Segment


def test_whole_lines_are_written_and_a_partial_one_waits_for_its_end() -> None:
    assert logbook.complete_lines(b"", b"one\ntw") == (b"one\n", b"tw")
    assert logbook.complete_lines(b"tw", b"o\nthree") == (b"two\n", b"three")
    # a progress bar redraws with \r: each state is written as it comes
    assert logbook.complete_lines(b"", b"10%\r20%\r3") == (b"10%\r20%\r", b"3")
    # the end of the stream writes what is held
    assert logbook.complete_lines(b"last", b"", final=True) == (b"last", b"")
    # a line without an end, longer than the hold: written at once
    long = b"x" * (logbook.LINE_HOLD_BYTES + 1)
    assert logbook.complete_lines(b"", long) == (long, b"")


def test_a_gangs_lines_say_their_rank_and_a_single_process_lines_do_not() -> None:
    assert logbook.mark_lines(b"a\nb\n", 2) == b"[rank 2] a\n[rank 2] b\n"
    assert logbook.mark_lines(b"a\nb\n", None) == b"a\nb\n"
    assert logbook.mark_lines(b"", 0) == b""


def test_a_job_keeps_its_newest_segments_within_its_bound_across_attempts() -> None:
    segments = [Segment(1, 0, 4), Segment(1, 4, 4), Segment(2, 0, 4), Segment(2, 4, 3)]
    assert logbook.segments_to_drop(segments, job_bytes=8) == [Segment(1, 4, 4), Segment(1, 0, 4)]
    assert logbook.segments_to_drop(segments, job_bytes=100) == []
    # the segment being written stays, however large
    assert logbook.segments_to_drop([Segment(3, 0, 50), Segment(2, 0, 1)], job_bytes=10) == [Segment(2, 0, 1)]


def test_the_worker_forgets_old_ended_attempts_first_and_never_a_running_one() -> None:
    limits = LogLimits(total_bytes=100, keep_s=1000.0, attempts_per_job=2)
    attempts = [
        KeptAttempt("a", 1, 10.0, 10),  # ended long ago: past keep_s
        KeptAttempt("b", 1, 1500.0, 60),  # the oldest ended within keep_s
        KeptAttempt("c", 1, 1900.0, 50),
        KeptAttempt("d", 1, None, 500),  # running: over the total alone, and kept
    ]
    forgotten = {(a.job_dir, a.attempt) for a in logbook.attempts_to_forget(attempts, 2000.0, limits)}
    # the total is over even without the ended ones: every ended attempt goes, oldest first
    assert forgotten == {("a", 1), ("b", 1), ("c", 1)}
    fits = [KeptAttempt("b", 1, 1500.0, 60), KeptAttempt("c", 1, 1900.0, 30)]
    assert logbook.attempts_to_forget(fits, 2000.0, limits) == []
    over = [KeptAttempt("b", 1, 1500.0, 60), KeptAttempt("c", 1, 1900.0, 50)]
    assert [(a.job_dir, a.attempt) for a in logbook.attempts_to_forget(over, 2000.0, limits)] == [("b", 1)]
    many = [KeptAttempt("e", n, 1990.0 + n, 1) for n in range(1, 5)] + [KeptAttempt("e", 5, None, 1)]
    assert sorted(a.attempt for a in logbook.attempts_to_forget(many, 2000.0, limits)) == [1, 2, 3]


def test_how_an_attempt_ended_reads_from_its_last_outcome_and_stop() -> None:
    assert logbook.ending(outcome="finished", exit_codes=[0], stop_reason="") == "finished"
    assert logbook.ending(outcome="crashed", exit_codes=[1], stop_reason="") == "crashed (exit code 1)"
    assert logbook.ending(outcome="crashed", exit_codes=[0, -9], stop_reason="rank 1 failed") == "crashed (killed by signal 9)"
    assert logbook.ending(outcome="lease_end", exit_codes=[0], stop_reason="not continued here in round 3") == (
        "stopped: not continued here in round 3"
    )
    assert logbook.ending(outcome="killed", exit_codes=[-9], stop_reason="killed by the mechanism") == (
        "stopped: killed by the mechanism (killed by signal 9)"
    )
    assert logbook.ending(outcome="", exit_codes=[0], stop_reason="") == "exited (exit code 0)"


def test_an_answer_starts_where_the_asker_is_and_never_before_what_is_kept() -> None:
    request = LogsRequested("r", "j", "k", offsets={"w/1": 50, "w/2": 5}, done=("w/3",))
    assert logbook.start_offset("w/1", request, kept_from=0) == 50
    assert logbook.start_offset("w/2", request, kept_from=20) == 20  # 5..20 was removed
    assert logbook.start_offset("w/3", request, kept_from=0) is None  # the asker has it all
    assert logbook.start_offset("w/4", request, kept_from=7) == 7  # new to the asker


def test_the_last_lines_begin_where_they_begin() -> None:
    data = b"a\nbb\nccc\n"
    assert data[logbook.tail_start(data, 2) :] == b"bb\nccc\n"
    assert data[logbook.tail_start(data, 3) :] == data
    assert data[logbook.tail_start(data, 10) :] == data
    unfinished = b"a\nb\nunfinished"
    assert unfinished[logbook.tail_start(unfinished, 1) :] == b"unfinished"
    assert logbook.tail_start(data, 0) == 0


def test_text_is_cut_between_characters_and_each_piece_fits_a_part() -> None:
    text = "é€😀" * 5000  # 2, 3 and 4 bytes a character: 45,000 bytes
    data = text.encode()
    pieces = logbook.text_pieces(data, 100, final=True, part_bytes=1000)
    assert "".join(t for _, t, _ in pieces) == text  # cut between characters: nothing replaced
    assert all(len(t.encode()) <= 1000 for _, t, _ in pieces)
    assert pieces[0][0] == 100 and pieces[-1][2] == 100 + len(data)
    assert all(a[2] == b[0] for a, b in zip(pieces, pieces[1:], strict=False))  # contiguous offsets
    # a running attempt's unfinished character waits for the next answer
    [(offset, shown, next_offset)] = logbook.text_pieces(b"ab" + "€".encode()[:2], 0, final=False)
    assert (offset, shown, next_offset) == (0, "ab", 2)
    # bytes that are not UTF-8 become U+FFFD (3 bytes each), and a piece still fits
    junk = logbook.text_pieces(b"\xff" * 3000, 0, final=True, part_bytes=1000)
    assert all(len(t.encode()) <= 1000 for _, t, _ in junk) and sum(len(t) for _, t, _ in junk) == 3000


def test_an_answer_numbers_its_parts_across_attempts_and_an_attempt_with_nothing_new_sends_its_header() -> None:
    request = LogsRequested("r", "j", "asker")
    first = AttemptRecord("j", "w", 1, 10.0, ended="finished", ended_unix_s=20.0)
    second = AttemptRecord("j", "w", 2, 30.0, ranks=(0, 1))
    views = [AttemptView(second, 0, 7, b""), AttemptView(first, 0, 0, b"x" * 150)]
    parts = [p for p in logbook.answer_parts(request, "w", views)]
    assert [(p.attempt, p.part, p.parts) for p in parts] == [(1, 0, 2), (2, 1, 2)]
    assert parts[0].text == "x" * 150 and parts[0].ended == "finished" and parts[0].next_offset == 150
    assert (parts[1].text, parts[1].offset, parts[1].next_offset, parts[1].ranks) == ("", 7, 7, (0, 1))
    assert all(p.routing_key() == "logs.reply.asker" for p in parts)
    assert logbook.answer_parts(request, "w", []) == []


def store(tmp_path: Path, now: list[float], **limits: object) -> LogStore:
    return LogStore(tmp_path / "logs", "w", LogLimits(**limits), now_unix_s=lambda: now[0])  # type: ignore[arg-type]


def test_the_store_keeps_the_last_bytes_of_a_job_and_serves_them_from_any_offset(tmp_path: Path) -> None:
    now = [1000.0]
    logs = store(tmp_path, now, job_bytes=400)  # segments of 100 bytes
    attempt = logs.begin("train/7", ranks=[0], lease_id="3:1", started_unix_s=now[0])
    lines = [f"line {n:04d}\n".encode() for n in range(100)]  # 10 bytes each
    for line in lines:
        attempt.write(line)
    [view] = logs.read(LogsRequested("r", "train/7", "k"))
    everything = b"".join(lines)
    # 300 to 400 bytes kept, whole segments, the newest
    assert 300 <= len(view.data) <= 400 and view.offset == view.kept_from == len(everything) - len(view.data)
    assert view.data == everything[view.offset :]
    [since] = logs.read(LogsRequested("r", "train/7", "k", offsets={"w/1": 950}))
    assert (since.offset, since.data) == (950, everything[950:])
    logs.end(attempt, "finished")
    [tail] = logs.read(LogsRequested("r", "train/7", "k", tail_lines=2))
    assert tail.data == b"line 0098\nline 0099\n" and tail.record.ended == "finished"
    assert logs.read(LogsRequested("r", "train/7", "k", done=("w/1",))) == []
    assert logs.read(LogsRequested("r", "another", "k")) == []


def test_a_restarted_worker_serves_what_it_kept_and_ends_what_its_predecessor_left_running(tmp_path: Path) -> None:
    now = [1000.0]
    logs = store(tmp_path, now)
    first = logs.begin("j", ranks=[0], lease_id="1:0", started_unix_s=now[0])
    first.write(b"before the crash\n")
    first.close()  # the worker died: nothing said how the attempt ended
    again = store(tmp_path, now)
    again.open()
    [view] = again.read(LogsRequested("r", "j", "k"))
    assert view.data == b"before the crash\n" and view.record.ended == "the worker stopped while it ran"
    second = again.begin("j", ranks=[0], lease_id="2:0", started_unix_s=now[0])
    assert second.record.attempt == 2  # counted on from what is kept


def test_ended_attempts_go_after_their_time_and_beyond_the_total(tmp_path: Path) -> None:
    now = [1000.0]
    logs = store(tmp_path, now, keep_s=100.0, total_bytes=25)
    old = logs.begin("old", ranks=[0], lease_id="", started_unix_s=now[0])
    old.write(b"x" * 10)
    logs.end(old, "finished")
    now[0] += PRUNE_EVERY_S  # the bound is checked at an end at most once a minute
    newer = logs.begin("newer", ranks=[0], lease_id="", started_unix_s=now[0])
    newer.write(b"y" * 20)
    logs.end(newer, "finished")  # 30 bytes kept > 25: the oldest ended goes
    assert logs.read(LogsRequested("r", "old", "k")) == []
    assert [v.data for v in logs.read(LogsRequested("r", "newer", "k"))] == [b"y" * 20]
    running = logs.begin("running", ranks=[0], lease_id="", started_unix_s=now[0])
    running.write(b"z" * 40)
    now[0] += 200
    logs.prune()  # newer is past keep_s; the running one stays, over the total as it is
    assert logs.read(LogsRequested("r", "newer", "k")) == []
    assert [v.data for v in logs.read(LogsRequested("r", "running", "k"))] == [b"z" * 40]
