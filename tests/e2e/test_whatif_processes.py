"""`gavel whatif` on the journal of a real run (issue 26, item 5): `gavel serve` processes over
RabbitMQ (a policy replica, the mechanism, a simulated fleet) on a scaled clock, fed a trace by
`gavel submit`, their jobs arriving over an hour of the mechanism's time. The replay under the
policy the cluster ran must give the real run's average JCT within 5%, and the other policies
are printed beside it.

What differs from the real run is only what the journal cannot give the simulator: the time from
a round's last report to the next boundary (a few milliseconds of wall time, times the clock's
scale), which the replay's rounds do not have. At --time-scale 100 a 360 s round lasts 3.6 s of
wall time, so that lag is ~1% of a round; whatif says how large it was."""

from __future__ import annotations

import json

import pytest

from sim.traces import TraceJob, write_trace
from tests.support.processes import Cluster
from tests.support.waiting import eventually

pytestmark = pytest.mark.broker

POLICY = "max_min_fairness_perf"
SCALE = "100"
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


def all_completed(cluster: Cluster) -> bool:
    rows = cluster.answer("jobs")
    return sum(r["state"] == "completed" for r in rows) == len(JOBS)  # type: ignore[union-attr]


@pytest.mark.slow  # ~60 s: eight jobs over ~3 h of the mechanism's time at 100x, then three replays
async def test_whatif_on_a_real_runs_journal_reproduces_its_average_jct(cluster, tmp_path):
    import asyncio

    journal = tmp_path / "mechanism.sqlite"
    trace = tmp_path / "jobs.trace"
    write_trace([TraceJob(str(i), t, steps, 1, at_s) for i, (t, steps, at_s) in enumerate(JOBS)], trace)
    cluster.start("policy", "serve", "policy", "--solving", "inline")
    cluster.start("fleet", "serve", "fleet", "--cluster", "v100=2,p100=2,k80=2", "--time-scale", SCALE)
    cluster.start(
        "mechanism", "serve", "mechanism", "--policy", POLICY, "--time-scale", SCALE, "--journal", str(journal),
        "--health-file", str(tmp_path / "mechanism.health"),
    )
    await asyncio.to_thread(cluster.run, "submit", "--trace", str(trace), "--id-prefix", "", "--no-wait")
    try:
        await eventually(lambda: all_completed(cluster), timeout_s=240, poll_s=1.0)
    except TimeoutError:
        raise AssertionError(f"jobs: {cluster.answer('jobs')}\n{cluster.logs()}") from None
    real_jct_s = {r["id"]: r["jct_s"] for r in cluster.answer("jobs")}  # type: ignore[union-attr]
    cluster.stop("mechanism")

    done = await asyncio.to_thread(
        cluster.gavel, "whatif", "--journal", str(journal), "--policies", "fifo,max_min_fairness", "--json",
        "--no-plots", "--out", str(tmp_path / "whatif"),
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    runs = {r["label"]: r for r in report["runs"]}
    assert list(runs) == ["real run", POLICY, "fifo", "max_min_fairness"]
    assert report["real_run"]["policy"] == POLICY and report["real_run"]["preset"] == "default"
    assert report["real_run"]["cluster"] == {"k80": 2, "p100": 2, "v100": 2}
    # the real run as the journal tells it is the run the mechanism reported
    real_avg_s = sum(real_jct_s.values()) / len(real_jct_s)
    assert runs["real run"]["avg_jct_s"] == pytest.approx(real_avg_s, rel=1e-6)
    assert runs["real run"]["jobs_completed"] == len(JOBS)
    # the Done-when: the policy it ran reproduces its average JCT within 5%
    assert runs[POLICY]["avg_jct_vs_real"] == pytest.approx(1.0, abs=0.05), (runs, report["notes"])
    assert all(runs[p]["avg_jct_s"] is not None for p in ("fifo", "max_min_fairness"))
    assert report["cells"]["measured"] > 0
