"""Hostile input end to end over RabbitMQ (issue 13), the services as separate processes: while
the policy replicas, the mechanism, the estimator and a simulated fleet run a trace in lockstep
(as tests/e2e/test_processes.py does), hostile bodies are published raw on every routing key
their queues are bound to (as the broker lists the bindings), the fleet stopped meanwhile so that
the trace cannot end before the pour does. No process stops, the dead-letter
queue holds every copy of every poisoned body with its reason and nothing else, and the trace's
results are the in-process simulator's, job by job and round by round.

The count is per binding: a literal one (job.submitted) gets it on its key, a worker's wildcard
(worker.cmd.k80-0.*) spread over its five command keys; 27 bindings, 75 keys. Each body is a
persistent message through the broker and each copy's dead letter a confirmed publish, one at a
time per queue. The fleet is stopped for the pour, so the pour's length adds to the trace's; the
rest is the trace itself. `make test` (and CI) sends QUICK_BODIES_PER_BINDING (~3,200 copies,
every kind of hostile body on every key; the pour ~3 s) during the 16-job trace of QUICK_JOBS
(127 rounds; the test ~20-25 s), `make test-deep` DEEP_BODIES_PER_BINDING (~9,600 copies; the pour
~9 s) during the whole 32-job trace (1,345 rounds; the test ~65-100 s on 2 busy cores);
GAVEL_POISON_BODIES=N sends N in either tier, 10000 the issue's count: measured once,
269,808 bodies sent in 184 s from round 3, 299,657 copies dead-lettered 433 s after the first,
the trace done at 454 s, the test 493 s (load average ~9 from other work)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from common.bus import DeadLetter, Delivery
from common.codec import DEFAULT_CODEC
from common.config import BusSettings
from common.errors import DecodeError
from common.host import ServiceBus
from common.messages import JobCompleted, RoundStarted
from common.topology import queue_bounds
from common.transport.rabbit import RabbitBus
from mechanism_service.core.settings import preset
from policy_service.service import shipped_context
from sim.driver import simulate_services
from sim.fastpath import RunConfig
from sim.traces import read_trace
from tests.e2e.test_processes import POLICY, TRACE, check_invariants, mechanism_args, wait_for_all
from tests.support.broker import broker_required
from tests.support.data import fewest_steps
from tests.support.poison import (
    QueueDepths,
    bindings_problem,
    broker_bindings,
    keys_of,
    poison,
    publish_raw_many,
    routed,
    take_all_dead_letters,
    until,
)
from tests.support.processes import SERVICE_QUEUES, Cluster
from tests.support.seeds import deep
from tests.support.waiting import eventually

# a wildcard binding's quick 100 spread over its five keys: 20 a key, each kind of body ~7 times
QUICK_BODIES_PER_BINDING = 100
DEEP_BODIES_PER_BINDING = 300
BODIES_PER_BINDING = int(
    os.environ.get("GAVEL_POISON_BODIES") or (DEEP_BODIES_PER_BINDING if deep() else QUICK_BODIES_PER_BINDING)
)
# the suite's 300 s, or for a full count what it takes (10,000 a binding: ~15 min on 2 busy cores)
pytestmark = [pytest.mark.broker, pytest.mark.timeout(max(300, BODIES_PER_BINDING // 4))]
POUR_AT_ROUND = 3  # the trace is under way: jobs admitted, leases running
# The trace is most of the test's cost (its lockstep rounds across processes, ~50 s for the 32 jobs'
# 1,345 rounds), not the pour (the fleet stopped meanwhile holds the trace wherever it is). `make
# test` (and CI) runs the QUICK_JOBS jobs of fewest steps (127 rounds on the 12 GPUs, still more
# jobs than GPUs), `make test-deep` all 32 (as tests/e2e/test_processes.py).
QUICK_JOBS = 16


@dataclass(frozen=True)
class Run:
    outcomes: dict[str, tuple[float, float, int]]  # job id -> (completion time s, JCT s, steps)
    rounds: list[RoundStarted]


class RoundRecorder:
    """The in-process run's rounds, as the mechanism announced them."""

    name = "rounds"

    def __init__(self) -> None:
        self.rounds: list[RoundStarted] = []

    async def start(self, bus) -> None:  # noqa: ANN001 - a Bus
        await bus.subscribe(self.name, [RoundStarted.ROUTING_KEY], self._on_round, durable=False)

    async def stop(self) -> None:
        return None

    async def _on_round(self, d: Delivery) -> None:
        self.rounds.append(d.message)  # type: ignore[arg-type]


def tier_trace(scratch: Path) -> Path:
    """The trace this tier runs: the reference trace (make test-deep), or its QUICK_JOBS jobs of
    fewest steps in the trace's order, written under ``scratch`` (make test)."""
    return TRACE if deep() else fewest_steps(TRACE, QUICK_JOBS, scratch)


def undisturbed(trace: Path) -> Run:
    """The in-process simulator on the same trace and settings as the processes."""
    recorder = RoundRecorder()
    config = RunConfig(POLICY, {"v100": 4, "p100": 4, "k80": 4}, preset("gavel", POLICY), seed=0)
    result = asyncio.run(simulate_services(read_trace(trace), config, shipped_context(), observers=[recorder]))
    outcomes = {j.job_id: (j.completion_s, j.jct_s, j.steps_done) for j in result.jobs if j.completion_s is not None}
    return Run(outcomes, recorder.rounds)  # type: ignore[arg-type]


class Observer:
    """The run seen from outside, deduplicated by message id (at-least-once). It consumes like a
    service (through a ServiceBus: a message under another key than its own is dead-lettered),
    so the poison that reaches its queue is dead-lettered too, and counted."""

    def __init__(self) -> None:
        self.seen_ids: set[str] = set()
        self.completions: dict[str, list[float]] = {}  # what check_invariants reads
        self.completed: dict[str, JobCompleted] = {}
        self.rounds: dict[int, list[RoundStarted]] = {}

    async def __call__(self, d: Delivery) -> None:
        m = d.message
        if d.envelope.message_id in self.seen_ids:
            return
        self.seen_ids.add(d.envelope.message_id)
        if isinstance(m, JobCompleted):
            self.completions.setdefault(m.job_id, []).append(m.jct_s)
            self.completed[m.job_id] = m
        elif isinstance(m, RoundStarted):
            self.rounds.setdefault(m.round_id, []).append(m)


def expected_reason(letter: DeadLetter) -> str:
    """Why a poisoned body must have been refused: the codec's reason, or the host's."""
    try:
        message = DEFAULT_CODEC.decode(letter.body).message
    except DecodeError as e:
        return f"undecodable: {e.reason}"[:1000]
    return (
        f"handler failed: MisroutedError: a {type(message).__name__} belongs on {message.routing_key()}, "
        f"it arrived on {letter.routing_key}"
    )


def by_queue_and_key(counts: collections.Counter[tuple[str, str, bytes]]) -> dict[tuple[str, str], int]:
    out: collections.Counter[tuple[str, str]] = collections.Counter()
    for (queue, key, _), n in counts.items():
        out[queue, key] += n
    return dict(sorted(out.items()))


async def services_up(cluster: Cluster, bus: RabbitBus, tmp_path: Path) -> None:
    """Every service process, each consuming its queues (so bound): the mechanism, in lockstep,
    waits for the trace, which is submitted once the poison is ready."""
    # No AMQP heartbeats for the fleet: it is stopped while the poison is poured (paused), which
    # takes minutes with GAVEL_POISON_BODIES=10000, and the broker would drop a silent connection.
    without_heartbeats = urllib.parse.urlparse(cluster.url)._replace(query="heartbeat=0").geturl()
    cluster.start("policy-a", "serve", "policy", "--replica", "policy-a", "--solving", "inline")
    cluster.start("policy-b", "serve", "policy", "--replica", "policy-b", "--solving", "inline")
    cluster.start("estimator", "serve", "estimator", "--mode", "oracle")  # as tests/e2e/test_processes.py
    cluster.start("mechanism", *mechanism_args(tmp_path / "mechanism.sqlite"))

    async def consumed(queues: tuple[str, ...]) -> bool:
        return all([await bus.consumer_count(queue) for queue in queues])

    # The fleet once the mechanism's queues are there: its registrations (not mandatory) then all
    # reach the mechanism, in the fleet's order, as in the in-process run. Started beside the
    # mechanism, the first could go out before the mechanism's queue was bound and be lost: that
    # worker joined at the fleet's next heartbeat, last, and round 0 placed jobs on other ids.
    services = tuple(queue for queue in SERVICE_QUEUES if not queue.startswith("fleet."))
    try:
        await until(lambda: consumed(services), timeout_s=120, poll_s=0.2)
        cluster.start("fleet", "serve", "fleet", "--cluster", "4:4:4", "--lockstep", "--amqp", without_heartbeats)
        await until(lambda: consumed(SERVICE_QUEUES), timeout_s=120, poll_s=0.2)
    except TimeoutError:
        raise AssertionError(f"not every service queue is consumed\n{cluster.logs()}") from None


@pytest.mark.slow  # ~20-25 s: 16 jobs in lockstep across processes, ~3,200 hostile copies (make test-deep: 32 jobs, ~9,600 copies, ~65-100 s)
@pytest.mark.deep
async def test_hostile_bodies_on_every_bound_key_while_processes_run_a_trace(cluster, tmp_path, capsys):
    problem = bindings_problem(cluster.url)
    if problem:
        if broker_required():
            pytest.fail(problem)
        pytest.skip(problem)
    trace = tier_trace(tmp_path)
    jobs = len(read_trace(trace))
    expected = await asyncio.to_thread(undisturbed, trace)
    bus = RabbitBus(BusSettings(kind="amqp", amqp_url=cluster.url, exchange=cluster.exchange), source="poisoner")
    await bus.start()
    try:
        observer = Observer()
        await ServiceBus(bus, "observer").subscribe(
            "observer", [JobCompleted.ROUTING_KEY, RoundStarted.ROUTING_KEY], observer, prefetch=256
        )
        await services_up(cluster, bus, tmp_path)

        # 1. the keys the services' queues are bound to, as the broker says, and their poison
        bindings = broker_bindings(cluster.url, cluster.exchange)
        services = {queue: patterns for queue, patterns in bindings.items() if queue != "observer"}
        # the durable queues, and the fleet's private one for `gavel logs` (it says a simulated job
        # has no output): a queue of the fleet's like the others, poisoned and counted alike
        assert set(services) == {*SERVICE_QUEUES, "fleet.logs"}, bindings
        patterns = set().union(*services.values())
        bodies = await asyncio.to_thread(poison, patterns, BODIES_PER_BINDING)
        keys = set(bodies)
        assert {"job.submitted", "job.progress", "allocation.requested", "worker.cmd.k80-0.fenced"} <= keys
        assert keys == set().union(*(keys_of(p) for p in patterns))  # each key of each binding
        # the mechanism's submissions queue is bounded (common/topology.py): past it the broker
        # refuses a publish, whose copies to other queues it keeps; the poison waits for room
        bounds = queue_bounds(BusSettings.from_env(cluster.env).submissions_max_length)

        # 2. the trace; once it runs, the poison, raw, on every key
        out = await asyncio.to_thread(cluster.run, "submit", "--trace", str(trace), "--id-prefix", "", "--no-wait")
        assert out.strip() == f"submitted {jobs} jobs (0 .. {jobs - 1})"
        await eventually(lambda: len(observer.rounds) >= POUR_AT_ROUND, timeout_s=120, poll_s=0.05)
        rounds_before = len(observer.rounds)
        began = time.perf_counter()
        async with QueueDepths(cluster.url, cluster.exchange) as depths:
            # The trace must not end before the poison is all in, however long the pour takes: in
            # lockstep time moves only when every lease has reported, so a stopped fleet holds the
            # trace where it is (the mechanism, the policy and the estimator go on taking poison).
            with paused(cluster, "fleet"):
                for key, poisoned in bodies.items():
                    bounded = [(queue, bounds[queue]) for queue in routed(key, bindings) if queue in bounds]

                    async def room(n: int, bounded: list[tuple[str, int]] = bounded) -> None:
                        for queue, bound in bounded:
                            await depths.room_for(queue, n, bound)

                    await publish_raw_many(bus, key, poisoned, before_window=room)
                poured_s = time.perf_counter() - began
                assert len(observer.completed) < jobs  # published while the trace ran, not after

            # 3. the trace ends; every copy of every poisoned body is dead-lettered
            sent = sum(len(b) for b in bodies.values())
            letters_expected = collections.Counter(
                (queue, key, body) for key, poisoned in bodies.items() for queue in routed(key, bindings) for body in poisoned
            )
            total = sum(letters_expected.values())
            budget_s = 120 + total / 100  # measured: ~600 copies dead-lettered a second, all queues together
            with contextlib.suppress(TimeoutError):  # what is there is compared below
                await until(lambda: _at_least(depths, "dead-letters", total), timeout_s=budget_s, poll_s=0.2)
            drained_s = time.perf_counter() - began
            await wait_for_all(observer, cluster, timeout_s=budget_s, jobs=jobs)
            trace_s = time.perf_counter() - began

            # 4. no process stopped, and each stops cleanly when asked (a crashed service exits 1)
            processes = dict(cluster.processes)
            assert {name: p.poll() for name, p in processes.items()} == dict.fromkeys(processes), cluster.logs()
            cluster.stop_all()
            assert {name: p.returncode for name, p in processes.items()} == dict.fromkeys(processes, 0), cluster.logs()
            waiting = await depths.of("dead-letters")  # all of them: no service runs any more

        # 5. the dead letters: every poisoned copy, each with its reason, nothing else
        letters = await take_all_dead_letters(cluster.url, cluster.exchange, waiting, timeout_s=budget_s)
        got = collections.Counter((letter.queue, letter.routing_key, letter.body) for letter in letters)
        if got != letters_expected:
            want, have = by_queue_and_key(letters_expected), by_queue_and_key(got)
            differ = {k: (want.get(k, 0), have.get(k, 0)) for k in want.keys() | have.keys() if want.get(k) != have.get(k)}
            pytest.fail(
                f"dead letters by (queue, key), (expected, got) where they differ: {dict(sorted(differ.items()))}; "
                f"{sum((got - letters_expected).values())} unexpected, {sum((letters_expected - got).values())} missing"
            )
        wrong = [(letter.queue, letter.routing_key, letter.reason) for letter in letters if letter.reason != expected_reason(letter)]
        assert not wrong, wrong[:5]
        reasons = collections.Counter(letter.reason.split(":")[0] for letter in letters)
        assert set(reasons) == {"undecodable", "handler failed"}, reasons
    finally:
        await bus.close()

    # 6. the results are the undisturbed run's, job by job and round by round
    check_invariants(observer)  # type: ignore[arg-type]
    outcomes = {j: (m.completion_time_s, m.jct_s, m.steps_done) for j, m in observer.completed.items()}
    assert outcomes.keys() == expected.outcomes.keys() and len(outcomes) == jobs
    for job_id, (completion_s, jct_s, steps) in outcomes.items():
        assert (completion_s, jct_s) == pytest.approx(expected.outcomes[job_id][:2], abs=1e-6), job_id
        assert steps == expected.outcomes[job_id][2], job_id
    assert [observer.rounds[r][0] for r in sorted(observer.rounds)] == expected.rounds
    with capsys.disabled():
        print(
            f"\npoison: {BODIES_PER_BINDING} a binding on {len(patterns)} bindings ({len(keys)} keys), {sent} sent "
            f"from round {rounds_before} in {poured_s:.1f} s; {total} copies dead-lettered {drained_s:.1f} s, and the "
            f"trace's {len(expected.rounds)} rounds over {trace_s:.1f} s, after the first"
        )


@contextlib.contextmanager
def paused(cluster: Cluster, name: str) -> Iterator[None]:
    """SIGSTOP the process ``name`` for the block, SIGCONT after (whatever happens)."""
    process = cluster.processes[name]
    process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        process.send_signal(signal.SIGCONT)


async def _at_least(depths: QueueDepths, queue: str, n: int) -> bool:
    return await depths.of(queue) >= n
