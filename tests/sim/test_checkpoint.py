"""A simulation checkpointed and resumed (sim/checkpoint.py, `gavel simulate --checkpoint-to`,
`--resume`; issue 26, item 4): the resumed run ends exactly as the uninterrupted one, and a
checkpoint of another trace, run or version is refused in one line. About 10 s; the learned
estimator's case (slow) 10 s more.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest

from common.errors import CheckpointError
from services.cli import main
from sim.checkpoint import MAGIC, CheckpointSpec, fingerprint, read_checkpoint
from sim.learning import EstimationConfig
from sim.scenario import Scenario, generated_trace, load_context, run_policy

CONTEXT = load_context(None)
TRACE = generated_trace(80, 4.0, True, 0, CONTEXT.table)
CLUSTER = {"v100": 4, "p100": 4, "k80": 4}


def comparable(result):
    """Everything a run records but the wall-clock measurements (the run's and each solve's)."""
    return dataclasses.replace(result, wall_s=0.0, solve_times_s=len(result.solve_times_s))


@pytest.mark.parametrize(
    ("policy", "scenario", "when"),
    [
        ("max_min_fairness_perf", Scenario(TRACE, CLUSTER), {"after_jobs": 40}),
        ("max_min_fairness_perf", Scenario(TRACE, CLUSTER, "gavel"), {"at_s": 20 * 3600.0}),
        # the learned estimator's state (its evidence, profiling, noise stream) travels too
        pytest.param(
            "max_min_fairness_perf",
            Scenario(TRACE[:40], CLUSTER, estimation=EstimationConfig("learned", measurement_noise=0.1)),
            {"after_jobs": 20}, marks=pytest.mark.slow,
        ),
    ],
    ids=["default-after-jobs", "gavel-at-time", "learned"],
)
def test_a_resumed_run_ends_exactly_as_the_uninterrupted_one(tmp_path, policy, scenario, when):
    path = tmp_path / "run.ckpt"
    whole, _ = run_policy(policy, scenario, CONTEXT)
    saving, _ = run_policy(policy, dataclasses.replace(scenario, checkpoint=CheckpointSpec(path, **when)), CONTEXT)
    assert comparable(saving) == comparable(whole)  # saving changes nothing
    header = json.loads(path.read_bytes()[len(MAGIC):].partition(b"\n")[0])
    assert 0 < header["at_s"] < whole.makespan_s and 0 < header["rounds"] < len(whole.rounds)  # a point inside
    resumed, _ = run_policy(policy, dataclasses.replace(scenario, checkpoint=CheckpointSpec(resume_from=path)), CONTEXT)
    assert comparable(resumed) == comparable(whole)


def saved_checkpoint(tmp_path: pathlib.Path) -> tuple[pathlib.Path, Scenario]:
    path = tmp_path / "run.ckpt"
    scenario = Scenario(TRACE, CLUSTER)
    run_policy("fifo_perf", dataclasses.replace(scenario, checkpoint=CheckpointSpec(path, after_jobs=20)), CONTEXT)
    return path, scenario


def test_a_checkpoint_of_another_trace_run_or_version_is_refused_naming_what_differs(tmp_path):
    path, scenario = saved_checkpoint(tmp_path)
    other_trace = generated_trace(80, 4.0, True, 1, CONTEXT.table)
    with pytest.raises(CheckpointError, match=r"a checkpoint of another trace: '80 jobs, sha256 \w+', not '80 jobs"):
        read_checkpoint(path, fingerprint(other_trace, scenario.config("fifo_perf"), CONTEXT.table))
    with pytest.raises(CheckpointError, match="a checkpoint of policy 'fifo_perf', not 'max_min_fairness_perf'"):
        read_checkpoint(path, fingerprint(TRACE, scenario.config("max_min_fairness_perf"), CONTEXT.table))
    with pytest.raises(CheckpointError, match="a checkpoint of seed '0', not '3'"):
        read_checkpoint(path, fingerprint(TRACE, dataclasses.replace(scenario, seed=3).config("fifo_perf"), CONTEXT.table))
    # another --throughputs table: the saved jobs' rates are the old table's, later jobs' would not be
    table = CONTEXT.table
    key = next(iter(table.isolated_steps_per_s))
    faster = dataclasses.replace(table, isolated_steps_per_s={**table.isolated_steps_per_s, key: 2 * table.isolated_steps_per_s[key]})
    with pytest.raises(CheckpointError, match=r"a checkpoint of another throughput table: 'sha256 \w+', not 'sha256 \w+'"):
        read_checkpoint(path, fingerprint(TRACE, scenario.config("fifo_perf"), faster))
    # a replay's lag and fleet over time (gavel whatif's): the saved state followed the others
    lagged = dataclasses.replace(scenario.config("fifo_perf"), boundary_lag_s=1.5)
    with pytest.raises(CheckpointError, match=r"a checkpoint of boundary lag \(s\) '0\.0', not '1\.5'"):
        read_checkpoint(path, fingerprint(TRACE, lagged, table))
    moving = dataclasses.replace(scenario.config("fifo_perf"), fleet_changes=((3600.0, (("v100", 8),)),))
    with pytest.raises(CheckpointError, match=r"a checkpoint of fleet changes: 'none', not '1, sha256 \w+'"):
        read_checkpoint(path, fingerprint(TRACE, moving, table))
    run = fingerprint(TRACE, scenario.config("fifo_perf"), table)
    with pytest.raises(CheckpointError, match=r"a checkpoint of gavel version '0\.0\.0-other', not "):
        older = path.read_bytes().replace(json.dumps(run["version"]).encode(), b'"0.0.0-other"', 1)
        (tmp_path / "older.ckpt").write_bytes(older)
        read_checkpoint(tmp_path / "older.ckpt", run)
    with pytest.raises(CheckpointError, match=r"a checkpoint of other code: the source's digest '0{16}', not "):
        edited = path.read_bytes().replace(json.dumps(run["code"]).encode(), b'"' + b"0" * 16 + b'"', 1)
        (tmp_path / "edited.ckpt").write_bytes(edited)  # as a checkout at another commit would write it
        read_checkpoint(tmp_path / "edited.ckpt", run)
    (tmp_path / "cut.ckpt").write_bytes(path.read_bytes()[:-100])  # a file cut short
    with pytest.raises(CheckpointError, match="its state cannot be read"):
        read_checkpoint(tmp_path / "cut.ckpt", run)
    (tmp_path / "no.ckpt").write_text("hello\n")
    with pytest.raises(CheckpointError, match="not a checkpoint of gavel simulate"):
        read_checkpoint(tmp_path / "no.ckpt", run)


RUN = ["simulate", "--jobs", "40", "--jobs-per-hour", "4", "--cluster", "4:4:4", "--policy", "max_min_fairness_perf",
       "--no-plots", "--json"]


def summary_of(capsys) -> dict:
    summary = json.loads(capsys.readouterr().out)
    return {k: v for k, v in summary.items() if k not in ("out_dir", "wall_s") and not k.startswith("solve_time")}


def test_simulate_saves_and_resumes_from_the_command_line(tmp_path, capsys):
    checkpoint = tmp_path / "c.ckpt"
    assert main([*RUN, "--out", str(tmp_path / "whole")]) == 0
    whole = summary_of(capsys)
    assert main([*RUN, "--out", str(tmp_path / "a"), "--checkpoint-to", str(checkpoint), "--checkpoint-after-jobs", "20"]) == 0
    capsys.readouterr()
    assert main([*RUN, "--out", str(tmp_path / "b"), "--resume", str(checkpoint)]) == 0
    assert summary_of(capsys) == whole
    # the same file under another policy: one line, exit 2
    assert main([*RUN[:-3], "fifo_perf", "--no-plots", "--out", str(tmp_path / "c"), "--resume", str(checkpoint)]) == 2
    err = capsys.readouterr().err
    assert "a checkpoint of policy 'max_min_fairness_perf', not 'fifo_perf'" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--checkpoint-at-s", "60"], "--checkpoint-at-s: needs --checkpoint-to FILE"),
        (["--checkpoint-to", "x.ckpt"], "--checkpoint-to: needs one of --checkpoint-at-s T or --checkpoint-after-jobs N"),
        (["--checkpoint-to", "x.ckpt", "--checkpoint-after-jobs", "0"], "--checkpoint-after-jobs: expected a whole number >= 1"),
        (["--checkpoint-to", "x.ckpt", "--checkpoint-at-s", "5", "--ideal"], "--checkpoint-to: a checkpoint is the fast engine's"),
        (["--resume", "missing.ckpt"], "--resume: missing.ckpt is not a file"),
        # a directory where the file goes: refused at start, not a traceback once the run got there
        (["--checkpoint-to", ".", "--checkpoint-at-s", "5"], "--checkpoint-to: . is a directory: give the file to write"),
        # more jobs than the trace has: refused at start, not a run that silently never saves
        (["--checkpoint-to", "x.ckpt", "--checkpoint-after-jobs", "41"],
         "--checkpoint-after-jobs 41: the trace has 40 jobs, so the run would never be saved"),
    ],
)
def test_checkpoint_flags_that_contradict_are_refused(extra, message, capsys):
    assert main([*RUN, *extra]) == 2
    assert message in capsys.readouterr().err


def test_a_state_that_cannot_be_pickled_is_refused_in_one_line(tmp_path):
    """A plug-in holding something no pickle takes (a lambda here) cannot be checkpointed: said,
    not a traceback from deep in pickle."""
    from sim.carry import Carry
    from sim.checkpoint import write_checkpoint

    carry = Carry(*([None] * 17))
    carry.chosen, carry.now_s, carry.rounds = (lambda: 0), 0.0, []
    with pytest.raises(CheckpointError, match=r"--checkpoint-to .*: the run's state cannot be saved \(\w+Error"):
        write_checkpoint(tmp_path / "x.ckpt", carry, {})
    assert not (tmp_path / "x.ckpt").exists()


def test_a_checkpoint_that_cannot_be_written_is_said_in_one_line(tmp_path):
    """The directory it goes to vanished or is read-only: a CheckpointError naming the file, not
    an OSError traceback, and no .partial left behind."""
    from sim.carry import Carry
    from sim.checkpoint import write_checkpoint

    carry = Carry(*([None] * 17))
    carry.now_s, carry.rounds = 0.0, []
    with pytest.raises(CheckpointError, match=r"--checkpoint-to .*x\.ckpt: cannot write it: No such file or directory"):
        write_checkpoint(tmp_path / "gone" / "x.ckpt", carry, {})
