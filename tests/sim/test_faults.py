"""Faults as a test harness (issue 13): the spec, the seeded schedule, and runs of the real services
in virtual time under each fault kind, alone and mixed, that still finish every job."""

from __future__ import annotations

import collections
import json
import pathlib
import shutil

import numpy as np
import pytest

from common.bus import Delivery
from common.errors import FaultSpecError
from common.messages import JobCompleted, JobFailed
from mechanism_service.core.settings import preset
from policy_service.service import shipped_context
from services.cli import main
from sim.driver import simulate_services
from sim.fastpath import RunConfig
from sim.faults import (
    CRASH_POINTS,
    FaultSpec,
    Timing,
    horizon_s,
    parse_spec,
    replay_command,
    schedule,
    timing_for,
)
from sim.traces import TraceSpec, generate_trace

CONTEXT = shipped_context()
POLICY = "max_min_fairness_perf"
CLUSTER = {"v100": 3, "p100": 3, "k80": 3}
# Long rounds: a fifth of the default round count for the same trace, so each run takes a second.
TRACE = generate_trace(TraceSpec(num_jobs=36, jobs_per_hour=4.0), CONTEXT.table, np.random.default_rng(5))
CONFIG = RunConfig(POLICY, CLUSTER, preset("default", POLICY, round_s=1800.0), seed=1)
WORKERS = [f"{w}-{i}" for w in ("k80", "p100", "v100") for i in range(3)]


# -- the spec -------------------------------------------------------------------------------------


def test_a_spec_names_counts_and_rates():
    spec = parse_spec("worker-crash=2, hang=1,slow-gpu=1,job-crash=3,dup=0.05,reorder=0.1:6,delay=0.02:12,loss=0.02,"
                      "mechanism-crash=2,policy-crash=1")
    assert spec == FaultSpec(
        worker_crash=2, hang=1, slow_gpu=1, job_crash=3, mechanism_crash=2, policy_crash=1, dup=0.05, loss=0.02,
        delay=0.02, max_delay_s=12.0, reorder=0.1, reorder_window=6, text=spec.text,
    )
    assert spec.messages and not spec.empty


def test_mix_is_every_kind_and_later_items_override_it():
    mix = parse_spec("mix")
    assert all(mix.counts.values()) and all(mix.rates.values())
    assert parse_spec("all").counts == mix.counts
    tuned = parse_spec("mix,dup=0,hang=5")
    assert (tuned.dup, tuned.hang, tuned.loss) == (0.0, 5, mix.loss)
    assert parse_spec("none").empty and parse_spec("none").text == "none"


@pytest.mark.parametrize(
    ("text", "token", "says"),
    [
        ("worker-crash=2,bogus=1", "bogus=1", "unknown fault kind 'bogus'"),
        ("hang", "hang", "expected kind=value"),
        ("hang=", "hang=", "expected kind=value"),
        ("hang=two", "hang=two", "'two' is not a whole number"),
        ("hang=-1", "hang=-1", "out of range"),
        ("dup=1.5", "dup=1.5", "not a probability in [0, 1]"),
        ("loss=nan", "loss=nan", "not a probability"),
        ("dup=0.1:3", "dup=0.1:3", "takes a probability only"),
        ("reorder=0.1:0", "reorder=0.1:0", "out of range 1.."),
        ("delay=0.1:-2", "delay=0.1:-2", "must be positive"),
        ("  ", "  ", "empty"),
    ],
)
def test_a_bad_spec_names_its_bad_token(text, token, says):
    with pytest.raises(FaultSpecError) as caught:
        parse_spec(text)
    assert caught.value.token == token
    assert says in str(caught.value) and str(caught.value).startswith("--faults: ")


# -- the schedule ---------------------------------------------------------------------------------


def _schedule(seed: int, spec: str = "mix"):
    return schedule(
        parse_spec(spec), np.random.default_rng(seed), seed=seed, horizon_s=1e6, worker_ids=WORKERS,
        timing=Timing(heartbeat_s=900.0, worker_grace_s=2700.0),
    )


def test_the_same_seed_makes_the_same_schedule_and_another_seed_another():
    assert _schedule(7) == _schedule(7)
    assert _schedule(7) != _schedule(8)
    s = _schedule(7)
    assert s.scheduled == parse_spec("mix").counts
    assert all(5e4 <= e.at_s <= 8e5 for e in (*s.worker_crashes, *s.hangs, *s.job_crashes, *s.mechanism_crashes))
    assert all(c.down_s > 2700.0 for c in s.worker_crashes)  # declared lost before it comes back
    assert {c.point for c in _schedule(3, "mechanism-crash=40").mechanism_crashes} == set(CRASH_POINTS)
    assert all(0 < slow.factor < 1 for slow in s.slow_gpus)



def test_the_faults_are_quiet_once_the_last_worker_is_back():
    from sim.faults import FaultSchedule, JobCrash, WorkerCrash, WorkerHang

    timing = Timing(heartbeat_s=1.0, worker_grace_s=3.0)
    s = FaultSchedule(
        parse_spec("worker-crash=1,hang=1,job-crash=1"), 0, 100.0, timing,
        worker_crashes=(WorkerCrash(10.0, "k80-0", 40.0),), hangs=(WorkerHang(20.0, "k80-1", 5.0),),
        job_crashes=(JobCrash(60.0, 0.5),),
    )
    assert s.quiet_from_s == 60.0  # the job crash, after the worker came back at 50 s
    assert FaultSchedule(parse_spec("dup=0.1"), 0, 100.0, timing).quiet_from_s == 0.0


def test_the_horizon_is_a_lower_bound_of_the_run():
    # two jobs of 3600 GPU-seconds each (one on two GPUs) on 2 GPUs, the last arriving at 100 s
    assert horizon_s([(0.0, 3600, 1, 1.0), (100.0, 900, 2, 0.5)], gpus=2) == 3600.0
    assert horizon_s([(5000.0, 10, 1, 1.0)], gpus=2) == 5000.0
    assert timing_for(360.0) == Timing(heartbeat_s=180.0, worker_grace_s=540.0)


def test_the_replay_command_names_the_spec_and_the_seed():
    assert replay_command(parse_spec("hang=1,dup=0.1"), 42, "--jobs 10") == (
        "gavel simulate --engine services --faults hang=1,dup=0.1 --fault-seed 42 --jobs 10"
    )


# -- runs -----------------------------------------------------------------------------------------


class EndWatch:
    """Every job.completed and job.failed on the bus, by message id (a restarted mechanism's
    repeat of an end event carries the same id)."""

    name = "end-watch"

    def __init__(self) -> None:
        self.ends: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)  # job -> (kind, message id)

    async def start(self, bus) -> None:  # noqa: ANN001
        await bus.subscribe(self.name, [JobCompleted.ROUTING_KEY, JobFailed.ROUTING_KEY], self.seen)

    async def stop(self) -> None:
        return None

    async def seen(self, d: Delivery) -> None:
        self.ends[d.message.job_id].append((type(d.message).__name__, d.envelope.message_id))


def run(spec: str, seed: int = 0, **kwargs):
    import asyncio

    return asyncio.run(simulate_services(TRACE, CONFIG, CONTEXT, faults=parse_spec(spec), fault_seed=seed, **kwargs))


def assert_every_job_ended(result, *, completed: bool = True) -> None:
    ended = {j.job_id for j in result.jobs if j.completion_s is not None or j.dropped}
    assert ended == {j.job_id for j in TRACE}
    if completed:
        assert all(j.completion_s is not None and j.steps_done == j.total_steps for j in result.jobs)


def assert_no_gpu_held_twice(occupancy) -> None:
    by_gpu = collections.defaultdict(list)
    for o in occupancy:
        assert o.start_s <= o.end_s
        by_gpu[(o.worker_id, o.gpu_index)].append((o.start_s, o.end_s, o.lease_id))
    for spans in by_gpu.values():
        spans.sort()
        for (_, end_s, lease), (start_s, _, other) in zip(spans, spans[1:]):
            assert end_s <= start_s, f"{lease} and {other} overlap"


@pytest.mark.parametrize(
    ("spec", "kind"),
    [
        ("worker-crash=2", "worker-crash"),
        ("hang=2", "hang"),
        ("slow-gpu=2", "slow-gpu"),
        ("job-crash=3", "job-crash"),
        ("policy-crash=2", "policy-crash"),
        ("dup=0.05", "dup"),
        ("reorder=0.05:4", "reorder"),
        ("delay=0.05:60", "delay"),
        ("loss=0.05", "loss"),
    ],
)
def test_each_fault_kind_happens_and_every_job_still_completes(spec, kind):
    result = run(spec, seed=2)
    report = result.faults
    assert report is not None and report.spec == spec and report.seed == 2
    assert report.injected[kind] >= 1
    assert sum(report.injected.values()) == report.injected[kind]  # that kind alone
    assert_every_job_ended(result)
    assert report.dead_letters == ()  # every fault was absorbed, none made a bad message
    assert report.occupancy and {o.ended for o in report.occupancy} >= {"reported"}
    assert_no_gpu_held_twice(report.occupancy)
    if kind == "policy-crash":  # each request it died on was redelivered to its successor
        assert report.policy_restarts == report.policy_redeliveries == report.injected[kind]
    if kind == "job-crash":
        assert "crashed" in {o.ended for o in report.occupancy}
    if kind == "worker-crash":  # the workers' own account shows the leases the crash cut short
        assert "worker-crash" in {o.ended for o in report.occupancy}
    if kind == "hang":  # one of this seed's hangs outlasts the grace: declared lost, fenced, it stopped its lease
        assert "fenced" in {o.ended for o in report.occupancy}


def test_gangs_across_servers_survive_their_workers_crashing_and_hanging():
    """A gang spread over servers of two GPUs: a member that dies ends the gang (its lead reports it
    crashed, or the mechanism kills the rest when it declares the member lost); every job completes
    and no GPU holds two leases at once, as the workers saw it."""
    import asyncio

    trace = generate_trace(TraceSpec(num_jobs=24, jobs_per_hour=4.0, multi_gpu=True), CONTEXT.table, np.random.default_rng(1))
    config = RunConfig(
        POLICY, {"v100": 8, "p100": 4, "k80": 4}, preset("default", POLICY, gpus_per_server=2, round_s=1800.0), seed=3
    )
    result = asyncio.run(
        simulate_services(trace, config, CONTEXT, faults=parse_spec("worker-crash=3,hang=3,job-crash=3"), fault_seed=1)
    )
    report = result.faults
    assert report is not None and report.injected["worker-crash"] == report.injected["hang"] == 3
    assert all(j.completion_s is not None and j.steps_done == j.total_steps for j in result.jobs)
    assert any(j.scale_factor > 1 for j in trace)
    ended = collections.Counter(o.ended for o in report.occupancy)
    assert ended["killed"] and ended["worker-crash"] and ended["fenced"] and ended["crashed"]
    assert_no_gpu_held_twice(report.occupancy)


def test_a_gang_that_arrives_while_workers_are_lost_waits_for_them_instead_of_being_refused():
    """Seed 4 loses enough v100 servers that job 19 (8 GPUs) arrives when only 6 are left: the
    mechanism holds it until they are back (it refused it as if the cluster had shrunk for good)."""
    import asyncio

    trace = generate_trace(TraceSpec(num_jobs=30, jobs_per_hour=4.0, multi_gpu=True), CONTEXT.table, np.random.default_rng(4))
    config = RunConfig(
        POLICY, {"v100": 8, "p100": 4, "k80": 4}, preset("default", POLICY, gpus_per_server=2, round_s=1800.0), seed=3
    )
    result = asyncio.run(simulate_services(trace, config, CONTEXT, faults=parse_spec("worker-crash=6,hang=6"), fault_seed=4))
    assert next(j for j in trace if j.job_id == "19").scale_factor == 8
    assert result.rejected_job_ids == ()
    assert all(j.completion_s is not None for j in result.jobs) and len(result.jobs) == 30


@pytest.mark.slow  # ~4-7 s: runs with mechanism crashes
def test_a_crashed_and_restarted_mechanism_completes_every_job_exactly_once(tmp_path):
    """Both crash points; a new mechanism recovers from the same journal each time. Each job ends
    once (repeats of its end event carry the same message id), and the schedule is the one
    without crashes, job by job."""
    import asyncio

    from common.journal import Journal

    watch = EndWatch()
    journal = Journal(tmp_path / "mechanism.sqlite")
    spec = "mechanism-crash=3"
    points = {c.point for c in schedule(
        parse_spec(spec), np.random.default_rng(4), seed=4, horizon_s=1e6, worker_ids=WORKERS, timing=timing_for(1800.0)
    ).mechanism_crashes}
    assert points == set(CRASH_POINTS)  # this seed crashes at both
    crashed = asyncio.run(
        simulate_services(TRACE, CONFIG, CONTEXT, faults=parse_spec(spec), fault_seed=4, journal=journal, observers=[watch])
    )
    assert crashed.faults is not None
    assert crashed.faults.injected["mechanism-crash"] == crashed.faults.mechanism_restarts == 3
    assert crashed.faults.journal_path == str(tmp_path / "mechanism.sqlite")
    # checked over the journal, the workers' occupancy and the dead letters (I5 needs a bound)
    assert (crashed.faults.invariants_checked, crashed.faults.violations) == (("I1", "I2", "I3", "I4", "I6"), ())
    assert_every_job_ended(crashed)
    assert set(watch.ends) == {j.job_id for j in TRACE}
    for job_id, ends in watch.ends.items():
        assert {kind for kind, _ in ends} == {"JobCompleted"}, job_id
        assert len({message_id for _, message_id in ends}) == 1, job_id  # one event, perhaps repeated
    calm = asyncio.run(simulate_services(TRACE, CONFIG, CONTEXT))
    assert [(j.job_id, j.completion_s, j.steps_done) for j in crashed.jobs] == [
        (j.job_id, j.completion_s, j.steps_done) for j in calm.jobs
    ]


@pytest.mark.slow  # ~5-9 s: a run with every fault, and its replay
def test_a_mix_of_every_kind_finishes_and_replays_to_the_bit(tmp_path):
    from common.journal import Journal

    first = run("mix", seed=11, journal=Journal(tmp_path / "first.sqlite"))
    second = run("mix", seed=11)  # its journal made for the mechanism's crashes, in a temporary directory
    report = first.faults
    assert report is not None and second.faults is not None
    assert all(report.injected[kind] >= 1 for kind in ("dup", "loss", "delay", "reorder", "mechanism-crash", "policy-crash"))
    assert second.faults.journal_path is not None and second.faults.journal_path != report.journal_path
    shutil.rmtree(pathlib.Path(second.faults.journal_path).parent)
    assert (report.invariants_checked, report.violations) == (("I1", "I2", "I3", "I4", "I6"), ())
    assert_every_job_ended(first, completed=False)  # a job crashing five leases in a row may fail
    assert_no_gpu_held_twice(report.occupancy)
    assert report.dead_letters == ()
    assert second.faults.events == report.events and second.faults.occupancy == report.occupancy
    assert [(j.job_id, j.completion_s) for j in second.jobs] == [(j.job_id, j.completion_s) for j in first.jobs]


def test_no_faults_is_the_plain_run():
    import asyncio

    plain = asyncio.run(simulate_services(TRACE, CONFIG, CONTEXT))
    empty = asyncio.run(simulate_services(TRACE, CONFIG, CONTEXT, faults=parse_spec("none")))
    assert plain.faults is None and empty.faults is None
    assert (plain.jobs, plain.rounds, plain.makespan_s) == (empty.jobs, empty.rounds, empty.makespan_s)


# -- the command ------------------------------------------------------------------------------------


@pytest.mark.slow  # ~4-7 s: gavel simulate --faults
def test_gavel_simulate_faults_reports_them_and_how_to_replay(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["simulate", "--jobs", "12", "--jobs-per-hour", "4", "--cluster", "v100=2,p100=2,k80=2", "--policy", POLICY,
            "--round-s", "1800", "--no-plots", "--out", str(out)]
    assert main([*args, "--faults", "worker-crash=1,dup=0.05", "--fault-seed", "3", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    faults = printed["faults"]
    assert (faults["spec"], faults["seed"]) == ("worker-crash=1,dup=0.05", 3)
    assert faults["injected"]["worker-crash"] == 1 and faults["injected"]["dup"] >= 1
    assert faults["invariants_checked"] is None  # no journal (no mechanism crash): nothing to check them over
    assert json.loads((out / "faults.json").read_text())["injected"] == faults["injected"]
    assert (out / "gpu_occupancy.csv").read_text().startswith("worker_id,gpu_index,lease_id,round_id,start_s,end_s,ended")

    assert main([*args, "--faults", "hang=1", "--fault-seed", "3"]) == 0
    text = capsys.readouterr().out
    assert "faults injected: hang 1" in text
    assert "replay: gavel simulate --engine services --faults hang=1 --fault-seed 3 --jobs 12" in text

    crashed = tmp_path / "crashed"
    assert main([*args[:-1], str(crashed), "--faults", "mechanism-crash=1", "--json"]) == 0
    faults = json.loads(capsys.readouterr().out)["faults"]
    assert faults["mechanism_restarts"] == 1 and faults["journal"] == str(crashed / f"mechanism-{POLICY}.sqlite")
    assert faults["invariants_checked"] == ["I1", "I2", "I3", "I4", "I6"] and faults["violations"] == []

    calm = tmp_path / "calm"
    assert main([*args[:-1], str(calm), "--faults", "none"]) == 0  # the services engine, nothing injected
    assert "services engine" in capsys.readouterr().out
    assert (calm / "summary.json").exists() and not (calm / "faults.json").exists()


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--faults", "mix", "--engine", "fast"], "--faults: needs --engine services"),
        (["--faults", "hang=x"], "--faults: 'hang=x': 'x' is not a whole number"),
        (["--fault-seed", "3"], "--fault-seed: needs --faults"),
    ],
)
def test_gavel_simulate_refuses_bad_fault_flags_in_one_line(tmp_path, capsys, extra, says):
    code = main(["simulate", "--jobs", "5", "--static", "--cluster", "v100=1", "--policy", "fifo", "--no-plots",
                 "--out", str(tmp_path / "x"), *extra])
    err = capsys.readouterr().err
    assert code == 2
    assert says in err and len(err.strip().splitlines()) == 1


# -- the bus ---------------------------------------------------------------------------------------


async def test_the_faulty_bus_keeps_each_publishers_order_and_loses_only_what_may_be_lost():
    """reorder: other publishers overtake a held message, never the publisher's own later ones;
    loss and delay: heartbeats only (a report is never lost); dup: the same message id twice."""
    import random

    from common.messages import JobProgress, WorkerHeartbeat
    from common.transport.memory import InMemoryBroker, InMemoryBus
    from sim.clock import VirtualClock
    from sim.fault_bus import FaultyBus
    from sim.faults import FaultLog

    broker = InMemoryBroker()
    clock = VirtualClock(broker)
    log = FaultLog()
    spec = parse_spec("reorder=0.3:3,dup=0.2,loss=0.3,delay=0.2:5")
    bus = FaultyBus(InMemoryBus(broker, clock=clock), clock=clock, spec=spec, rng=random.Random(1), log=log)
    await bus.start()
    seen: list[tuple[str, int, str]] = []  # (publisher, its sequence number, message id)

    async def record(d: Delivery) -> None:
        m = d.message
        seen.append((d.envelope.source, m.steps_done if isinstance(m, JobProgress) else -1 - int(m.worker_id), d.envelope.message_id))

    await bus.subscribe("observer", ["job.progress", "worker.heartbeat"], record, prefetch=1)
    for i in range(200):
        for publisher in ("a", "b"):
            await bus.publish(JobProgress(str(i), "w", "l", 0, i, 1.0, 1.0), source=publisher)
        await bus.publish(WorkerHeartbeat(str(i)), source="c", mandatory=False)

    def all_in() -> bool:  # every report, and every heartbeat not lost (the delayed ones late)
        arrived = collections.Counter(source for source, _, _ in {(s, n, "") for s, n, _ in seen})
        return arrived["a"] == arrived["b"] == 200 and arrived["c"] + log.counts()["loss"] == 200

    await clock.run_until(all_in)

    counts = log.counts()
    assert all(counts[k] > 0 for k in ("reorder", "dup", "loss", "delay"))
    for publisher in ("a", "b"):
        numbers = [n for source, n, _ in seen if source == publisher]
        first_copies = list(dict.fromkeys(numbers))
        assert first_copies == list(range(200))  # every report arrived, in its publisher's order
    arrival = {key: k for k, key in reversed(list(enumerate((source, n) for source, n, _ in seen)))}  # first copies
    assert any(arrival[("b", i)] < arrival[("a", i)] for i in range(200))  # a's i-th, published first, was overtaken
    beats = {n for source, n, _ in seen if source == "c"}
    assert 0 < len(beats) < 200  # some heartbeats lost
    ids = [message_id for _, _, message_id in seen]
    assert len(ids) - len(set(ids)) == counts["dup"]  # each duplicate carries its original's id
    await bus.close()
