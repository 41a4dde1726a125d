"""The README's "Running it as services" block, run as written (issue 23: its own `gavel submit
--job-type "my-model" ...` was accepted, then failed on the fake fleet after five crashed leases).

Its `gavel serve` lines start as processes over RabbitMQ, on a private exchange, with the fleet's
and the mechanism's `--time-scale` raised to SCALE (a 360 s round lasts 3.6 ms, so the
mechanism's own work at each boundary sets the pace). Then its `gavel` lines run in order, exactly
as the README writes them, each by gavel's main() in the test's process (the parse, command,
exit code and output a reader's `gavel` has; a process each cost ~0.5 s of CPU, and tests/cli
start the command as a process): every `gavel submit` is accepted, the status lines answer, and
every job submitted completes. The block is parsed from README.md, so the test follows the README when
it changes.

The rounds are the cost (~15 ms of the mechanism's CPU each): the README's trace takes ~1,350 of
them. So under `make test` (tests/support/seeds.py) its `gavel submit --trace` line submits the
trace's QUICK_JOBS jobs of fewest steps (~130 rounds, still more jobs than GPUs), under `make
test-deep` the README's trace itself; the test changes nothing else in the block.

`gavel cancel resnet-1` runs last, once everything has completed: at the README's x100 a reader's
cancel stops resnet-1 while it runs, here the job may have finished already or not (a race), so
the test holds the cancel until there is nothing left to cancel, and asks that it say so.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from mechanism_service.core.why import ACTIVE_CODES, ENDED_CODES
from tests.support.asking import Status, gavel_here
from tests.support.data import fewest_steps
from tests.support.processes import ROOT, Cluster
from tests.support.seeds import deep
from tests.support.waiting import until

SCALE = "100000"
QUICK_JOBS = 16
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


def tiered(argv: list[str], scratch: Path) -> list[str]:
    """A `gavel submit --trace` line as this tier runs it: the README's trace (make test-deep), or
    its QUICK_JOBS jobs of fewest steps, written under ``scratch`` (make test)."""
    if "--trace" not in argv or deep():
        return argv
    at = argv.index("--trace")
    quick = fewest_steps(ROOT / argv[at + 1], QUICK_JOBS, scratch)
    return [*argv[: at + 1], str(quick), *argv[at + 2 :]]


def submitted_ids(argv: list[str], stdout: str) -> list[str]:
    """The ids a `gavel submit` printed: one job's id, or a trace's 'submitted N jobs (P/0 .. P/M)'."""
    if "--trace" not in argv:
        return [stdout.strip()]
    match = re.search(r"submitted (\d+) jobs \((\S+)/0 \.\. \2/(\d+)\)", stdout)
    assert match is not None, stdout
    count, prefix = int(match.group(1)), match.group(2)
    assert int(match.group(3)) == count - 1, stdout
    return [f"{prefix}/{i}" for i in range(count)]


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
    trace = submits[2][submits[2].index("--trace") + 1]
    assert (ROOT / trace).is_file(), trace


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.deep
async def test_every_job_the_readme_submits_completes_on_the_fake_fleet(cluster: Cluster, tmp_path: Path) -> None:
    """The whole block on RabbitMQ: ~17-24 s wall, ~9 s of CPU on 2 busy cores under `make test`
    (the trace's 16 jobs of fewest steps); under `make test-deep` the README's 32, ~140 hours of
    the mechanism's time, ~1,350 rounds, 60-70 s (load 3-6; at x20,000 it took longer still)."""
    block = services_block()
    gpus = 0
    for argv in (a for a in block if a[0] == "serve"):
        name = argv[1]
        if name in ("fleet", "mechanism"):
            argv = scaled(argv)
        if name == "fleet":
            gpus = sum(int(part.split("=")[1]) for part in argv[argv.index("--cluster") + 1].split(","))
        cluster.start(name, *argv)

    async with Status(cluster) as status:  # the waits ask in this process (a `gavel` a poll cost ~1 s of wall)
        await until(lambda: status.workers_up(gpus), timeout_s=60, poll_s=0.1)
        submitted, by_type, held_back = await run_the_lines(cluster, [tiered(argv, tmp_path) for argv in block])

        async def all_completed() -> bool:
            known = {job_id: str(row["state"]) for job_id, row in (await status.jobs()).items()}
            failed = {job_id: state for job_id, state in known.items() if state in ("failed", "rejected", "cancelled")}
            assert not failed, failed  # fails at once rather than waiting for the timeout
            return all(known.get(job_id) == "completed" for job_id in submitted)

        await until(all_completed, timeout_s=300, poll_s=0.5)

    # the type no table knows ran at the figures given (12.5 on a V100, 3.1 on a K80) or derived
    # ones, and no lease of it crashed
    done = await gavel_here(cluster, "job", by_type["my-model"], "--json")
    assert done.returncode == 0, done.stderr
    mine = json.loads(done.stdout)
    assert (mine["type"], mine["steps_done"], mine["steps_total"]) == ("my-model", 5000, 5000), mine  # type: ignore[index]
    assert all(not a["ended"].startswith("crashed") and not a["error"] for a in mine["attempts"]), mine  # type: ignore[index]
    for argv in held_back:
        done = await gavel_here(cluster, *argv)
        assert done.returncode == 1 and "has already completed: nothing to cancel" in done.stderr, (argv, done.stderr)


async def run_the_lines(cluster: Cluster, block: list[list[str]]) -> tuple[list[str], dict[str, str], list[list[str]]]:
    """The block's `gavel` lines but `serve`, in order, as a reader runs them (each must exit 0;
    the cancel is held back, see the module's docstring): the ids submitted, the id each
    --job-type line printed by its job type, and the lines held back."""
    submitted: list[str] = []
    by_type: dict[str, str] = {}  # a --job-type line's job type -> the id it printed
    held_back = []
    for argv in (a for a in block if a[0] != "serve"):
        if argv[0] == "cancel":
            held_back.append(argv)
            continue
        done = await gavel_here(cluster, *argv)
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
    jobs = 2 + (32 if deep() else QUICK_JOBS)  # resnet-1, my-model, the trace's
    assert len(submitted) == jobs and len(set(submitted)) == jobs, submitted
    return submitted, by_type, held_back
