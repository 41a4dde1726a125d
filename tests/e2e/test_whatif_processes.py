"""`gavel whatif` on the journal of a real run (issue 26, item 5): `gavel serve` processes over
RabbitMQ (a policy replica, the mechanism, a simulated fleet) on a scaled clock, fed a trace by
`gavel submit`, their jobs arriving over an hour of the mechanism's time. The replay under the
policy the cluster ran must give the real run's average JCT within 5%, and the other policies
are printed beside it.

What separates a replay from the real run is the time a live mechanism takes from a round's last
report (or an arrival into an idle cluster) to its next boundary: a few milliseconds of wall time
times the clock's scale (at --time-scale 200 a 360 s round lasts 1.8 s of wall time, so ~2% of a
round). whatif measures its mean in the journal and gives the replays' rounds the same. A one-off
delay it cannot model: a fresh policy process's first solve (loading the solver, seconds of wall
time: minutes of the mechanism's at 200x). So the cluster first runs one warm-up job, and the
comparison starts at the trace's arrival (--from), which also replays from a point in time."""

from __future__ import annotations

import json

import pytest

from common.bus import Delivery
from common.config import BusSettings
from common.messages import JobCompleted
from common.transport.rabbit import RabbitBus
from sim.traces import TraceJob, write_trace
from tests.support.asking import Status
from tests.support.processes import Cluster
from tests.support.waiting import eventually, until

pytestmark = pytest.mark.broker

POLICY = "max_min_fairness_perf"
SCALE = "200"
# (job type, steps, arrival s): each a few rounds of 360 s on a v100, arriving over an hour
JOBS = [
    ("ResNet-18 (batch size 64)", 40_000, 0.0),
    ("LM (batch size 20)", 90_000, 0.0),
    ("Transformer (batch size 32)", 15_000, 300.0),
    ("A3C", 9_000, 700.0),
    ("Recommendation (batch size 2048)", 20_000, 1_200.0),
    ("CycleGAN", 5_000, 1_800.0),
    ("ResNet-50 (batch size 64)", 5_000, 2_500.0),
    ("ResNet-18 (batch size 64)", 30_000, 3_600.0),
]


class Completions:
    """The jobs the mechanism announced completed (job.completed), by id: what the test waits on,
    on the bus (polling `gavel jobs` a second, a process each time, cost ~10 s of CPU)."""

    def __init__(self) -> None:
        self.job_ids: set[str] = set()

    async def __call__(self, d: Delivery) -> None:
        self.job_ids.add(d.message.job_id)  # type: ignore[attr-defined]


async def wait_for(cluster: Cluster, completions: Completions, job_ids: set[str]) -> None:
    try:
        await eventually(lambda: job_ids <= completions.job_ids, timeout_s=240, poll_s=0.2)
    except TimeoutError:
        raise AssertionError(f"completed: {sorted(completions.job_ids)}\n{cluster.logs()}") from None


@pytest.mark.slow  # ~30-35 s wall, ~5 s of CPU (~45 s beside the suite): a warm-up job, then eight over ~3 h of the mechanism's time at 200x; three replays
async def test_whatif_on_a_real_runs_journal_reproduces_its_average_jct(cluster, tmp_path):
    import asyncio

    journal = tmp_path / "mechanism.sqlite"
    trace = tmp_path / "jobs.trace"
    write_trace([TraceJob(str(i), t, steps, 1, at_s) for i, (t, steps, at_s) in enumerate(JOBS)], trace)
    bus = RabbitBus(BusSettings(kind="amqp", amqp_url=cluster.url, exchange=cluster.exchange), source="observer")
    await bus.start()
    completions = Completions()
    await bus.subscribe("observer", [JobCompleted.ROUTING_KEY], completions)  # the conftest deletes its queue
    try:
        cluster.start("policy", "serve", "policy", "--solving", "inline")
        cluster.start("fleet", "serve", "fleet", "--cluster", "v100=2,p100=2,k80=2", "--time-scale", SCALE)
        cluster.start(
            "mechanism", "serve", "mechanism", "--policy", POLICY, "--time-scale", SCALE, "--journal", str(journal),
            "--health-file", str(tmp_path / "mechanism.health"),
        )
        # every worker known before the first job: the journal's cluster is the fleet's six GPUs
        # (waiting on the bus, the trace could go in before the mechanism heard the last ones)
        async with Status(cluster) as status:
            await until(lambda: status.workers_up(6), timeout_s=60, poll_s=0.1)
        await asyncio.to_thread(
            cluster.run, "submit", "--job-type", "A3C", "--steps", "2000", "--job-id", "warm-up", "--no-wait"
        )
        await wait_for(cluster, completions, {"warm-up"})
        await asyncio.to_thread(cluster.run, "submit", "--trace", str(trace), "--id-prefix", "", "--no-wait")
        await wait_for(cluster, completions, {"warm-up", *(str(i) for i in range(len(JOBS)))})
    finally:
        await bus.close()
    rows = {r["id"]: r for r in cluster.answer("jobs")}  # type: ignore[union-attr]
    assert sum(row["state"] == "completed" for row in rows.values()) == 1 + len(JOBS), rows
    real_jct_s = {job_id: row["jct_s"] for job_id, row in rows.items() if job_id != "warm-up"}
    from_s = rows["0"]["arrival_s"] - rows["warm-up"]["arrival_s"]
    cluster.stop("mechanism")

    done = await asyncio.to_thread(
        cluster.gavel, "whatif", "--journal", str(journal), "--policies", "fifo,max_min_fairness", "--from", f"{from_s}",
        "--json", "--no-plots", "--out", str(tmp_path / "whatif"),
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    runs = {r["label"]: r for r in report["runs"]}
    assert list(runs) == ["real run", POLICY, "fifo", "max_min_fairness"]
    assert report["real_run"]["policy"] == POLICY and report["real_run"]["preset"] == "default"
    assert report["real_run"]["cluster"] == {"k80": 2, "p100": 2, "v100": 2}
    assert report["real_run"]["clocks"] == [f"scaled x{SCALE}"]
    assert (report["real_run"]["jobs_measured"], report["real_run"]["jobs_replayed"]) == (len(JOBS), len(JOBS))
    assert report["real_run"]["boundary_lag_s"] > 0
    # the real run as the journal tells it is the run the mechanism reported
    real_avg_s = sum(real_jct_s.values()) / len(real_jct_s)
    assert runs["real run"]["avg_jct_s"] == pytest.approx(real_avg_s, rel=1e-6)
    assert runs["real run"]["jobs_completed"] == len(JOBS)
    # the Done-when: the policy it ran reproduces its average JCT within 5%
    assert runs[POLICY]["avg_jct_vs_real"] == pytest.approx(1.0, abs=0.05), (
        {k: r["avg_jct_s"] for k, r in runs.items()}, report["notes"], report["cells"],
    )
    assert all(runs[p]["avg_jct_s"] is not None for p in ("fifo", "max_min_fairness"))
    assert report["cells"]["measured"] > 0
