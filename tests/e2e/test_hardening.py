"""Issue 9 on a live cluster of service processes over RabbitMQ: no single job, message or worker
stops it; a trace keeps its arrival spacing; ids are never dropped without a word; a gang that
cannot fit says why it waits; cancels; a restart under another policy says so; a worker on
another clock and a policy queue with no consumer are said at once.

Clusters run on a scaled clock (--time-scale 1000: a 360 s round lasts 0.36 s). The two tests
that need only a running cluster share one (`live`); the others start their own. Commands run by
their main() in this process and the waits ask the mechanism over one connection
(tests/support/asking.py): a `gavel` process each cost ~0.5 s of CPU and ~1 s of wall. File alone
~30 s wall, ~13 s of CPU (load ~3)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgpack
import pytest

from common.config import BusSettings
from common.messages import JobSpec, JobSubmitted
from common.transport.rabbit import RabbitBus
from tests.support.asking import Status, gavel_here
from tests.support.broker import delete_topology
from tests.support.processes import SERVICE_QUEUES, Cluster, logged, the_line
from tests.support.waiting import eventually, until

pytestmark = pytest.mark.broker

RESNET = "ResNet-50 (batch size 64)"
SCALE = ("--time-scale", "1000")


async def gavel(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`gavel ARGS` by its main() in this process (tests/support/asking.py: a process each cost
    ~0.5 s of CPU and ~1 s of wall)."""
    return await asyncio.wait_for(gavel_here(cluster, *args), 60)


async def answer(cluster: Cluster, *args: str) -> object:
    """A command's ``--json`` answer (it must succeed)."""
    done = await gavel(cluster, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
async def status(cluster: Cluster) -> AsyncIterator[Status]:
    """The mechanism's answers (`gavel jobs --json` ...) asked in the test's process, for the
    waits: a `gavel` subprocess a poll cost ~1 s of wall and ~0.4 s of CPU (tests/support/asking.py)."""
    async with Status(cluster) as s:
        yield s


async def rogue_publish(cluster: Cluster, *messages: object, raw: tuple[bytes, ...] = ()) -> None:
    """What a client that skips `gavel submit` (or a broken one) can put on the queue."""
    bus = RabbitBus(BusSettings(kind="amqp", amqp_url=cluster.url, exchange=cluster.exchange), source="rogue")
    await bus.start()
    for m in messages:
        await bus.publish(m)  # type: ignore[arg-type]
    for body in raw:
        await bus.publish_raw(JobSubmitted.ROUTING_KEY, body)
    await bus.close()


def envelope(body: dict[str, object]) -> bytes:
    """A JobSubmitted on the wire, written by hand: fields our encoder would never let through."""
    return msgpack.packb({"schema": "JobSubmitted", "ver": 1, "id": "rogue-raw", "cid": None, "src": "rogue", "at": 0.0, "body": body})


def start_cluster(cluster: Cluster, tmp_path: Path, *, policy: str = "max_min_fairness_perf", cluster_spec: str = "v100=2,p100=2,k80=2") -> None:
    cluster.start("policy", "serve", "policy", "--solving", "inline")
    cluster.start(
        "mechanism", "serve", "mechanism", "--policy", policy, "--journal", str(tmp_path / "journal.sqlite"), *SCALE,
    )
    cluster.start("fleet", "serve", "fleet", "--cluster", cluster_spec, *SCALE)


@pytest.fixture(scope="module")
def live(broker_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster as start_cluster makes it, for the tests that need only a running one and leave
    it running (their jobs have ids of their own): its processes started once a module, not once
    a test (~2 s of CPU, 3-6 s of wall on 2 busy cores). Those tests run on one xdist worker
    (xdist_group "hardening-live")."""
    workdir = tmp_path_factory.mktemp("live")
    c = Cluster(broker_url, workdir)
    try:
        start_cluster(c, workdir)
        yield c
    finally:
        c.stop_all()
        asyncio.run(delete_topology(broker_url, c.exchange, SERVICE_QUEUES))


@pytest.fixture
async def live_status(live: Cluster) -> AsyncIterator[Status]:
    async with Status(live) as s:
        yield s


async def ready(status: Status, workers: int) -> None:
    await until(lambda: status.workers_up(workers), timeout_s=60, poll_s=0.1)


async def completed(status: Status, *job_ids: str) -> bool:
    rows = await status.jobs()
    return all(job_id in rows and rows[job_id]["state"] == "completed" for job_id in job_ids)


async def in_state(status: Status, job_id: str, state: str) -> bool:
    return await status.state(job_id) == state


async def held(status: Status, job_id: str) -> bool:
    return await in_state(status, job_id, "held")


async def running_with_steps(status: Status, job_id: str) -> bool:
    row = (await status.jobs()).get(job_id, {})
    return row.get("state") == "running" and int(row.get("steps_done") or 0) > 0  # type: ignore[call-overload]


@pytest.mark.slow  # ~5 s on 2 busy cores (load ~3), on the module's cluster (its start: whichever of the two runs first)
@pytest.mark.xdist_group("hardening-live")
async def test_no_single_job_or_message_stops_a_live_cluster(live, live_status):
    """One job with each field a policy could refuse, published around the command line's checks,
    between two good jobs; then a gang no worker here can hold, and cancels. Every other job keeps
    being scheduled, and every refusal says why."""
    cluster, status = live, live_status
    await ready(status, 6)
    out = await gavel(cluster, "submit", "--job-type", RESNET, "--steps", "3000", "--job-id", "before")
    assert out.returncode == 0 and out.stdout.strip() == "before", out.stderr

    bad_fields = {
        "bad-slo": JobSpec("bad-slo", RESNET, 1000, slo_s=-10.0),
        "bad-slo-huge": JobSpec("bad-slo-huge", RESNET, 1000, slo_s=1e300),
        "bad-weight": JobSpec("bad-weight", RESNET, 1000, priority_weight=0.0),
        "bad-weight-huge": JobSpec("bad-weight-huge", RESNET, 1000, priority_weight=1e12),
        "bad-steps": JobSpec("bad-steps", RESNET, 0),
        "bad-steps-huge": JobSpec("bad-steps-huge", RESNET, 10**15),
        "bad-scale": JobSpec("bad-scale", RESNET, 1000, scale_factor=0),
        "bad-entity": JobSpec("bad-entity", RESNET, 1000, entity=""),
        "bad id": JobSpec("bad id", RESNET, 1000),
        "bad-arrival": JobSpec("bad-arrival", RESNET, 1000),
    }
    # Not bad: a job type (or size) no table knows is scheduled from estimates, and the simulated
    # fleet runs it at a derived speed (sim/derived_rates.py: here the typical job's); 3 GPUs of one
    # type are not here: held.
    beyond_the_table = {
        "own-type": JobSpec("own-type", "GPT-7", 1000),
        "own-size": JobSpec("own-size", RESNET, 1000, scale_factor=3),
    }
    messages = [JobSubmitted(spec) for spec in (*bad_fields.values(), *beyond_the_table.values())]
    messages[len(bad_fields) - 1] = JobSubmitted(bad_fields["bad-arrival"], arrival_offset_s=-5.0)
    good_body = {"spec": {"job_id": "raw", "job_type": RESNET, "total_steps": 1000}}
    wrong_type = {"spec": {**good_body["spec"], "job_id": "raw-type", "total_steps": "1000"}}  # type: ignore[dict-item]
    not_finite = {"spec": {**good_body["spec"], "job_id": "raw-nan", "priority_weight": float("nan")}}  # type: ignore[dict-item]
    await rogue_publish(cluster, *messages, raw=(envelope(wrong_type), envelope(not_finite)))
    out = await gavel(cluster, "submit", "--job-type", "A3C", "--steps", "2000", "--job-id", "after", "--entity", "team-a")
    assert out.returncode == 0, out.stderr

    await until(lambda: completed(status, "before", "after"), timeout_s=90, poll_s=0.2)
    rows = await status.jobs()
    for job_id in bad_fields:
        assert rows[job_id]["state"] == "rejected", (job_id, rows.get(job_id))
    reasons = {job_id: str(rows[job_id]["reason"]) for job_id in bad_fields}
    assert reasons["bad-slo"] == "slo_s: must be > 0, got -10"
    assert reasons["bad-weight-huge"] == "priority_weight: must be <= 1000, got 1e+12"
    await until(lambda: completed(status, "own-type"), timeout_s=60, poll_s=0.2)
    own_size = (await status.jobs())["own-size"]
    assert own_size["state"] == "held"
    assert "needs 3 GPUs of one accelerator type" in str(own_size["reason"])
    assert reasons["bad id"] == "job_id: must be printable, without spaces, got 'bad id'"
    assert reasons["bad-arrival"] == "arrival_offset_s: must be >= 0, got -5"
    # wrong types and non-finite numbers never reach the mechanism: dead-lettered with the reason
    letters = await answer(cluster, "bus", "dead-letters")
    why = sorted(str(letter["reason"]) for letter in letters)  # type: ignore[union-attr]
    assert any("JobSubmitted.spec.total_steps: expected int, got str" in w for w in why), why
    assert any("priority_weight" in w and ("NaN" in w or "finite" in w) for w in why), why
    solve = (await status.ask("cluster"))["last_solve"]  # type: ignore[index]
    assert solve["status"] == "optimal" and solve["error"] == "", solve
    assert not logged(cluster.workdir / "mechanism.log", "allocation_failed")

    # a gang no accelerator type here can hold: held, with why, in `gavel job` and `gavel jobs`
    out = await gavel(cluster, "submit", "--job-type", RESNET, "--steps", "1000", "--scale-factor", "8", "--job-id", "gang")
    assert out.returncode == 0, out.stderr
    # said at once, not found later held for ever (issue 23)
    assert the_line(out.stderr).startswith(
        "gavel: job gang accepted, but the cluster as it is cannot run it: needs 8 GPUs of one accelerator type"
    ), out.stderr
    await until(lambda: held(status, "gang"), timeout_s=30, poll_s=0.1)
    held_reason = f"needs 8 GPUs of one accelerator type where {RESNET!r} runs (here: k80 2, p100 2, v100 2): it waits for workers to join"
    assert (await status.ask("job", "gang"))["reason"] == held_reason  # type: ignore[index]
    assert (await status.jobs())["gang"]["reason"] == held_reason
    table = (await gavel(cluster, "jobs")).stdout
    assert "held" in table and "it waits for workers to join" in table

    # cancels: the held gang at once; a running job when its round ends; an unknown id is refused
    out = await gavel(cluster, "cancel", "gang")
    assert out.returncode == 0 and out.stdout.strip() == "gang: cancelled", out.stderr
    out = await gavel(cluster, "submit", "--job-type", RESNET, "--steps", "100000000", "--job-id", "long")
    assert out.returncode == 0, out.stderr
    # running, with steps to keep: polled every 0.1 s, "running" alone can be seen before the
    # fleet has run any of its lease
    await until(lambda: running_with_steps(status, "long"), timeout_s=30, poll_s=0.1)
    steps_before = int((await status.jobs())["long"]["steps_done"])  # type: ignore[call-overload]
    out = await gavel(cluster, "cancel", "long", "--reason", "changed my mind")
    assert out.returncode == 0 and out.stdout.startswith("long: "), out.stderr
    await until(lambda: in_state(status, "long", "cancelled"), timeout_s=30, poll_s=0.1)
    row = (await status.jobs())["long"]
    assert row["reason"] == "changed my mind" and int(row["steps_done"]) >= steps_before > 0  # type: ignore[call-overload]
    out = await gavel(cluster, "cancel", "nope")
    assert out.returncode == 1 and the_line(out.stderr) == "gavel: no job 'nope'"
    out = await gavel(cluster, "cancel", "before")
    assert out.returncode == 1 and the_line(out.stderr) == "gavel: job 'before' has already completed: nothing to cancel"

    # placements name workers as `gavel workers` does
    placements = (await status.ask("job", "before"))["placements"]  # type: ignore[index]
    workers = {w["worker_id"] for w in await status.ask("workers")}  # type: ignore[union-attr]
    assert placements and all(set(p["workers"]) <= workers for p in placements), placements


@pytest.mark.slow  # ~5 s on 2 busy cores (load ~3), on the module's cluster: mostly the trace's spacing (1.8 s twice)
@pytest.mark.xdist_group("hardening-live")
async def test_a_trace_keeps_its_spacing_and_its_ids_are_never_dropped_without_a_word(live, live_status, tmp_path):
    """Arrivals count from when the mechanism receives the trace (--now: all at once); a second
    trace with the same ids gets ids of its own; the same trace again is absorbed and said so; a
    clashing id under --id-prefix '' is refused with what differs."""
    cluster, status = live, live_status
    await ready(status, 6)
    first = tmp_path / "first.jsonl"
    first.write_text("".join(
        json.dumps({"job_id": str(n), "job_type": "A3C", "total_steps": 1500, "arrival_time_s": 50_000.0 + 1800.0 * n}) + "\n"
        for n in range(3)
    ))
    out = await gavel(cluster, "submit", "--trace", str(first), "--json")
    assert out.returncode == 0, out.stderr
    submitted = json.loads(out.stdout)
    ids = submitted["job_ids"]
    assert submitted["new"] == 3 and submitted["known"] == 0 and submitted["refused"] == 0
    assert ids[0].startswith("first-") and ids[0].endswith("/0")
    rows = await status.jobs()
    arrivals = [float(rows[i]["arrival_s"]) for i in ids]  # type: ignore[arg-type]
    assert [a - arrivals[0] for a in arrivals] == pytest.approx([0.0, 1800.0, 3600.0])
    assert rows[ids[2]]["state"] == "submitted"  # its arrival is still 3,600 s (3.6 s) ahead
    await until(lambda: completed(status, *ids), timeout_s=90, poll_s=0.2)
    done = await status.jobs()
    assert all(float(done[i]["waiting_s"]) >= 0.0 for i in ids)  # type: ignore[arg-type]

    again = await gavel(cluster, "submit", "--trace", str(first))
    assert again.returncode == 0 and again.stdout.strip().endswith(": 0 new, 3 already known, 0 refused"), again.stdout

    second = tmp_path / "second.jsonl"  # Gavel numbers every trace's jobs from 0
    second.write_text("".join(
        json.dumps({"job_id": str(n), "job_type": RESNET, "total_steps": 1000, "arrival_time_s": 10.0 * n}) + "\n"
        for n in range(3)
    ))
    out = await gavel(cluster, "submit", "--trace", str(second), "--now", "--json")
    assert out.returncode == 0, out.stderr
    now_ids = json.loads(out.stdout)["job_ids"]
    assert json.loads(out.stdout)["new"] == 3 and not set(now_ids) & set(ids)
    rows = await status.jobs()
    assert len({float(rows[i]["arrival_s"]) for i in now_ids}) == 1  # type: ignore[arg-type]

    raw = await gavel(cluster, "submit", "--trace", str(first), "--id-prefix", "")
    assert raw.returncode == 0, raw.stderr
    clash = await gavel(cluster, "submit", "--trace", str(second), "--id-prefix", "")
    assert clash.returncode == 1
    assert clash.stdout.strip().endswith(": 0 new, 0 already known, 3 refused"), clash.stdout
    lines = [line for line in clash.stderr.splitlines() if not line.startswith("{")]
    assert lines[0] == (
        "gavel: job 0 refused: job id '0' is taken by another job (job_type 'ResNet-50 (batch size 64)' "
        "(was 'A3C'), total_steps 1000 (was 1500)); submit this one under another id"
    )


@pytest.mark.slow  # ~6-13 s on 2 busy cores: services as processes, the mechanism started twice
async def test_a_restart_under_another_policy_says_so_and_a_job_it_cannot_allocate_with_is_set_aside(cluster, status, tmp_path):
    """A job the policy refuses the problem for (an SLO no allocation can meet, whatever its
    fields) is rejected with the policy's reason; the rest is solved again and runs."""
    start_cluster(cluster, tmp_path)
    await ready(status, 6)
    assert (await gavel(cluster, "submit", "--job-type", "A3C", "--steps", "1000", "--job-id", "first")).returncode == 0
    await until(lambda: completed(status, "first"), timeout_s=60, poll_s=0.1)
    process = cluster.processes.pop("mechanism")
    process.terminate()
    process.wait(timeout=30)

    slo_policy = "max_sum_throughput_normalized_by_cost_perf_SLOs"
    cluster.start(
        "mechanism", "serve", "mechanism", "--policy", slo_policy, "--journal", str(tmp_path / "journal.sqlite"), *SCALE,
    )
    # the second host_ready (the log is appended to): every consumer of the restarted one attached
    await eventually(lambda: len(logged(tmp_path / "mechanism.log", "host_ready")) >= 2, timeout_s=30, poll_s=0.05)
    change = logged(tmp_path / "mechanism.log", "policy_changed")[0]
    assert (change["journal_policy"], change["policy"]) == ("max_min_fairness_perf", slo_policy)
    for args in (("--job-id", "hopeless", "--slo-s", "1"), ("--job-id", "fine", "--slo-s", "1000000")):
        out = await gavel(cluster, "submit", "--job-type", RESNET, "--steps", "2000", *args)
        assert out.returncode == 0, out.stderr
    await until(lambda: completed(status, "fine"), timeout_s=90, poll_s=0.2)
    rows = await status.jobs()
    assert rows["hopeless"]["state"] == "rejected"
    assert str(rows["hopeless"]["reason"]).startswith("the policy cannot allocate with this job: SLOs infeasible: job 'hopeless'")
    assert rows["first"]["state"] == "completed"  # kept across the restart


@pytest.mark.slow  # ~6-14 s on 2 busy cores: five process starts, one after the other
async def test_a_worker_on_another_clock_and_a_policy_queue_nobody_consumes_are_said_at_once(cluster, status, tmp_path):
    """The policy's queue declared and left with no consumer; a fleet on the wall clock, then one
    on the mechanism's."""
    log = tmp_path / "mechanism.log"
    cluster.start("policy", "serve", "policy", "--solving", "inline")
    await eventually(lambda: logged(tmp_path / "policy.log", "host_ready"), timeout_s=30, poll_s=0.05)
    cluster.kill("policy")  # its durable queue stays, with nobody consuming it
    cluster.start("mechanism", "serve", "mechanism", "--journal", str(tmp_path / "journal.sqlite"), *SCALE)
    cluster.start("fleet", "serve", "fleet", "--cluster", "v100=1,k80=1")  # wall clock: the mechanism's is scaled
    # host_ready: every consumer attached, the status requests' too (a worker can be refused first)
    await eventually(lambda: logged(log, "host_ready") and len(logged(log, "worker_refused")) >= 2, timeout_s=30, poll_s=0.05)
    refused = (await status.ask("cluster"))["workers_refused"]  # type: ignore[index]
    assert set(refused) == {"v100-0", "k80-0"}  # type: ignore[arg-type]
    assert "runs on the wall clock and this mechanism on the scaled x1000 clock" in refused["v100-0"]  # type: ignore[index]
    # where the user looks: `gavel workers` lists them refused, with why, and a job that waits for
    # workers says that some came and were turned away (issue 23: it looked like an empty cluster)
    workers = await answer(cluster, "workers")
    assert [(w["worker_id"], w["state"]) for w in workers] == [("k80-0", "refused"), ("v100-0", "refused")]  # type: ignore[index, union-attr]
    assert (await gavel(cluster, "submit", "--job-type", "A3C", "--steps", "1000", "--job-id", "early")).returncode == 0
    await until(lambda: held(status, "early"), timeout_s=20, poll_s=0.1)
    reason = str((await status.jobs())["early"]["reason"])
    assert "it waits for workers to join; 2 workers tried to join and were refused (`gavel workers`)" in reason, reason
    assert "runs on the wall clock and this mechanism on the scaled x1000 clock" in reason
    # and the fleet's own log says why it gets no work
    told = logged(tmp_path / "fleet.log", "worker_refused_by_mechanism")
    assert {e["worker_id"] for e in told} == {"v100-0", "k80-0"}, told

    cluster.kill("fleet")
    cluster.start("fleet", "serve", "fleet", "--cluster", "v100=1,k80=1", *SCALE)
    await ready(status, 2)
    assert (await gavel(cluster, "submit", "--job-type", "A3C", "--steps", "1000", "--job-id", "j")).returncode == 0
    await eventually(lambda: logged(log, "policy_service_missing"), timeout_s=20, poll_s=0.05)
    missing = logged(log, "policy_service_missing")[0]
    assert "no consumer" in str(missing["reason"])
    assert not logged(log, "allocation_unavailable")  # said before any timeout
    cluster.start("policy", "serve", "policy", "--solving", "inline")
    await until(lambda: completed(status, "j", "early"), timeout_s=120, poll_s=0.2)
