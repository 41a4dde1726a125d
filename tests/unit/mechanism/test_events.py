"""The cluster's events derived from a boundary (mechanism_service/core/events.py): a placement, a
move, a preemption, a job's end, a worker lost, and the ring the status query answers from."""

from __future__ import annotations

from common.messages import Assignment, ClusterEvent
from mechanism_service.core import events


def lease(job_ids: tuple[str, ...], worker: str, kind: str, lease_id: str, *, gpus: tuple[int, ...] = (0,), extended: bool = False) -> Assignment:
    return Assignment(job_ids, worker, kind, gpus, lease_id, extended)


def kinds(said: list[ClusterEvent]) -> list[tuple[str, str]]:
    return [(e.kind, e.job_id) for e in said]


def test_a_job_that_starts_is_placed_with_its_type_and_workers() -> None:
    said = events.round_events(0, 10.0, (), (lease(("a",), "w1", "v100", "0:0"),), active={"a"})
    assert kinds(said) == [("round_started", ""), ("placed", "a")]
    placed = said[1]
    assert (placed.accelerator_type, placed.worker_id, placed.round_id, placed.time_s) == ("v100", "w1", 0, 10.0)
    assert placed.detail == "started on v100 on w1 (1 GPU)"
    assert placed.event_id == "placed:0:a" and placed.routing_key() == "event.placed"


def test_a_gang_is_one_placement_naming_its_workers_in_rank_order() -> None:
    gang = (lease(("g",), "w2", "k80", "3:0", gpus=(0, 1)), lease(("g",), "w1", "k80", "3:0", gpus=(0, 1)))
    said = events.round_events(3, 0.0, (), gang, active={"g"})
    assert kinds(said) == [("round_started", ""), ("placed", "g")]
    assert said[1].detail == "started on k80 on w2, w1 (4 GPUs)" and said[1].worker_id == "w2"
    assert said[0].detail == "1 lease, 1 job running"


def test_an_extended_lease_or_the_same_place_says_nothing_and_a_move_says_from_where() -> None:
    previous = (lease(("a",), "w1", "v100", "0:0"), lease(("b",), "w2", "k80", "0:1"), lease(("c",), "w3", "k80", "0:2"))
    current = (
        lease(("a",), "w1", "v100", "0:0", extended=True),  # kept its lease
        lease(("b",), "w2", "k80", "1:1"),  # a new lease, the same worker
        lease(("c",), "w4", "v100", "1:2"),  # moved
    )
    said = events.round_events(1, 20.0, previous, current, active={"a", "b", "c"})
    assert kinds(said) == [("round_started", ""), ("placed", "c")]
    assert said[1].detail == "moved to v100 on w4 (1 GPU), from k80"


def test_a_job_that_ran_and_waits_now_is_preempted_and_one_that_ended_is_not() -> None:
    previous = (lease(("a",), "w1", "v100", "0:0"), lease(("b", "c"), "w2", "k80", "0:1"))
    current = (lease(("d",), "w1", "v100", "1:0"),)
    # b still active, c finished in the last round (not active any more), a still active
    said = events.round_events(1, 20.0, previous, current, active={"a", "b", "d"})
    assert kinds(said) == [("round_started", ""), ("placed", "d"), ("preempted", "a"), ("preempted", "b")]
    assert said[2].detail == "was on v100 on w1 (1 GPU); waits for a later round"
    assert (said[3].accelerator_type, said[3].worker_id) == ("k80", "w2")


def test_a_round_that_runs_nothing_preempts_without_a_start() -> None:
    previous = (lease(("a",), "w1", "v100", "0:0"),)
    assert kinds(events.round_events(1, 20.0, previous, (), active={"a"})) == [("preempted", "a")]


def test_a_packed_pair_names_its_partner() -> None:
    said = events.round_events(0, 0.0, (), (lease(("a", "b"), "w1", "v100", "0:0+1"),), active={"a", "b"})
    assert [e.detail for e in said[1:]] == [
        "started on v100 on w1 (1 GPU), packed with b", "started on v100 on w1 (1 GPU), packed with a",
    ]


def test_a_completion_a_failure_and_a_cancel_are_events_and_a_rejection_is_not() -> None:
    done = events.job_ended("completed", "a", "", 50.0, 4, "v100")
    assert done is not None and (done.kind, done.event_id, done.accelerator_type, done.round_id) == ("completed", "completed:a", "v100", 4)
    failed = events.job_ended("failed", "b", "crashed 5 times", 50.0, 4)
    assert failed is not None and failed.detail == "crashed 5 times" and failed.routing_key() == "event.failed"
    assert events.job_ended("rejected", "c", "too big", 50.0, 4) is None
    assert events.job_ended("refused", "c", "bad", 50.0, 4) is None


def test_a_worker_lost_says_its_gpus_and_why_and_a_join_is_told_apart_by_time() -> None:
    lost = events.worker_lost("w1", "k80", 4, "silent for 45 s", 90.0, 2)
    assert (lost.kind, lost.worker_id, lost.accelerator_type, lost.detail) == ("worker_lost", "w1", "k80", "4 GPUs: silent for 45 s")
    first = events.worker_joined("w1", "k80", 4, "i1", 10.0, 0)
    again = events.worker_joined("w1", "k80", 4, "i1", 100.0, 3)  # back after its loss
    assert first.event_id != again.event_id


def test_a_restart_says_its_epoch_and_that_it_recovered() -> None:
    assert events.mechanism_started(1, 0.0, 0, recovered=False).detail == "epoch 1, started afresh"
    restarted = events.mechanism_started(3, 5.0, 12, recovered=True)
    assert (restarted.event_id, restarted.detail) == ("mechanism_started:3", "epoch 3, started from its journal at round 12")


def test_the_ring_keeps_the_newest_each_once_and_answers_for_one_job() -> None:
    ring = events.EventRing(size=3)
    said = [events.job_ended("completed", j, "", float(t), 0) for t, j in enumerate("abcd")]
    assert all(ring.add(e) for e in said if e is not None)
    assert not ring.add(said[3])  # said again: kept once
    assert [e.job_id for e in ring.recent()] == ["b", "c", "d"] and ring.dropped == 1
    assert [e.job_id for e in ring.recent(job_id="c")] == ["c"]
    report = events.events_report(ring, 9.0, 2, job_id="d")
    assert report["now_s"] == 9.0 and report["dropped"] == 1
    assert report["events"] == [{
        "id": "completed:d", "kind": "completed", "time_s": 3.0, "round_id": 0, "job_id": "d", "worker_id": None,
        "accelerator_type": None, "detail": "",
    }]


def test_a_job_that_ran_before_and_waited_resumes() -> None:
    history = {"a": [{"first_round": 3, "last_round": 4}, {"first_round": 9, "last_round": 9}], "b": [{"first_round": 9}]}
    said = events.round_events(
        9, 0.0, (), (lease(("a",), "w1", "v100", "9:0"), lease(("b",), "w2", "k80", "9:1")), active={"a", "b"}, history=history,
    )
    assert [(e.job_id, e.detail) for e in said[1:]] == [
        ("a", "resumed on v100 on w1 (1 GPU)"), ("b", "started on k80 on w2 (1 GPU)"),
    ]


def test_the_ring_answers_the_newest_few_when_asked() -> None:
    ring = events.EventRing()
    for t, j in enumerate("abcde"):
        ring.add(events.job_ended("completed", j, "", float(t), 0))  # type: ignore[arg-type]
    assert [e.job_id for e in ring.recent(limit=2)] == ["d", "e"]
    assert [e["job_id"] for e in events.events_report(ring, 9.0, 0, limit=3)["events"]] == ["c", "d", "e"]  # type: ignore[index, union-attr]
    assert len(ring.recent(limit=0)) == 5
