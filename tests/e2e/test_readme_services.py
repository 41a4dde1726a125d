"""The README's "Running it as services" block, run as written (issue 23: its own `gavel submit
--job-type "my-model" ...` was accepted, then failed on the fake fleet after five crashed leases).

Its `gavel serve` lines start as processes over RabbitMQ, on a private exchange, with the fleet's
and the mechanism's `--time-scale` raised to SCALE (the test's only change to the block: a 360 s
round lasts 3.6 ms, so the mechanism's own work at each boundary sets the pace). Then its `gavel` lines run in order, exactly as the README writes them: every
`gavel submit` is accepted, the status lines answer, and every job submitted completes. The block
is parsed from README.md, so the test follows the README when it changes.

`gavel cancel resnet-1` runs last, once everything has completed: at the README's x100 a reader's
cancel stops resnet-1 while it runs, here the job may have finished already or not (a race), so
the test holds the cancel until there is nothing left to cancel, and asks that it say so.
"""

from __future__ import annotations

import json
import re
import shlex

import pytest

from mechanism_service.core.why import ACTIVE_CODES, ENDED_CODES
from tests.support.processes import ROOT, Cluster
from tests.support.waiting import eventually

SCALE = "100000"
CODES = {*ACTIVE_CODES, *ENDED_CODES}


def services_block() -> list[list[str]]:
    """The `gavel` lines of the README's "Running it as services" block (its first ``sh`` block),
    without comments or `&`, each line's commands split at `;`, as argv after `gavel`."""
    section = (ROOT / "README.md").read_text().split("## Running it as services", 1)[1]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    assert match is not None, "README.md: no sh block under 'Running it as services'"
    commands = []
    for raw in match.group(1).splitlines():
        line = raw.split(" #", 1)[0].strip().rstrip("&").strip()
        for part in line.split(";"):
            words = shlex.split(part)
            if words:
                assert words[0] == "gavel", f"README.md: not a gavel command in the services block: {part!r}"
                commands.append(words[1:])
    return commands


def scaled(argv: list[str]) -> list[str]:
    """A `gavel serve` line with its --time-scale at SCALE."""
    at = argv.index("--time-scale")
    return [*argv[: at + 1], SCALE, *argv[at + 2 :]]


def submitted_ids(argv: list[str], stdout: str) -> list[str]:
    """The ids a `gavel submit` printed: one job's id, or a trace's 'submitted N jobs (P/0 .. P/M)'."""
    if "--trace" not in argv:
        return [stdout.strip()]
    match = re.search(r"submitted (\d+) jobs \((\S+)/0 \.\. \2/(\d+)\)", stdout)
    assert match is not None, stdout
    count, prefix = int(match.group(1)), match.group(2)
    assert int(match.group(3)) == count - 1, stdout
    return [f"{prefix}/{i}" for i in range(count)]


def states(cluster: Cluster) -> dict[str, str]:
    return {str(row["id"]): str(row["state"]) for row in cluster.answer("jobs")}  # type: ignore[union-attr]


def test_the_readme_services_block_is_parsed_as_a_reader_runs_it() -> None:
    """What the cluster test below relies on: four services, the fleet and the mechanism on a
    scaled clock, and submissions of one job of a known type, one of a type no table knows, and a
    trace."""
    block = services_block()
    serve = [argv[1] for argv in block if argv[0] == "serve"]
    assert sorted(serve) == ["estimator", "fleet", "mechanism", "policy"]
    assert all("--time-scale" in argv for argv in block if argv[:2] in (["serve", "fleet"], ["serve", "mechanism"]))
    submits = [argv for argv in block if argv[0] == "submit"]
    assert [argv[argv.index("--job-type") + 1] if "--job-type" in argv else "--trace" for argv in submits] == [
        "ResNet-50 (batch size 64)", "my-model", "--trace",
    ]
    assert scaled(["serve", "fleet", "--time-scale", "100", "--x"]) == ["serve", "fleet", "--time-scale", SCALE, "--x"]


@pytest.mark.broker
@pytest.mark.slow
async def test_every_job_the_readme_submits_completes_on_the_fake_fleet(cluster: Cluster) -> None:
    """The whole block on RabbitMQ: about 50 s on 2 shared cores under load (the trace's 32 jobs take
    some 140 hours of the mechanism's time, ~1,350 rounds; at x20,000 it took 82 s)."""
    block = services_block()
    gpus = 0
    for argv in (a for a in block if a[0] == "serve"):
        name = argv[1]
        if name in ("fleet", "mechanism"):
            argv = scaled(argv)
        if name == "fleet":
            gpus = sum(int(part.split("=")[1]) for part in argv[argv.index("--cluster") + 1].split(","))
        cluster.start(name, *argv)

    def workers_up() -> bool:
        out = cluster.gavel("workers", "--json", "--timeout-s", "2")
        return out.returncode == 0 and len(json.loads(out.stdout)) == gpus

    await eventually(workers_up, timeout_s=60, poll_s=0.3)

    submitted: list[str] = []
    by_type: dict[str, str] = {}  # a --job-type line's job type -> the id it printed
    held_back = []
    for argv in (a for a in block if a[0] != "serve"):
        if argv[0] == "cancel":
            held_back.append(argv)
            continue
        done = cluster.gavel(*argv)
        assert done.returncode == 0, (argv, done.stdout, done.stderr[-2000:], cluster.logs())
        if argv[0] == "submit":
            submitted += submitted_ids(argv, done.stdout)
            if "--job-type" in argv:
                by_type[argv[argv.index("--job-type") + 1]] = submitted[-1]
        if argv == ["job", "resnet-1"]:
            assert "type:" in done.stdout and "ResNet-50 (batch size 64)" in done.stdout, done.stdout
        if argv == ["job", "resnet-1", "--why"]:  # a reason code and its sentence, whatever the moment
            first, sentence = done.stdout.splitlines()[:2]
            name, code = first.split(": ", 1)
            assert name == "resnet-1" and code in CODES, done.stdout
            assert sentence.strip(), done.stdout
        if argv == ["top"]:  # not a terminal: one plain frame
            assert "\x1b" not in done.stdout and "GPUs" in done.stdout, done.stdout
    assert len(submitted) == 34 and len(set(submitted)) == 34, submitted

    def all_completed() -> bool:
        known = states(cluster)
        failed = {job_id: state for job_id, state in known.items() if state in ("failed", "rejected", "cancelled")}
        assert not failed, failed  # fails at once rather than waiting for the timeout
        return all(known.get(job_id) == "completed" for job_id in submitted)

    await eventually(all_completed, timeout_s=300, poll_s=1.0)

    # the type no table knows ran at the figures given (12.5 on a V100, 3.1 on a K80) or derived
    # ones, and no lease of it crashed
    mine = cluster.answer("job", by_type["my-model"])
    assert (mine["type"], mine["steps_done"], mine["steps_total"]) == ("my-model", 5000, 5000), mine  # type: ignore[index]
    assert all(not a["ended"].startswith("crashed") and not a["error"] for a in mine["attempts"]), mine  # type: ignore[index]
    for argv in held_back:
        done = cluster.gavel(*argv)
        assert done.returncode == 1 and "has already completed: nothing to cancel" in done.stderr, (argv, done.stderr)
