"""Policy plug-ins over RabbitMQ, in service processes (issue 26, "plug-ins without forking"): the
example package (examples/gavel-example-plugins, pip-installed into a temporary directory and on
PYTHONPATH) runs a cluster's jobs, its policy, placement and admission together, by
package.module:Name in separate `gavel serve` processes and by entry point in `gavel up --bus
amqp` (one cluster each, which every plug-in is seen at work in); a
policy plug-in that raises in allocate costs answers, and the mechanism keeps running on its last
allocation until the policy answers again.

Clusters run on a scaled clock (--time-scale 1000: a 360 s round lasts 0.36 s).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.example_plugins import (
    POLICY_ENTRY_POINT,
    POLICY_REFERENCE,
)
from tests.support.processes import Cluster, logged
from tests.support.waiting import eventually

pytestmark = pytest.mark.broker

SCALE = ("--time-scale", "1000")
FLEET = "v100=1,p100=1,k80=1"


@pytest.fixture
def plugged(cluster: Cluster, example_plugins: Path) -> Cluster:
    cluster.env["PYTHONPATH"] = str(example_plugins)
    return cluster


async def ready(cluster: Cluster, workers: int) -> None:
    def up() -> bool:
        done = cluster.gavel("workers", "--json", "--timeout-s", "2", timeout_s=60)
        return done.returncode == 0 and len(json.loads(done.stdout)) == workers

    await eventually(up, timeout_s=60, poll_s=0.3)


def submit(cluster: Cluster, job_id: str, job_type: str, steps: int, *more: str) -> None:
    done = cluster.gavel("submit", "--job-type", job_type, "--steps", str(steps), "--job-id", job_id, *more, timeout_s=60)
    assert done.returncode == 0, done.stderr


def states(cluster: Cluster) -> dict[str, str]:
    return {str(row["id"]): str(row["state"]) for row in cluster.answer("jobs")}  # type: ignore[union-attr]


async def all_completed(cluster: Cluster, job_ids: set[str], timeout_s: float = 90) -> None:
    try:
        await eventually(lambda: {j for j, s in states(cluster).items() if s == "completed"} >= job_ids, timeout_s=timeout_s, poll_s=0.5)
    except TimeoutError:
        raise AssertionError(f"{states(cluster)}\n{cluster.logs()}") from None


def report(cluster: Cluster) -> dict[str, object]:
    return cluster.answer("cluster")  # type: ignore[return-value]


@pytest.mark.slow  # ~20 s: three service processes, two jobs of several rounds each
async def test_a_plugin_raising_in_allocate_leaves_the_mechanism_on_its_last_allocation(plugged: Cluster, tmp_path: Path) -> None:
    """The plug-in answers for one job and raises for two. The second job's arrival costs answers
    (AllocationFailed naming the plug-in and what it raised): the mechanism keeps the allocation
    it has (degraded), keeps running rounds, and the job outside it runs on the GPUs that
    allocation leaves idle; once a job ends the policy answers again and the allocation is
    restored. Neither the replica nor the mechanism stops."""
    c = plugged
    spec = "plugb_broken_policies:RaisesOnSecondJob"
    c.start("policy", "serve", "policy", "--solving", "inline", "--policy", spec)
    c.start("mechanism", "serve", "mechanism", "--policy", spec, "--journal", str(tmp_path / "j.sqlite"), *SCALE)
    c.start("fleet", "serve", "fleet", "--cluster", FLEET, *SCALE)
    await ready(c, 3)
    submit(c, "first", "ResNet-50 (batch size 64)", 30_000)
    await eventually(lambda: states(c).get("first") == "running", timeout_s=30, poll_s=0.2)
    assert report(c)["allocation"]["state"] == "current"  # type: ignore[index]

    submit(c, "second", "A3C", 30_000)
    await eventually(lambda: report(c)["allocation"]["state"] == "degraded", timeout_s=30, poll_s=0.2)  # type: ignore[index]
    degraded = report(c)
    reason = f"policy plug-in {spec!r}: allocate raised RuntimeError: cannot share between 2 jobs"
    assert degraded["last_solve"]["status"] == "failed" and degraded["last_solve"]["error"] == reason  # type: ignore[index]
    assert degraded["allocation"]["jobs_without_allocation"] == 1  # type: ignore[index]
    # the mechanism keeps going: rounds pass on the allocation it kept
    await eventually(lambda: int(report(c)["rounds"]) > int(degraded["rounds"]) + 2, timeout_s=30, poll_s=0.3)  # type: ignore[arg-type]

    await all_completed(c, {"first", "second"})
    assert c.processes["policy"].poll() is None and c.processes["mechanism"].poll() is None
    assert report(c)["allocation"]["state"] == "current"  # type: ignore[index]
    mechanism_log = tmp_path / "mechanism.log"
    assert [e["error"] for e in logged(mechanism_log, "allocation_degraded")] == [reason]
    assert len(logged(mechanism_log, "allocation_restored")) == 1
    assert {e["reason"] for e in logged(tmp_path / "policy.log", "allocation_failed")} == {reason}


SEAMS = ("--gpus-per-server", "4")  # two v100 servers of 4 GPUs: a 4-GPU gang fits one whole


async def placed_best_fit_and_admitted_per_entity(c: Cluster) -> None:
    """fewest_servers and per_entity_jobs (max_jobs=1) at work on two servers of 4 v100s. A
    4-GPU job fills the first server, so a 2-GPU job arriving then takes the second; once the
    first ends, a new 2-GPU job goes to the fullest server that holds it (best fit: the second,
    beside the other; the default's first fit would take the first, now empty, and leave no
    server whole). A second job of an entity with one scheduled waits in the admission queue,
    saying why, until that one ends (cancelled). The jobs are long enough in wall time (the first
    ~10 s, the second until cancelled) for each step to be seen on a loaded machine."""
    resnet = "ResNet-18 (batch size 64)"
    submit(c, "a4", resnet, 1_000_000, "--entity", "u", "--scale-factor", "4")
    await eventually(lambda: states(c).get("a4") == "running", timeout_s=30, poll_s=0.1)
    submit(c, "b2", resnet, 3_000_000, "--entity", "t", "--scale-factor", "2")
    await eventually(lambda: states(c).get("b2") == "running", timeout_s=30, poll_s=0.1)
    await eventually(lambda: states(c).get("a4") == "completed", timeout_s=60, poll_s=0.2)
    submit(c, "c2", resnet, 20_000, "--entity", "v", "--scale-factor", "2")
    submit(c, "t1", "A3C", 2_000, "--entity", "t")
    await eventually(lambda: states(c).get("t1") == "admission", timeout_s=30, poll_s=0.1)
    assert c.answer("job", "t1", "--why")["why"]["reason"] == "in the admission queue: entity t: 1 scheduled, at most 1"  # type: ignore[index]
    await all_completed(c, {"c2"})
    assert states(c)["b2"] == "running" and states(c)["t1"] == "admission"
    done = c.gavel("cancel", "b2", timeout_s=60)
    assert done.returncode == 0, done.stderr
    await all_completed(c, {"a4", "c2", "t1"})
    where = {job: [span["workers"] for span in c.answer("job", job)["placements"]] for job in ("a4", "b2", "c2")}  # type: ignore[index]
    assert where == {"a4": [["v100-0"]], "b2": [["v100-1"]], "c2": [["v100-1"]]}, where


def solved_by(c: Cluster, policy: str, log: Path) -> None:
    """Every allocation was the plug-in policy's: the mechanism names it, the replica solved it."""
    answer = report(c)
    assert answer["policy"] == policy and answer["last_solve"]["status"] == "optimal"  # type: ignore[index]
    computed = logged(log, "allocation_computed")
    assert computed and {e["policy"] for e in computed} == {policy}
    assert not logged(log, "allocation_failed")


@pytest.mark.slow  # ~20 s: one `gavel up` process, four jobs (the first ~10 s of wall time)
async def test_gavel_up_runs_the_example_plugins_by_entry_point(plugged: Cluster, tmp_path: Path) -> None:
    """Installed, each plug-in is found by its entry point's name: the policy by the mechanism and
    the replica alike (gavel up's replica serves the mechanism's policy), the placement and the
    admission by the mechanism."""
    c = plugged
    c.start(
        "up", "up", "--bus", "amqp", "--services", "policy,mechanism,fleet", "--policy", POLICY_ENTRY_POINT,
        "--placement", "fewest_servers", "--admission", "per_entity_jobs", "--admission-param", "max_jobs=1",
        "--cluster", "v100=8", *SEAMS, "--journal", str(tmp_path / "j.sqlite"), *SCALE,
    )
    await ready(c, 2)
    await placed_best_fit_and_admitted_per_entity(c)
    solved_by(c, POLICY_ENTRY_POINT, tmp_path / "up.log")


@pytest.mark.slow  # ~25 s: three service processes, four jobs (the first ~10 s of wall time)
async def test_separate_processes_run_the_example_plugins_by_module_reference(plugged: Cluster, tmp_path: Path) -> None:
    """The replica is started with the policy plug-in and solves in its worker process (spawned:
    the spec travels there and is resolved again); the mechanism names it in every request and
    runs the placement and the admission by module:Name."""
    c = plugged
    c.start("policy", "serve", "policy", "--policy", POLICY_REFERENCE)  # solving in a worker process
    c.start(
        "mechanism", "serve", "mechanism", "--policy", POLICY_REFERENCE,
        "--placement", "gavel_example_plugins.placement:FewestServers",
        "--admission", "gavel_example_plugins.admission:PerEntityJobs", "--admission-param", "max_jobs=1",
        *SEAMS, "--journal", str(tmp_path / "j.sqlite"), *SCALE,
    )
    c.start("fleet", "serve", "fleet", "--cluster", "v100=8", *SEAMS, *SCALE)
    await ready(c, 2)
    await placed_best_fit_and_admitted_per_entity(c)
    solved_by(c, POLICY_REFERENCE, tmp_path / "policy.log")
