"""`gavel jobs`, `gavel job ID --why` and `gavel workers` against a running cluster over RabbitMQ
(policy, mechanism and a simulated fleet of one V100 in a `gavel up` process, on a x100 clock):
the reason codes, the ETA as a local date, why a job waits and who holds its GPU, a gang held at
admission, and how long ago a worker was heard in wall seconds."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.processes import Cluster
from tests.support.waiting import eventually

pytestmark = pytest.mark.broker
RESNET = "ResNet-18 (batch size 64)"
DATE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d")


@pytest.mark.slow  # ~10 s: a `gavel up` process, its first rounds, a dozen status commands
async def test_why_a_job_waits_and_when_it_finishes_on_a_running_cluster(cluster: Cluster) -> None:
    cluster.start(
        "up", "up", "--bus", "amqp", "--services", "policy,mechanism,fleet", "--solving", "inline", "--no-journal",
        "--cluster", "v100=1", "--time-scale", "100",
    )
    for job_id, gang in (("a", 1), ("b", 1), ("gang", 4)):
        args = ["submit", "--job-type", RESNET, "--steps", "100000000", "--job-id", job_id]
        done = cluster.gavel(*args, *(["--scale-factor", str(gang)] if gang > 1 else []), timeout_s=60)
        assert done.returncode == 0, done.stderr

    def codes() -> dict[str, str]:
        done = cluster.gavel("jobs", "--json", timeout_s=30)
        return {row["id"]: row.get("reason_code", "") for row in json.loads(done.stdout)} if done.returncode == 0 else {}

    # one V100: a and b share it half and half, one of them runs; the gang of 4 is held
    await eventually(lambda: sorted(codes().values()) == ["Held", "Priority", "Running"], timeout_s=60, poll_s=0.5)

    # a round lasts 3.6 wall seconds here, so a and b may swap between two commands: each check
    # reads one answer, and is tried again until one round holds still for it
    def table_says_why() -> bool:
        table = cluster.run("jobs")
        header = table.splitlines()[0].split()
        line = next((line for line in table.splitlines() if " Priority " in line), "")
        # the waiting job's ETA: a local date, and how long from now
        return "reason" in header and "eta" in header and bool(DATE.search(line)) and "(in " in line

    await eventually(table_says_why, timeout_s=30, poll_s=0.2)

    def why_names_the_holder() -> bool:
        for waiting, running in (("a", "b"), ("b", "a")):
            why = cluster.run("job", waiting, "--why")
            if why.splitlines()[0] == f"{waiting}: Priority":
                return (
                    "jobs ahead of it" in why and re.search(rf"^{running}\s+v100\s+1\s", why, re.MULTILINE) is not None
                    and re.search(r"^eta: \d{4}-", why, re.MULTILINE) is not None and "basis: " in why
                )
        return False

    await eventually(why_names_the_holder, timeout_s=30, poll_s=0.2)
    held = cluster.run("job", "gang", "--why")
    assert held.splitlines()[0] == "gang: Held" and "waits for workers" in held

    # wall seconds: the fleet's heartbeat comes every 5 wall seconds (500 of the mechanism's here),
    # the first 5 s after it starts ("-" until then); in the mechanism's seconds it would read minutes
    def heard_s() -> float | None:
        heard = re.search(r"(\d+(?:\.\d)?) s ago", cluster.run("workers").splitlines()[-1])
        return float(heard.group(1)) if heard is not None else None

    seen: list[float | None] = []

    def heard() -> bool:
        seen.append(heard_s())
        return seen[-1] is not None

    await eventually(heard, timeout_s=30, poll_s=0.5)
    assert seen[-1] is not None and seen[-1] < 15, seen
