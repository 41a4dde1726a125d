"""Backpressure on submissions (issue 13), against RabbitMQ: the mechanism's submissions queue is
bounded (GAVEL_SUBMISSIONS_MAX_LENGTH), `gavel submit --trace` of more than fits is told which jobs
were not accepted and why (exit 1), seals its batch with what the broker took, so the mechanism's
answer comes and counts exactly those; and a queue declared before the bound existed stops the
mechanism with one line that says what to do. Each test on a private exchange, removed afterwards.

Costs (2 shared cores): the over-the-bound submit without a mechanism ~2 s, with a mechanism ~5 s,
the queue made before the bound ~2 s."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.codec import DEFAULT_CODEC
from common.config import BusSettings
from common.messages import JobSubmitted
from common.topology import ESTIMATOR_INPUTS, MECHANISM_SUBMISSIONS
from common.transport.rabbit import RabbitBus
from tests.support.broker import delete_topology
from tests.support.processes import SERVICE_QUEUES, Cluster, logged
from tests.support.waiting import Collector, eventually

RESNET = "ResNet-50 (batch size 64)"


@pytest.fixture
def cluster(broker_url: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(broker_url, tmp_path)
    try:
        yield c
    finally:
        c.stop_all()
        asyncio.run(delete_topology(broker_url, c.exchange, SERVICE_QUEUES))


def write_trace(path: Path, jobs: int) -> Path:
    path.write_text("".join(
        json.dumps({"job_id": str(i), "job_type": RESNET, "total_steps": 1000 + i, "arrival_time_s": i}) + "\n"
        for i in range(jobs)
    ))
    return path


def submitted_in_journal(path: Path) -> list[str]:
    """The job ids the mechanism journaled as accepted submissions (read-only)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT body FROM events WHERE kind = 'submitted' ORDER BY seq").fetchall()
    finally:
        db.close()
    out = []
    for (body,) in rows:
        message = DEFAULT_CODEC.decode(body).message
        assert isinstance(message, JobSubmitted)
        out.append(message.spec.job_id)
    return out


async def queued_job_ids(cluster: Cluster, count: int) -> list[str]:
    """What waits in the mechanism's queue, taken off it by a stand-in consumer."""
    bus = RabbitBus(BusSettings(kind="amqp", amqp_url=cluster.url, exchange=cluster.exchange, submissions_max_length=5))
    await bus.start()
    try:
        got = Collector()
        await bus.subscribe(MECHANISM_SUBMISSIONS.name, MECHANISM_SUBMISSIONS.bindings, got)
        await got.wait_for_count(count)
        await asyncio.sleep(0)
        return [getattr(m, "spec", m).job_id if isinstance(m, JobSubmitted) else type(m).__name__ for m in got.messages]
    finally:
        await bus.close()


def test_a_trace_over_the_bound_is_told_which_jobs_were_not_accepted(cluster: Cluster, tmp_path: Path) -> None:
    """No mechanism: the queue fills at 5, the 3 after are refused by the broker (a nack), said
    with the reason and their ids; the seal cannot get in either, which is said too; exit 1.
    The queue then holds exactly the first 5 jobs: nothing dropped, nothing extra."""
    cluster.env["GAVEL_SUBMISSIONS_MAX_LENGTH"] = "5"
    trace = write_trace(tmp_path / "t.jsonl", 8)
    done = cluster.gavel("submit", "--trace", str(trace), "--id-prefix", "", "--now", "--timeout-s", "1")
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("gavel: ")]
    assert lines == [
        "gavel: 3 of 8 jobs not accepted: the mechanism's submissions queue is full (at most 5 waiting, "
        "GAVEL_SUBMISSIONS_MAX_LENGTH): it is behind; submit these again later",
        "gavel: job 5 not accepted (queue full)",
        "gavel: job 6 not accepted (queue full)",
        "gavel: job 7 not accepted (queue full)",
        "gavel: the batch could not be sealed: the mechanism's submissions queue stayed full for 1 s (is the mechanism "
        "running?); the 5 jobs accepted wait in its queue",
    ], done.stderr
    assert done.stdout.strip() == "submitted 8 jobs (0 .. 7): 5 accepted, 3 not accepted (queue full)"
    assert asyncio.run(queued_job_ids(cluster, 5)) == ["0", "1", "2", "3", "4"]


@pytest.mark.slow  # ~6-10 s: the services as processes on RabbitMQ
def test_with_the_mechanism_running_the_answer_counts_exactly_what_the_broker_took(cluster: Cluster, tmp_path: Path) -> None:
    """A trace far over a small bound while the mechanism takes it in: every job is either
    accepted or listed as not accepted; the batch is sealed with the accepted count, so the
    mechanism answers (it waits for no refused job) and its answer and its journal hold exactly
    the accepted jobs."""
    cluster.env["GAVEL_SUBMISSIONS_MAX_LENGTH"] = "20"
    journal = tmp_path / "journal.sqlite"
    cluster.start("mechanism", "serve", "mechanism", "--journal", str(journal), "--time-scale", "1000")
    asyncio.run(eventually(lambda: logged(tmp_path / "mechanism.log", "service_started"), timeout_s=30))
    trace = write_trace(tmp_path / "t.jsonl", 3000)
    done = cluster.gavel("submit", "--trace", str(trace), "--id-prefix", "", "--now", "--json", "--timeout-s", "30")
    answer = json.loads(done.stdout)
    refused = answer["not_accepted"]["job_ids"]
    assert answer["accepted"] + len(refused) == 3000 and answer["sealed"] and answer["confirmed"], done.stderr
    assert (answer["new"], answer["known"], answer["refused"]) == (answer["accepted"], 0, 0)
    assert done.returncode == (1 if refused else 0)
    if refused:
        assert answer["not_accepted"]["reason"].startswith("the mechanism's submissions queue is full (at most 20 waiting")
    accepted = sorted(set(map(str, range(3000))) - set(refused), key=int)
    assert sorted(submitted_in_journal(journal), key=int) == accepted


@pytest.mark.slow  # ~3-5 s: a mechanism process that stops
def test_a_queue_made_before_the_bound_stops_the_mechanism_with_what_to_do(cluster: Cluster, tmp_path: Path) -> None:
    """An existing deployment's queue has no bound; RabbitMQ refuses to declare it with one (406
    PRECONDITION_FAILED). The mechanism says so in one line, naming the queue and both ways out,
    and does not start; with GAVEL_SUBMISSIONS_MAX_LENGTH=none it runs on the queue as it is."""

    async def old_queue() -> None:
        bus = RabbitBus(BusSettings(kind="amqp", amqp_url=cluster.url, exchange=cluster.exchange, submissions_max_length=None))
        await bus.start()
        for queue in (MECHANISM_SUBMISSIONS, ESTIMATOR_INPUTS):
            await bus.declare(queue.name, queue.bindings)
        await bus.close()

    asyncio.run(old_queue())
    mechanism = cluster.start("mechanism", "serve", "mechanism", "--no-journal", "--time-scale", "1000")
    assert mechanism.wait(timeout=60) == 2  # a setting's matter, as a bad setting is
    cluster.processes.pop("mechanism")
    [log] = [line for line in (tmp_path / "mechanism.log").read_text().splitlines() if line.startswith("gavel: ")]
    name = f"{cluster.exchange}.mechanism.submissions"
    assert log.startswith(
        f"gavel: service 'mechanism' failed to start: queue '{name}' exists with other arguments than this gavel "
        "declares with at most 100000 messages waiting (GAVEL_SUBMISSIONS_MAX_LENGTH=100000): inequivalent arg "
        "'x-max-length'"
    ), log
    assert "GAVEL_SUBMISSIONS_MAX_LENGTH set to its own bound ('none': it has none)" in log
    assert f"rabbitmqctl delete_queue {name}" in log
    cluster.env["GAVEL_SUBMISSIONS_MAX_LENGTH"] = "none"
    cluster.start("mechanism", "serve", "mechanism", "--no-journal", "--time-scale", "1000")
    asyncio.run(eventually(lambda: logged(tmp_path / "mechanism.log", "service_started"), timeout_s=30))
