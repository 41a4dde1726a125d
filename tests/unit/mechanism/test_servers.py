"""remove_server, the inverse of add_server: a lost worker's GPUs leave the cluster, nothing is kept
on them, and a type left with no GPU breaks neither planning nor the policy input."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from mechanism_service.core.model import Placement
from mechanism_service.core.policy_input import allocation_request
from mechanism_service.core.reducers import add_server, remove_server, settle_round
from mechanism_service.core.rounds import open_round
from tests.unit.mechanism.builders import DEFAULT, GAVEL, RATES, isolated, lease, no_shuffle, pair, state


def no_shuffle(order: list[str]) -> None:
    pass


def test_a_server_that_joined_and_left_leaves_the_cluster_as_it_was_but_for_its_ids():
    s = state(k80=2, v100=1).job("a").settled().build()
    before = copy.deepcopy(s)
    ids = add_server(s, "v100", 2, GAVEL, RATES)
    assert ids == [3, 4] and s.gpus["v100"] == 3

    remove_server(s, "v100", ids)

    assert (s.gpus, s.servers) == (before.gpus, before.servers)
    assert s.next_worker_id == 5  # ids are never reused: a worker that comes back gets new ones
    assert s.needs_allocation
    assert add_server(s, "v100", 2, GAVEL, RATES) == [5, 6]


def test_only_the_placements_on_its_gpus_are_forgotten():
    s = state(k80=2, v100=2).jobs(3).ran((0,), "k80", 0).ran((1,), "v100", 2, 3).ran((2,), "k80", 1).build()

    remove_server(s, "v100", [3])  # one GPU of the gang on 2 and 3

    assert s.previous_assignment == {(0,): Placement("k80", (0,)), (2,): Placement("k80", (1,))}
    assert s.servers["v100"] == [[2]] and s.gpus["v100"] == 1


def test_gpus_of_several_servers_leave_each_of_them_and_empty_servers_go():
    s = state(gpus_per_server=2, k80=4).build()  # servers [0, 1], [2, 3]
    remove_server(s, "k80", [1, 2, 3])
    assert s.servers["k80"] == [[0]] and s.gpus["k80"] == 1


def test_gpus_that_are_not_there_are_refused():
    s = state(k80=2).build()
    with pytest.raises(ValueError, match=r"k80: GPUs \[7\] are not in this cluster"):
        remove_server(s, "k80", [1, 7])
    assert s.gpus["k80"] == 2  # nothing changed


def test_a_type_left_with_no_gpu_is_skipped_by_planning_and_the_policy_input():
    s = (
        state(k80=1, v100=1).with_settings(DEFAULT).job("a").job("a", scale_factor=2)
        .allocate((0,), v100=1.0).ran((0,), "v100", 1).build()
    )

    remove_server(s, "v100", [1])

    assert s.gpus == {"k80": 1, "v100": 0} and s.servers["v100"] == []
    plan = open_round(s, 0.0, DEFAULT, no_shuffle)
    assert plan.assignment == {(0,): Placement("k80", (0,))}  # placed afresh: not kept on the lost GPU
    assert plan.kept == frozenset()
    request = allocation_request(s, 0.0, request_id="r", policy="max_min_fairness_perf", deadline_s=1.0)
    assert request.problem.worker_types == {"k80": 1, "v100": 0}  # the policy accepts a zero count
    # the gang fits nowhere now: left out, or the policy would refuse the whole problem for it
    assert [j.job_id for j in request.problem.jobs] == ["j0"]


def test_a_lease_that_crashed_or_lost_its_worker_credits_what_it_did_and_is_no_gang_failure():
    s = state(k80=2).job("a", scale_factor=2).job("a").done(0, 0, failures=2).type_time(k80=360.0).settled().build()
    s.previous_assignment = {(0,): Placement("k80", (0, 1)), (1,): Placement("k80", (1,))}
    crashed = lease((0,), "k80", (0, 1), (1,), 1100.0)  # fewer steps than GPUs: a gang failure if simulated
    lost = lease((1,), "k80", (1,), (0,), 1000.0)

    done = settle_round(s, [replace(crashed, ended="crashed"), replace(lost, ended="lost")], 1000.0, GAVEL)

    assert done == []
    assert (s.jobs[0].steps_done, s.jobs[0].failures, s.jobs[1].steps_done) == (1, 2, 0)  # failures neither up nor reset
    assert s.jobs[0].gpu_seconds_by_type["k80"] == 100.0 * 2  # it held both GPUs for 100 s
    assert s.entries[(0,)].received_s["k80"] == 180.0 + 100.0 and s.entries[(1,)].received_s["k80"] == 180.0
    assert s.previous_assignment == {}  # no process runs there any more: launched afresh, not extended

