"""Real workers over RabbitMQ, every service its own process (issue 10): the policy service, the
estimator, the mechanism on the wall clock with 15 s rounds, and two real workers of different
types ("v100" at full speed, "k80" emulated at half speed), sharing a checkpoint directory.

Submitted: catalog jobs (one of them a 2-rank gloo gang), the example script of docs/worker.md,
a script that always fails and one that is fixed after its first failure. One worker is SIGKILLed
while it holds a lease. Checked:
- every good job completes with exactly its steps, and its final checkpoint is that step;
- single-GPU catalog jobs end with the very parameters of an uninterrupted run by hand, although
  they were stopped, moved and resumed (each resumes from its checkpoint, data position and random
  state included), and at least one of them moved between workers;
- the worker is killed once a job there has stepped past its checkpoint; it is declared lost for
  a silence longer than its grace, shows as lost in `gavel workers`, and its jobs finish on the
  other worker;
- no job ran in two leases of one round; a packed pair and the gang ran;
- the failing script ends as failed after 3 attempts with its error in `gavel job`; the fixed one
  recovers at the next attempt.

Costs 57-81 s wall and 75-93 s of CPU on 2 cores at load 3-6, depending on how the rounds fall
(the same way, 110-136 s and 108-114 s before the jobs were submitted together, in this process,
before the workers joined, the uninterrupted runs made in this process while the cluster works,
and the steps cut to what the events need; torch processes start in ~3 s each and share the
cores). The rounds stay 15 s: a job's start-up takes 7-14 s under load,
and at 10 s a packed lease whose partner did no step was common (its steps are not credited,
mechanism_service/core/settle.py, and the job resumed from an older checkpoint than credited:
it ended short of its steps).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from common.bus import Delivery
from common.config import BusSettings
from common.messages import JobCompleted, JobFailed, JobProgress, RoundStarted
from common.transport.rabbit import RabbitBus
from tests.support.asking import run_here
from tests.support.broker import delete_topology
from tests.support.processes import ROOT, Cluster, logged
from tests.support.waiting import eventually

pytestmark = pytest.mark.broker

ROUND_S = "15"
GRACE_S = 8.0
ATTEMPTS = "3"
COUNTER = f"{sys.executable} {ROOT / 'tests/support/jobs/counter.py'}"
# job id -> (job type, steps, extra submit flags)
CATALOG = {
    "a3c": ("A3C", 120, ()),
    "lm": ("LM (batch size 5)", 180, ()),
    "rec": ("Recommendation (batch size 512)", 120, ()),
}
GANG = ("gang", "LM (batch size 5)", 20)
EXAMPLE = ("example", "ResNet-18 (batch size 32)", 300)
FIXED_STEPS = 150


class Observer:
    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.completed: dict[str, JobCompleted] = {}
        self.failed: dict[str, JobFailed] = {}
        self.progress: list[JobProgress] = []
        self.rounds: dict[int, RoundStarted] = {}

    async def __call__(self, d: Delivery) -> None:
        if d.envelope.message_id in self.seen:
            return
        self.seen.add(d.envelope.message_id)
        m = d.message
        if isinstance(m, JobCompleted):
            self.completed[m.job_id] = m
        elif isinstance(m, JobFailed):
            self.failed[m.job_id] = m
        elif isinstance(m, JobProgress):
            self.progress.append(m)
        elif isinstance(m, RoundStarted):
            self.rounds[m.round_id] = m


@pytest.fixture
async def observer(cluster: Cluster) -> AsyncIterator[Observer]:
    bus = RabbitBus(BusSettings(kind="amqp", amqp_url=cluster.url, exchange=cluster.exchange), source="observer")
    await bus.start()
    seen = Observer()
    keys = [JobCompleted.ROUTING_KEY, JobFailed.ROUTING_KEY, JobProgress.ROUTING_KEY, RoundStarted.ROUTING_KEY]
    await bus.subscribe("observer", keys, seen, durable=False)
    try:
        yield seen
    finally:
        await bus.close()
        await delete_topology(cluster.url, cluster.exchange, ("worker.v100-a", "worker.k80-a"))


def run_dir(cluster: Cluster, worker_id: str) -> Path:
    """A worker's own files (--run-dir): its jobs' lease and progress files."""
    return cluster.workdir / f"run-{worker_id}"


def start_services(cluster: Cluster) -> None:
    cluster.start("policy", "serve", "policy")
    cluster.start("estimator", "serve", "estimator")
    cluster.start(
        "mechanism", "serve", "mechanism", "--policy", "max_min_fairness_packed", "--round-s", ROUND_S,
        "--worker-grace-s", str(GRACE_S), "--max-failed-attempts", ATTEMPTS,
    )


def start_workers(cluster: Cluster, ckpt: Path) -> None:
    common = ("--gpus", "2", "--checkpoint-dir", str(ckpt), "--heartbeat-s", "1", "--kill-grace-s", "20")
    cluster.start(
        "worker-v100", "serve", "worker", "--type", "v100", "--worker-id", "v100-a", "--run-dir", str(run_dir(cluster, "v100-a")),
        *common,
    )
    cluster.start(
        "worker-k80", "serve", "worker", "--type", "k80", "--worker-id", "k80-a", "--run-dir", str(run_dir(cluster, "k80-a")),
        "--emulate-speed", "0.5", *common,
    )


def worker_states(cluster: Cluster) -> dict[str, str]:
    done = cluster.gavel("workers", "--json")
    if done.returncode != 0:
        return {}
    body = json.loads(done.stdout)
    rows = body if isinstance(body, list) else body["workers"]
    return {w["worker_id"]: w.get("state", "up") for w in rows}


def stepped_in_lease(cluster: Cluster, worker_id: str, lease_ids: set[str]) -> bool:
    """A job of ``worker_id`` has stepped in one of ``lease_ids`` (its progress file says so; a
    running job rewrites it every second): steps its last checkpoint does not hold."""
    for path in run_dir(cluster, worker_id).glob("*/rank*.progress.json"):
        try:
            progress = json.loads(path.read_text())
        except (OSError, ValueError):  # not written yet
            continue
        if progress.get("lease_id") in lease_ids and progress.get("state") == "running" and progress.get("lease_steps", 0) > 0:
            return True
    return False


def processes_of(worker_id: str) -> list[int]:
    """Pids of the job processes a worker started (they carry GAVEL_WORKER_ID)."""
    marker = f"GAVEL_WORKER_ID={worker_id}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def by_hand(where: Path) -> dict[str, Path]:
    """Each single-GPU catalog job trained without interruption, by hand (the runner's ``main``, as
    ``python -m worker_service.workloads`` runs it, here in a thread of this process while the
    cluster runs: three torch start-ups fewer): its final checkpoint. One torch thread, as a
    worker's jobs have (OMP_NUM_THREADS=1 and GAVEL_NUM_THREADS=1): the same reductions, the same
    bits (tests/unit/test_workload_runner.py compares a run in this process with a subprocess's)."""
    import torch

    from worker_service.workloads.runner import main

    threads = torch.get_num_threads()
    try:
        finals = {}
        for job_id, (job_type, steps, _) in CATALOG.items():
            argv = ["--job-type", job_type, "--steps", str(steps), "--checkpoint-dir", str(where / job_id), "--log-every-s", "0"]
            assert main(argv, {"GAVEL_NUM_THREADS": "1"}) == 0, job_id
            finals[job_id] = where / job_id / f"step-{steps}" / "state.pt"
        return finals
    finally:
        torch.set_num_threads(threads)


def same_parameters(a: Path, b: Path) -> bool:
    import torch

    left, right = torch.load(a, weights_only=False), torch.load(b, weights_only=False)
    return _equal(left["model"] if "model" in left else left, right["model"] if "model" in right else right)


def _equal(x: object, y: object) -> bool:
    import torch

    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and torch.equal(x, y)
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(_equal(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return isinstance(y, (list, tuple)) and len(x) == len(y) and all(_equal(a, b) for a, b in zip(x, y))
    return x == y


def submissions(flag: Path) -> list[tuple[str, ...]]:
    """The `gavel submit` commands of the test's jobs."""
    catalog = [("--job-type", job_type, "--steps", str(steps), "--job-id", job_id, *extra) for job_id, (job_type, steps, extra) in CATALOG.items()]
    return [
        *(("submit", *args) for args in catalog),
        ("submit", "--job-type", GANG[1], "--steps", str(GANG[2]), "--scale-factor", "2", "--job-id", GANG[0]),
        (
            "submit", "--job-type", EXAMPLE[1], "--steps", str(EXAMPLE[2]), "--job-id", EXAMPLE[0],
            "--command", "python train.py --lr 0.05", "--working-dir", str(ROOT / "docs" / "examples"),
        ),
        ("submit", "--job-type", "A3C", "--steps", "50", "--job-id", "broken", "--command", f"{COUNTER} --fail"),
        (
            "submit", "--job-type", "A3C", "--steps", str(FIXED_STEPS), "--job-id", "fixed",
            "--command", f"cd {ROOT} && {COUNTER} --step-s 0.02 --fail-unless {flag}",  # compound: behind a shell
        ),
    ]


@pytest.mark.slow  # ~60-80 s, 75-93 s of CPU: real PyTorch jobs over 15 s rounds, a worker lost and its grace
async def test_real_jobs_train_move_survive_a_lost_worker_and_fail_honestly(
    cluster: Cluster, observer: Observer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = tmp_path / "ckpt"
    flag = tmp_path / "fixed.flag"
    start_services(cluster)
    # Every job submitted at once as soon as the mechanism listens, and the workers started then:
    # the first round has them all (with the workers up first, it starts as the first job
    # arrives, with that one alone).
    await eventually(lambda: logged(cluster.workdir / "mechanism.log", "service_started"), 90, poll_s=0.2)
    # in this process (tests/support/asking.py): a `gavel` process would cost ~0.5 s of CPU each
    codes = await asyncio.gather(*(run_here(cluster, *command) for command in submissions(flag)))
    assert codes == [0] * len(codes), codes
    start_workers(cluster, ckpt)
    # The uninterrupted runs to compare with, meanwhile (by hand: no worker's variables), once a
    # lease has stepped: not beside the first round's start-ups (a start-up longer than a lease
    # leaves a packed partner without a step, see above).
    for name in [k for k in os.environ if k.startswith("GAVEL_") or k in ("RANK", "WORLD_SIZE")]:
        monkeypatch.delenv(name)

    async def references() -> dict[str, Path]:
        await eventually(lambda: any(p.steps_done > 0 for p in observer.progress), 300, poll_s=0.2)
        return await asyncio.to_thread(by_hand, tmp_path / "by-hand")

    uninterrupted = asyncio.ensure_future(references())

    def joined() -> set[object]:
        return {e["worker_id"] for e in logged(cluster.workdir / "mechanism.log", "worker_joined")}

    await eventually(lambda: joined() == {"v100-a", "k80-a"}, 90, poll_s=0.2)  # the log first: a `gavel workers` costs a process
    await eventually(lambda: set(worker_states(cluster)) == {"v100-a", "k80-a"}, 30, poll_s=0.5)

    # The fixed script: mend it once its first attempt has crashed.
    def crashed(job_id: str) -> bool:
        return any(p.job_id == job_id and p.outcome == "crashed" for p in observer.progress)

    await eventually(lambda: crashed("fixed"), 120, poll_s=0.2)
    flag.write_text("fixed")

    # SIGKILL the k80 worker while it holds a lease, once a job there has checkpointed a lease.
    def k80_mid_lease() -> bool:
        if not any(p.worker_id == "k80-a" and p.steps_done > 0 and p.outcome == "lease_end" for p in observer.progress):
            return False
        latest = observer.rounds.get(max(observer.rounds, default=-1))
        return latest is not None and any(a.worker_id == "k80-a" for a in latest.assignments)

    await eventually(k80_mid_lease, 180, poll_s=0.2)

    # into the lease: a job there has stepped past its checkpoint in the round's lease (steps the
    # kill will lose)
    def k80_stepped_in_its_lease() -> bool:
        latest = observer.rounds[max(observer.rounds)]
        return stepped_in_lease(cluster, "k80-a", {a.lease_id for a in latest.assignments if a.worker_id == "k80-a"})

    await eventually(k80_stepped_in_its_lease, 60, poll_s=0.2)
    assert processes_of("k80-a"), "the k80 worker runs no job: nothing to lose"
    cluster.kill("worker-k80")
    # its job processes die with it (nothing keeps running on its GPUs, behind a shell or not)
    await eventually(lambda: not processes_of("k80-a"), 10, poll_s=0.2)

    # lost for its silence, once that was longer than the grace (how soon after is the watchdog's
    # rule, held in virtual time by tests/unit/mechanism/test_liveness.py; no wall time asserted)
    def lost_logged() -> list[dict[str, object]]:
        return [e for e in logged(cluster.workdir / "mechanism.log", "worker_lost") if e["worker_id"] == "k80-a"]

    await eventually(lost_logged, GRACE_S + 30, poll_s=0.2)  # the log first: a `gavel workers` costs a process
    await eventually(lambda: worker_states(cluster).get("k80-a") == "lost", 30, poll_s=0.5)
    lost = lost_logged()
    silence = re.fullmatch(rf"no heartbeat for ([0-9.]+) s \(grace {GRACE_S:g} s\)", str(lost[-1]["reason"]))
    assert silence is not None and float(silence.group(1)) >= GRACE_S, lost  # (the reason rounds to 0.1 s)

    good = [*CATALOG, GANG[0], EXAMPLE[0], "fixed"]
    await eventually(lambda: set(good) <= set(observer.completed) and "broken" in observer.failed, 420, poll_s=0.2)

    # exactly its steps, and the last checkpoint is that step
    totals = {**{j: s for j, (_, s, _) in CATALOG.items()}, GANG[0]: GANG[2], EXAMPLE[0]: EXAMPLE[2], "fixed": FIXED_STEPS}
    for job_id, total in totals.items():
        assert observer.completed[job_id].steps_done == total, job_id
        assert (ckpt / job_id / f"step-{total}").is_dir(), (job_id, sorted(p.name for p in (ckpt / job_id).iterdir()))

    # resumed exactly: the parameters of an uninterrupted run
    references = await uninterrupted
    for job_id, (_, steps, _) in CATALOG.items():
        assert same_parameters(ckpt / job_id / f"step-{steps}" / "state.pt", references[job_id]), job_id

    # at least one job moved between workers, resuming from a checkpoint another worker wrote
    workers_of = defaultdict(set)
    for p in observer.progress:
        if p.steps_done > 0:
            workers_of[p.job_id].add(p.worker_id)
    moved = [j for j in totals if len(workers_of[j]) > 1]
    assert moved, dict(workers_of)

    # nothing ran twice in one round
    for round_id, started in observer.rounds.items():
        leases_of = defaultdict(set)
        for a in started.assignments:
            for job_id in a.job_ids:
                leases_of[job_id].add(a.lease_id)
        assert all(len(v) == 1 for v in leases_of.values()), (round_id, dict(leases_of))
    # a packed pair and the gang ran (the gang on two GPUs, one lease, reported once per round)
    assert any(len(a.job_ids) == 2 for r in observer.rounds.values() for a in r.assignments)
    assert any(p.job_id == GANG[0] and p.steps_done > 0 for p in observer.progress)

    # the lost worker is listed as lost; its jobs finished elsewhere
    assert worker_states(cluster)["k80-a"] == "lost"

    # the broken script failed after 3 attempts, with its error; the fixed one recovered
    assert "failed 3 times in a row" in observer.failed["broken"].reason
    assert "ValueError" in observer.failed["broken"].reason
    report = cluster.answer("job", "broken")
    attempts = report["attempts"]  # type: ignore[index]
    # A loss of the k80 worker during one of its attempts neither counts nor resets the count
    # (mechanism_service/core/attempts.py): the three crashes are the last three that say something.
    telling = [a["ended"] for a in attempts if a["ended"] not in ("worker lost", "no report")]
    assert telling[-3:] == ["crashed (exit 1)"] * 3 and attempts[-1]["ended"] == "crashed (exit 1)", attempts
    assert "the learning rate is not a number" in str(report)
    fixed = cluster.answer("job", "fixed")
    ends = [a["ended"] for a in fixed["attempts"]]  # type: ignore[index]
    assert ends[0] == "crashed (exit 1)" and "finished" in ends[-1], ends
