"""core/pool.py: a worker joining a running cluster and a worker lost, as values in the memory."""

from __future__ import annotations

from common.messages import JobProgress, KillJobs, WorkerRegistered
from mechanism_service.core import leases
from mechanism_service.core import pool as pool_core
from mechanism_service.core.memory import Lease, Memory
from mechanism_service.core.model import Placement
from tests.unit.mechanism.builders import DEFAULT, RATES, state


def two_workers_running_a_gang() -> Memory:
    """Workers w0 and w1 (one k80 each) run j0's gang lease "0:0" of round 0; j1 runs alone on w2."""
    memory = Memory()
    for worker_id in ("w0", "w1", "w2"):
        pool_core.join(memory, WorkerRegistered(worker_id, "k80", 1, worker_id, instance=f"i-{worker_id}"), DEFAULT, RATES)
    s, made = pool_core.ensure_state(memory, 1)
    assert made and memory.worker_of == {0: ("w0", 0), 1: ("w1", 0), 2: ("w2", 0)}
    memory.state = state(k80=3).job("a", scale_factor=2).job("a").build()
    memory.round_id = 1
    memory.expected = {
        "0:0": Lease("0:0", (0,), Placement("k80", (0, 1)), 0.0),
        "0:1": Lease("0:1", (1,), Placement("k80", (2,)), 0.0),
    }
    return memory


def test_a_lost_worker_ends_its_gangs_leases_and_the_others_of_the_gang_are_told() -> None:
    memory = two_workers_running_a_gang()
    loss = pool_core.lose(memory, "w0", "no heartbeat", 40.0)
    assert loss == pool_core.Loss(
        1, ("0:0",), (KillJobs("w1", 0, "0:0", 0, "worker w0 of this gang was lost"),), round_complete=False
    )
    assert memory.ended_leases == {"0:0": "worker w0 lost: no heartbeat"}
    assert memory.lost_workers == {"w0": {"accelerator_type": "k80", "gpus": 1, "lost_at_s": 40.0, "reason": "no heartbeat"}}
    assert memory.servers["k80"] == [("w1", 1), ("w2", 1)] and 0 not in memory.worker_of
    assert memory.state is not None and memory.state.gpus == {"k80": 2} and memory.resolve_now
    assert pool_core.lose(memory, "w0", "again", 41.0) is None  # lost already
    assert pool_core.held(memory, "w0") is None


def test_a_loss_that_leaves_the_round_waiting_for_nobody_completes_it() -> None:
    memory = two_workers_running_a_gang()
    assert not leases.apply_progress(memory, JobProgress("j1", "w2", "0:1", 0, 100, 360.0, 0.3))  # the gang has not reported
    loss = pool_core.lose(memory, "w1", "no heartbeat", 40.0)
    assert loss is not None and loss.round_complete and leases.round_complete(memory)
    assert leases.unreported(memory) == ["0:0"]  # ended early, with nothing reported


def test_a_lost_worker_comes_back_as_a_new_server() -> None:
    memory = two_workers_running_a_gang()
    pool_core.lose(memory, "w0", "no heartbeat", 40.0)
    joined = pool_core.join(memory, WorkerRegistered("w0", "k80", 1, "w0", instance="i-w0b"), DEFAULT, RATES)
    assert joined == "worker_rejoined" and "w0" not in memory.lost_workers
    assert memory.worker_of[3] == ("w0", 0)  # new GPU ids: ids are never reused
    assert pool_core.held(memory, "w0") is not None and pool_core.held(memory, "w0").instance == "i-w0b"  # type: ignore[union-attr]
