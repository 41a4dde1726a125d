"""`gavel submit` refuses, before publishing, every field a policy would refuse (issue 9: a
negative SLO went through, and every later solve failed), and accepts, with a note, a job type or
gang size the throughput table does not have (the estimator schedules it from a prior, or from the
user's --throughput). Through the real command line; no broker is needed, since nothing is
published (a submission that passes fails for want of one: exit 1)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from common.job_checks import MAX_PRIORITY_WEIGHT
from tests.support.cli import gavel

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
        (("--scale-factor", "16", "--max-gpus", "8"), "--scale-factor: 16 GPUs is more than --max-gpus 8"),
        (("--entity", ""), "--entity: must not be empty"),
        (("--entity", "team a"), "--entity: must be printable, without spaces, got 'team a'"),
        (("--job-id", "a b"), "--job-id: must be printable, without spaces, got 'a b'"),
        (("--job-type", " "), "--job-type: must not be empty"),
        (("--throughput", "v100"), "--throughput: expected TYPE=STEPS_PER_S[,TYPE=STEPS_PER_S...], got 'v100'"),
        (("--throughput", "v100=1,"), "--throughput: expected TYPE=STEPS_PER_S[,TYPE=STEPS_PER_S...], got ''"),
        (("--throughput", "=3"), "--throughput: expected TYPE=STEPS_PER_S[,TYPE=STEPS_PER_S...], got '=3'"),
        (("--throughput", "v100=fast"), "--throughput: v100: expected a number of steps/s, got 'fast'"),
        (("--throughput", "v100=1,k80=2,v100=3"), "--throughput: v100 given twice"),
        (("--throughput", "v100=1", "--throughput", "v100=2"), "--throughput: v100 given twice"),
        (("--throughput", "v100=nan"), "--throughput: v100: NaN is not allowed"),
        (("--throughput", "k80=inf"), "--throughput: k80: must be finite, got inf"),
        (("--throughput", "v100=-2.5"), "--throughput: v100: must be >= 0, got -2.5"),
        (("--throughput", "v 100=1"), "--throughput: an accelerator type is letters, digits, '_' and '-', got 'v 100'"),
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
        + json.dumps({"job_id": "1", "job_type": RESNET, "total_steps": 10, "arrival_time_s": 5, "scale_factor": 4}) + "\n"
    )
    out = gavel("submit", "--trace", str(trace), "--max-gpus", "2", env=nobody_listens())
    assert out.returncode == 2
    prefix = out.stderr.strip()
    assert prefix.startswith("gavel: job t-") and prefix.endswith("/1: scale_factor: 4 GPUs is more than --max-gpus 2"), prefix


def test_a_flag_for_one_job_is_refused_with_a_trace(tmp_path) -> None:
    """A trace gives each job its own steps, gang, weight...: `--steps 100` would be ignored."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"job_id": "0", "job_type": RESNET, "total_steps": 10, "arrival_time_s": 0}) + "\n")
    for flag, value in (("--steps", "100"), ("--scale-factor", "1"), ("--job-id", "x"), ("--slo-s", "5"), ("--throughput", "v100=2")):
        out = gavel("submit", "--trace", str(trace), flag, value, env=nobody_listens())
        assert out.returncode == 2
        assert out.stderr.strip() == f"gavel: {flag}: only with --job-type (a trace gives each job's own)"


def test_a_good_submission_gets_past_the_checks_to_the_broker() -> None:
    """The same command with good values fails only for want of a broker (exit 1): the checks
    above refuse the field, not everything."""
    out = gavel("submit", "--job-type", RESNET, "--steps", "1000", "--slo-s", "3600", "--entity", "team-a", env=nobody_listens())
    assert out.returncode == 1 and "cannot connect to RabbitMQ" in out.stderr, out.stderr


NOTE_TAIL = "scheduled from estimates that start from a prior until the first measurements arrive"


@pytest.mark.parametrize(
    ("job_type", "hint"),
    [
        ("ResNet50 (batch size 64)", " (did you mean 'ResNet-50 (batch size 64)' or 'ResNet-50 (batch size 16)'?)"),
        ("resnet-50 (batch size 64)", " (did you mean 'ResNet-50 (batch size 64)' or 'ResNet-50 (batch size 16)'?)"),
        ("A3c", " (did you mean 'A3C'?)"),
        ("GPT-7", ""),
    ],
)
def test_a_job_type_the_table_lacks_and_nothing_said_of_it_is_taken_for_a_typo(job_type: str, hint: str) -> None:
    """Issue 23: a typo was accepted, then crashed on every real worker ("unknown job type")."""
    out = gavel("submit", "--job-type", job_type, "--steps", "10", env=nobody_listens())
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"gavel: --job-type: {job_type!r} is not a job type of the reference table{hint}; a type of your own needs "
        "--command (what a real worker runs) or --throughput (how fast it runs), or both (gavel job-types lists the table's)"
    )


@pytest.mark.parametrize(
    ("args", "subject"),
    [
        (
            ("--job-type", "my-bert-finetune", "--command", "python finetune.py"),
            "job type 'my-bert-finetune' is not in the reference throughput table",
        ),
        (("--scale-factor", "3"), f"{RESNET!r} on 3 GPUs is not in the reference throughput table (it has 1, 2, 4, 8)"),
        (("--scale-factor", "64"), f"{RESNET!r} on 64 GPUs is not in the reference throughput table (it has 1, 2, 4, 8)"),
    ],
)
def test_a_job_type_or_size_the_table_lacks_is_submitted_with_one_note(args: tuple[str, ...], subject: str) -> None:
    """A user's own script need not resemble a type of the table: the mechanism schedules it from
    the estimator's figures, which start from a prior; submit says so once, and publishes."""
    base = {"--job-type": RESNET, "--steps": "1000"}
    argv = [x for flag, value in base.items() if flag not in args for x in (flag, value)]
    out = gavel("submit", *argv, *args, env=nobody_listens())
    assert out.returncode == 1 and "cannot connect to RabbitMQ" in out.stderr, out.stderr  # past the checks
    [note] = [line for line in out.stderr.splitlines() if "note:" in line]
    assert note == f"gavel: note: {subject}: it is {NOTE_TAIL} (--throughput TYPE=STEPS_PER_S,... gives a better start)"


def test_with_an_estimate_the_note_does_not_ask_for_one() -> None:
    out = gavel("submit", "--job-type", "my-bert", "--steps", "10", "--throughput", "v100=3", env=nobody_listens())
    assert out.returncode == 1, out.stderr
    [note] = [line for line in out.stderr.splitlines() if "note:" in line]
    assert note == f"gavel: note: job type 'my-bert' is not in the reference throughput table: it is {NOTE_TAIL}"


def test_a_known_job_type_gets_no_note() -> None:
    out = gavel("submit", "--job-type", RESNET, "--steps", "10", "--throughput", "v100=3,k80=0.5", env=nobody_listens())
    assert out.returncode == 1 and "note:" not in out.stderr, out.stderr


def test_a_trace_with_types_the_table_lacks_gets_one_note(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [("0", "my-bert", 1), ("1", RESNET, 3), ("2", "my-bert", 1), ("3", RESNET, 1)]
    trace.write_text("".join(
        json.dumps({"job_id": i, "job_type": t, "total_steps": 10, "arrival_time_s": 0, "scale_factor": sf}) + "\n"
        for i, t, sf in rows
    ))
    out = gavel("submit", "--trace", str(trace), env=nobody_listens())
    assert out.returncode == 1, out.stderr
    [note] = [line for line in out.stderr.splitlines() if "note:" in line]
    assert note == (
        f"gavel: note: 3 of the trace's jobs are of job types not in the reference throughput table "
        f"('my-bert', {RESNET!r} on 3 GPUs): they are {NOTE_TAIL}"
    )


def submit_batch(*argv: str):  # noqa: ANN201
    """`gavel submit`'s parsing and checks, in process (nothing is published)."""
    from services.cli import Parser
    from services.cli.submit_batch import batch_from_args
    from services.cli.submit_cmd import register

    parser = Parser(prog="gavel")
    register(parser.add_subparsers(dest="command"))
    return batch_from_args(parser.parse_args(["submit", *argv]))


def test_throughput_becomes_the_jobs_estimate_per_type() -> None:
    batch = submit_batch("--job-type", RESNET, "--steps", "10", "--throughput", "v100=12.5, k80=3.1", "--throughput", "p100=0")
    [spec] = batch.specs
    assert spec.throughput_estimate_steps_per_s == {"v100": 12.5, "k80": 3.1, "p100": 0.0}  # 0: it cannot run there
    assert batch.notes == ()
    [plain] = submit_batch("--job-type", RESNET, "--steps", "10").specs
    assert plain.throughput_estimate_steps_per_s is None  # no estimate, not an empty one


def test_a_type_the_table_does_not_name_is_kept_with_a_note() -> None:
    """A user's cluster may have types the table lacks (a100): kept; but a typo (V100) would be
    dropped by an estimator on that table without a word, so submit says so."""
    batch = submit_batch("--job-type", RESNET, "--steps", "10", "--throughput", "V100=3,a100=9,k80=1")
    assert batch.specs[0].throughput_estimate_steps_per_s == {"V100": 3.0, "a100": 9.0, "k80": 1.0}
    [note] = batch.notes
    assert note.startswith("gavel: note: --throughput: not an accelerator type of the throughput table (k80, p100, v100")
    assert note.endswith("): V100, a100; an estimator on that table ignores the estimate there")


def test_zero_on_every_type_is_refused_and_zero_on_some_is_kept() -> None:
    """0 steps/s says the job cannot run on the type: on every type of the table it could run
    nowhere and was held for ever; refused in one line. Zero on some types is a real constraint."""
    out = gavel("submit", "--job-type", "my-bert", "--steps", "10", "--throughput", "v100=0,p100=0,k80=0", env=nobody_listens())
    assert (out.returncode, out.stdout, out.stderr.splitlines()) == (2, "", [
        "gavel: --throughput: 0 steps/s on every accelerator type (k80, p100, v100): the job could run nowhere; "
        "give the types it runs on, and leave out a type you do not know"
    ])
    [spec] = submit_batch("--job-type", RESNET, "--steps", "10", "--throughput", "v100=0,k80=0").specs
    assert spec.throughput_estimate_steps_per_s == {"v100": 0.0, "k80": 0.0}  # p100 remains: from the table


@pytest.mark.parametrize("types", ["tpu=5", "V100=3,a100=9", "v100_unconsolidated=3"])
def test_an_estimate_on_no_type_the_table_has_is_refused_as_a_likely_typo(types: str) -> None:
    """Issue 23: `--throughput tpu=5` was accepted with a note, and the estimate then counted on no
    type the scheduler knew. Refused in one line naming the known types and the way to insist;
    nothing is published (exit 2, not the missing broker's 1)."""
    out = gavel("submit", "--job-type", "my-bert", "--steps", "10", "--throughput", types, env=nobody_listens())
    given = ", ".join(sorted(part.split("=")[0] for part in types.split(",")))
    assert (out.returncode, out.stdout, out.stderr.splitlines()) == (2, "", [
        f"gavel: --throughput: no accelerator type of the throughput table (k80, p100, v100) in it: {given}; a typo? "
        "If the cluster has (or will have) workers of that type, --allow-new-types keeps the estimate"
    ])


def test_allow_new_types_keeps_an_estimate_for_types_the_table_lacks_without_a_note() -> None:
    """An elastic cluster whose a100 workers the table does not know: the mechanism uses the
    user's figure on them (mechanism_service/core/rates.py, EstimatedRates)."""
    batch = submit_batch("--job-type", RESNET, "--steps", "10", "--throughput", "a100=9", "--allow-new-types")
    assert batch.specs[0].throughput_estimate_steps_per_s == {"a100": 9.0}
    assert batch.notes == ()
    out = gavel("submit", "--job-type", RESNET, "--steps", "10", "--allow-new-types", env=nobody_listens())
    assert (out.returncode, out.stderr.splitlines()) == (2, [
        "gavel: --allow-new-types: only with --throughput (it keeps an estimate for types the table lacks)"
    ])
