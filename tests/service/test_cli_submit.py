"""`gavel submit` refuses, before publishing, every field a policy would refuse (issue 9: a
negative SLO went through, and every later solve failed). Through the real command line; no
broker is needed, since nothing is published."""

from __future__ import annotations

import json
import socket

import pytest

from common.job_checks import MAX_PRIORITY_WEIGHT
from tests.service.test_cli import gavel

RESNET = "ResNet-50 (batch size 64)"


def nobody_listens() -> dict[str, str]:
    """A broker URL where nothing listens: a submission that got past its checks would fail with
    exit 1 (cannot connect), not 2."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {"GAVEL_AMQP_URL": f"amqp://guest:guest@127.0.0.1:{port}/", "GAVEL_CONNECT_TIMEOUT_S": "2"}


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("--slo-s", "-10"), "--slo-s: must be > 0, got -10"),
        (("--slo-s", "0"), "--slo-s: must be > 0, got 0"),
        (("--slo-s", "nan"), "--slo-s: NaN is not allowed"),
        (("--slo-s", "inf"), "--slo-s: must be finite, got inf"),
        (("--slo-s", "1e11"), "--slo-s: must be <= 1e+10, got 1e+11"),
        (("--priority-weight", "0"), "--priority-weight: must be >= 0.001, got 0"),
        (("--priority-weight", "-1"), "--priority-weight: must be >= 0.001, got -1"),
        (("--priority-weight", "nan"), "--priority-weight: NaN is not allowed"),
        (("--priority-weight", "1e9"), f"--priority-weight: must be <= {MAX_PRIORITY_WEIGHT:g}, got 1e+09"),
        (("--steps", "0"), "--steps: must be >= 1, got 0"),
        (("--steps", "10000000000000"), "--steps: must be <= 1000000000000, got 10000000000000"),
        (("--scale-factor", "0"), "--scale-factor: must be >= 1, got 0"),
        (("--scale-factor", "64"), "--scale-factor: no accelerator type here runs a job on 64 GPUs (largest: 8)"),
        (("--scale-factor", "3"), f"--scale-factor: {RESNET!r} has no measured throughput on 3 GPUs (it has: 1, 2, 4, 8)"),
        (("--entity", ""), "--entity: must not be empty"),
        (("--entity", "team a"), "--entity: must be printable, without spaces, got 'team a'"),
        (("--job-id", "a b"), "--job-id: must be printable, without spaces, got 'a b'"),
        (("--job-type", "GPT-7"), "--job-type: unknown job type 'GPT-7' (gavel job-types lists them)"),
        (("--now",), "--now: only with --trace"),
        (("--id-prefix", "x/"), "--id-prefix: only with --trace"),
    ],
)
def test_every_field_a_policy_would_refuse_is_refused_before_publishing(args: tuple[str, ...], line: str) -> None:
    base = {"--job-type": RESNET, "--steps": "1000"}
    argv = ["submit"]
    for flag, value in base.items():
        if flag not in args:
            argv += [flag, value]
    out = gavel(*argv, *args, env=nobody_listens())
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [f"gavel: {line}"]


def test_a_trace_job_with_a_bad_field_is_named(tmp_path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        json.dumps({"job_id": "0", "job_type": RESNET, "total_steps": 10, "arrival_time_s": 0}) + "\n"
        + json.dumps({"job_id": "1", "job_type": RESNET, "total_steps": 10, "arrival_time_s": 5, "scale_factor": 3}) + "\n"
    )
    out = gavel("submit", "--trace", str(trace), env=nobody_listens())
    assert out.returncode == 2
    prefix = out.stderr.strip()
    assert prefix.startswith("gavel: job t-") and prefix.endswith(
        f"/1: scale_factor: {RESNET!r} has no measured throughput on 3 GPUs (it has: 1, 2, 4, 8)"
    ), prefix


def test_a_flag_for_one_job_is_refused_with_a_trace(tmp_path) -> None:
    """A trace gives each job its own steps, gang, weight...: `--steps 100` would be ignored."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"job_id": "0", "job_type": RESNET, "total_steps": 10, "arrival_time_s": 0}) + "\n")
    for flag, value in (("--steps", "100"), ("--scale-factor", "1"), ("--job-id", "x"), ("--slo-s", "5")):
        out = gavel("submit", "--trace", str(trace), flag, value, env=nobody_listens())
        assert out.returncode == 2
        assert out.stderr.strip() == f"gavel: {flag}: only with --job-type (a trace gives each job's own)"


def test_a_good_submission_gets_past_the_checks_to_the_broker() -> None:
    """The same command with good values fails only for want of a broker (exit 1): the checks
    above refuse the field, not everything."""
    out = gavel("submit", "--job-type", RESNET, "--steps", "1000", "--slo-s", "3600", "--entity", "team-a", env=nobody_listens())
    assert out.returncode == 1 and "cannot connect to RabbitMQ" in out.stderr, out.stderr
