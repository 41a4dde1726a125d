"""Policy plug-ins over RabbitMQ, in service processes (issue 26, "plug-ins without forking"): the
example package (examples/gavel-example-plugins, pip-installed into a temporary directory and on
PYTHONPATH) runs a cluster's jobs, its policy, placement and admission together, by
package.module:Name in separate `gavel serve` processes and by entry point in `gavel up --bus
amqp` (one cluster each, which every plug-in is seen at work in); a
policy plug-in that raises in allocate costs answers, and the mechanism keeps running on its last
allocation until the policy answers again.

Clusters run on a scaled clock (--time-scale 1000: a 360 s round lasts 0.36 s). `gavel cluster
--json`, `gavel job --why` and `gavel cancel` run as processes, as a user's; `gavel submit` runs
in this process (its parser and command), and the polls (is a job running yet?) ask the mechanism
what `gavel jobs` asks over one connection of the test's own (services.cli.status_cmd.ask_on):
a process costs ~0.5 s of CPU, and the polls were most of these tests' CPU.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from common.bus import Bus
from common.config import Settings
from common.errors import CommandFailed
from services.cli.common import open_bus
from services.cli.status_cmd import ask_on
from tests.support.asking import run_here
from tests.support.example_plugins import (
    POLICY_ENTRY_POINT,
    POLICY_REFERENCE,
)
from tests.support.processes import Cluster, logged
from tests.support.waiting import until

pytestmark = pytest.mark.broker

SCALE = ("--time-scale", "1000")
FLEET = "v100=1,p100=1,k80=1"


@pytest.fixture
def plugged(cluster: Cluster, example_plugins: Path) -> Cluster:
    cluster.env["PYTHONPATH"] = str(example_plugins)
    return cluster


@pytest.fixture
async def bus(plugged: Cluster) -> AsyncIterator[Bus]:
    """A connection to the cluster's exchange, to ask the mechanism what `gavel jobs` asks."""
    connection = await open_bus(Settings.from_env(plugged.env), None)
    try:
        yield connection
    finally:
        await connection.close()


async def ready(bus: Bus, workers: int) -> None:
    async def up() -> bool:
        try:
            return len(await ask_on(bus, "workers", timeout_s=2)) == workers  # type: ignore[arg-type]
        except CommandFailed:  # no mechanism yet, or it does not answer yet
            return False

    await until(up, timeout_s=60, poll_s=0.2)


async def submit(cluster: Cluster, job_id: str, job_type: str, steps: int, *more: str) -> None:
    """`gavel submit` run in this process (its parser and command, on the cluster's settings): a
    process would cost ~0.5 s of CPU, and seconds of wall time on a loaded machine."""
    argv = ["submit", "--job-type", job_type, "--steps", str(steps), "--job-id", job_id, *more]
    assert await run_here(cluster, *argv) == 0, argv


async def states(bus: Bus) -> dict[str, str]:
    return {str(row["id"]): str(row["state"]) for row in await ask_on(bus, "jobs", timeout_s=10)}  # type: ignore[union-attr]


async def state_is(bus: Bus, job_id: str, state: str, timeout_s: float = 30) -> None:
    async def there() -> bool:
        return (await states(bus)).get(job_id) == state

    await until(there, timeout_s=timeout_s, poll_s=0.1)


async def all_completed(cluster: Cluster, bus: Bus, job_ids: set[str], timeout_s: float = 90) -> None:
    async def done() -> bool:
        return {j for j, s in (await states(bus)).items() if s == "completed"} >= job_ids

    try:
        await until(done, timeout_s=timeout_s, poll_s=0.2)
    except TimeoutError:
        raise AssertionError(f"{await states(bus)}\n{cluster.logs()}") from None


async def report(bus: Bus) -> dict[str, object]:
    return await ask_on(bus, "cluster", timeout_s=10)  # type: ignore[return-value]


@pytest.mark.slow  # ~17 s of wall, ~4 s of CPU: three service processes, two jobs of several rounds each
async def test_a_plugin_raising_in_allocate_leaves_the_mechanism_on_its_last_allocation(
    plugged: Cluster, bus: Bus, tmp_path: Path,
) -> None:
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
    await ready(bus, 3)
    await submit(c, "first", "ResNet-50 (batch size 64)", 30_000)
    await state_is(bus, "first", "running")
    assert (await report(bus))["allocation"]["state"] == "current"  # type: ignore[index]

    await submit(c, "second", "A3C", 30_000)
    seen: list[dict[str, object]] = []  # the report that said degraded (the next may be after the first job ended)

    async def degraded_now() -> bool:
        seen.append(await report(bus))
        return seen[-1]["allocation"]["state"] == "degraded"  # type: ignore[index]

    await until(degraded_now, timeout_s=30, poll_s=0.1)
    degraded = seen[-1]
    reason = f"policy plug-in {spec!r}: allocate raised RuntimeError: cannot share between 2 jobs"
    assert degraded["last_solve"]["status"] == "failed" and degraded["last_solve"]["error"] == reason  # type: ignore[index]
    assert degraded["allocation"]["jobs_without_allocation"] == 1  # type: ignore[index]

    # the mechanism keeps going: rounds pass on the allocation it kept
    async def rounds_passed() -> bool:
        return int((await report(bus))["rounds"]) > int(degraded["rounds"]) + 2  # type: ignore[arg-type]

    await until(rounds_passed, timeout_s=30, poll_s=0.2)

    await all_completed(c, bus, {"first", "second"})
    assert c.processes["policy"].poll() is None and c.processes["mechanism"].poll() is None
    # as `gavel cluster --json` prints it
    assert c.answer("cluster")["allocation"]["state"] == "current"  # type: ignore[index]
    mechanism_log = tmp_path / "mechanism.log"
    assert [e["error"] for e in logged(mechanism_log, "allocation_degraded")] == [reason]
    assert len(logged(mechanism_log, "allocation_restored")) == 1
    assert {e["reason"] for e in logged(tmp_path / "policy.log", "allocation_failed")} == {reason}


SEAMS = ("--gpus-per-server", "4")  # two v100 servers of 4 GPUs: a 4-GPU gang fits one whole


async def placed_best_fit_and_admitted_per_entity(c: Cluster, bus: Bus) -> None:
    """fewest_servers and per_entity_jobs (max_jobs=1) at work on two servers of 4 v100s. A
    4-GPU job fills the first server, so a 2-GPU job arriving then takes the second; once the
    first ends, a new 2-GPU job goes to the fullest server that holds it (best fit: the second,
    beside the other; the default's first fit would take the first, now empty, and leave no
    server whole). A second job of an entity with one scheduled waits in the admission queue,
    saying why, until that one ends (cancelled). The first job lasts ~6 s of wall time (the second
    until cancelled): long enough, on a loaded machine, for the second to be submitted and placed
    at a round boundary while the first runs (a submission in this process takes a fraction of
    a second; the 10 s this job had were for two `gavel` processes)."""
    resnet = "ResNet-18 (batch size 64)"
    await submit(c, "a4", resnet, 600_000, "--entity", "u", "--scale-factor", "4")
    await state_is(bus, "a4", "running")
    await submit(c, "b2", resnet, 3_000_000, "--entity", "t", "--scale-factor", "2")
    await state_is(bus, "b2", "running")
    await state_is(bus, "a4", "completed", timeout_s=60)
    await submit(c, "c2", resnet, 20_000, "--entity", "v", "--scale-factor", "2")
    await submit(c, "t1", "A3C", 2_000, "--entity", "t")
    await state_is(bus, "t1", "admission")
    assert c.answer("job", "t1", "--why")["why"]["reason"] == "in the admission queue: entity t: 1 scheduled, at most 1"  # type: ignore[index]
    await all_completed(c, bus, {"c2"})
    now = await states(bus)
    assert now["b2"] == "running" and now["t1"] == "admission"
    done = c.gavel("cancel", "b2", timeout_s=60)
    assert done.returncode == 0, done.stderr
    await all_completed(c, bus, {"a4", "c2", "t1"})
    placements = {job: await ask_on(bus, "job", job_id=job, timeout_s=10) for job in ("a4", "b2", "c2")}
    where = {job: [span["workers"] for span in answer["placements"]] for job, answer in placements.items()}  # type: ignore[index]
    assert where == {"a4": [["v100-0"]], "b2": [["v100-1"]], "c2": [["v100-1"]]}, where


def solved_by(c: Cluster, policy: str, log: Path) -> None:
    """Every allocation was the plug-in policy's: the mechanism names it (`gavel cluster --json`),
    the replica solved it."""
    answer = c.answer("cluster")
    assert answer["policy"] == policy and answer["last_solve"]["status"] == "optimal"  # type: ignore[index]
    computed = logged(log, "allocation_computed")
    assert computed and {e["policy"] for e in computed} == {policy}
    assert not logged(log, "allocation_failed")


@pytest.mark.slow  # ~13 s of wall, ~3 s of CPU: one `gavel up` process, four jobs (the first ~6 s of wall time)
async def test_gavel_up_runs_the_example_plugins_by_entry_point(plugged: Cluster, bus: Bus, tmp_path: Path) -> None:
    """Installed, each plug-in is found by its entry point's name: the policy by the mechanism and
    the replica alike (gavel up's replica serves the mechanism's policy), the placement and the
    admission by the mechanism."""
    c = plugged
    c.start(
        "up", "up", "--bus", "amqp", "--services", "policy,mechanism,fleet", "--policy", POLICY_ENTRY_POINT,
        "--placement", "fewest_servers", "--admission", "per_entity_jobs", "--admission-param", "max_jobs=1",
        "--cluster", "v100=8", *SEAMS, "--journal", str(tmp_path / "j.sqlite"), *SCALE,
    )
    await ready(bus, 2)
    await placed_best_fit_and_admitted_per_entity(c, bus)
    solved_by(c, POLICY_ENTRY_POINT, tmp_path / "up.log")


@pytest.mark.slow  # ~15 s of wall, ~5 s of CPU: three service processes, four jobs (the first ~6 s of wall time)
async def test_separate_processes_run_the_example_plugins_by_module_reference(plugged: Cluster, bus: Bus, tmp_path: Path) -> None:
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
    await ready(bus, 2)
    await placed_best_fit_and_admitted_per_entity(c, bus)
    solved_by(c, POLICY_REFERENCE, tmp_path / "policy.log")
