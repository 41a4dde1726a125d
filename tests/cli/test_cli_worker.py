"""`gavel serve worker` and `gavel submit --command` with careless input, as a new user types them:
each refusal is one line naming the flag, exit 2, before any broker is reached. About 1 s per case
(a process each)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import gavel
from tests.support.processes import the_line

RESNET = "ResNet-18 (batch size 32)"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((), "the following arguments are required: --type, --gpus"),
        (("--type", "V100", "--gpus", "2"), "--type: the throughput table has no accelerator type 'V100' (known: k80, p100, v100)"),
        (("--type", "v100", "--gpus", "0"), "--gpus: must be a whole number >= 1, got '0'"),
        pytest.param(  # ~5-9 s: the check of the device imports torch
            ("--type", "v100", "--gpus", "1", "--device", "cuda"), "--device cuda:", marks=pytest.mark.slow,
        ),
        (("--type", "v100", "--gpus", "1", "--emulate-speed", "2"), "--emulate-speed: expected a factor in (0, 1] or 'table', got '2'"),
        (("--type", "v100", "--gpus", "1", "--emulate-speed", "fast"), "--emulate-speed: expected a factor in (0, 1] or 'table'"),
        (("--type", "v100", "--gpus", "1", "--worker-id", "rack1.node2"), "--worker-id 'rack1.node2': letters, digits, '-' and '_' only"),
        (("--type", "v100", "--gpus", "1", "--checkpoint-dir", "/proc/no/such"), "--checkpoint-dir /proc/no/such: cannot create it"),
    ],
)
def test_a_worker_refuses_what_it_cannot_do_in_one_line(args: tuple[str, ...], expected: str, tmp_path: Path) -> None:
    out = gavel("serve", "worker", *args, env={"XDG_STATE_HOME": str(tmp_path), "GAVEL_BROKER_WAIT_S": "0"})
    assert out.returncode == 2, out.stderr
    line = the_line(out.stderr)
    assert expected in line, line
    if "--device cuda" in expected:  # this machine has no GPU (CI neither): say so, and what to use
        assert "use --device cpu" in line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--working-dir", "/tmp"), "--working-dir: only with --command"),
        (("--command", "   "), "--command: empty; leave it out to run the catalog's workload"),
    ],
)
def test_submit_refuses_a_command_that_cannot_run(args: tuple[str, ...], expected: str) -> None:
    out = gavel("submit", "--job-type", RESNET, "--steps", "10", *args, env={"GAVEL_AMQP_URL": "amqp://guest:guest@127.0.0.1:1/"})
    assert out.returncode == 2, out.stderr
    assert expected in the_line(out.stderr)


def test_a_trace_runs_the_catalog_not_gavels_own_commands(tmp_path: Path) -> None:
    """Gavel's traces name commands in its own workloads directory (with %s placeholders), which run
    nowhere here: a submitted trace job runs the catalog's workload for its type."""
    from services.cli.submit_batch import batch_from_args
    from services.cli.submit_cmd import register
    from services.cli import Parser

    parser = Parser(prog="gavel")
    register(parser.add_subparsers(dest="command"))
    trace = Path(__file__).resolve().parents[1] / "data" / "gavel-reference" / "static_n32_seed0.trace"
    args = parser.parse_args(["submit", "--trace", str(trace)])
    batch = batch_from_args(args)
    assert batch.specs and all(spec.command == "" for spec in batch.specs)
    assert "%s" in trace.read_text()  # the trace itself does name Gavel's commands
