"""--admission, --placement, --launch and their parameters (services/cli/module_flags.py): a run
honours them (jobs.csv says when each job was admitted), a sweep's cells carry them, and a bad
name or parameter is one line naming the flag, exit 2, before anything runs."""

from __future__ import annotations

import csv
import json

import pytest

from services.cli import main

GENERATED = ("--jobs", "12", "--jobs-per-hour", "6", "--cluster", "v100=1,k80=1", "--policy", "max_min_fairness_perf")


def gavel(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow  # ~2-6 s: two runs of 12 jobs, no plots
def test_simulate_with_load_based_admission_admits_jobs_later_than_they_arrive(tmp_path, capsys):
    runs = {}
    for name, flags in (("default", ()), ("load", ("--admission", "load", "--admission-param", "max_load=0.5"))):
        out = tmp_path / name
        code, _, err = gavel(capsys, "simulate", *GENERATED, *flags, "--placement", "spread", "--no-plots", "--out", str(out))
        assert code == 0, err
        with (out / "jobs.csv").open() as f:
            runs[name] = list(csv.DictReader(f))
    assert "admitted_s" not in runs["default"][0]  # a default run's file as it was
    waited = [r for r in runs["load"] if float(r["admitted_s"]) > float(r["arrival_s"]) + 360.0]
    assert waited  # held in the admission queue beyond a round
    assert sum(float(r["jct_s"]) for r in runs["load"]) > sum(float(r["jct_s"]) for r in runs["default"])


@pytest.mark.slow  # ~5-16 s: two one-cell sweeps of 12 jobs (a worker process each) and a run
def test_a_sweeps_cells_carry_the_seams(tmp_path, capsys):
    tables = {}
    for name, flags in (("default", ()), ("load", ("--admission", "load", "--admission-param", "max_load=0.5"))):
        out = tmp_path / name
        code, _, err = gavel(
            capsys, "sweep", "--policies", "max_min_fairness_perf", "--rates", "6", "--jobs", "12",
            "--cluster", "v100=1,k80=1", "--processes", "1", *flags, "--out", str(out), "--json",
        )
        assert code == 0, err
        with (out / "sweep.csv").open() as f:
            tables[name] = float(next(csv.DictReader(f))["avg_jct_s"])
    assert tables["load"] > tables["default"]
    code, stdout, _ = gavel(
        capsys, "simulate", *GENERATED, "--admission", "load", "--admission-param", "max_load=0.5", "--no-plots", "--out", str(tmp_path / "one"), "--json",
    )
    assert code == 0 and json.loads(stdout)["avg_jct_s"] == pytest.approx(tables["load"])  # the cell ran what simulate runs


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--admission", "nope"), "gavel: --admission: admission plug-in 'nope': unknown; built-in: accept_all, load, quota;"),
        (("--admission", "load", "--admission-param", "max_lod=1"), "gavel: --admission: admission plug-in 'load': its parameters: load: unknown parameter max_lod"),
        (("--admission", "quota", "--admission-param", "unit=tpu"), "gavel: --admission: admission plug-in 'quota': its parameters: unit='tpu': v100 or gpu"),
        (("--placement", "spread", "--placement-param", "x=1"), "gavel: --placement: placement plug-in 'spread': its parameters: spread: takes no parameters (got x)"),
        (("--placement", "no_such.module:Thing"), "gavel: --placement: placement plug-in 'no_such.module:Thing': module 'no_such.module' does not import: ModuleNotFoundError"),
        (("--launch", "fifo"), "gavel: --launch: launch plug-in 'fifo': unknown; built-in: non_preemptive, priority; installed (gavel.launch): none; or give package.module:Name"),
        (("--admission-param", "a=1", "--admission-param", "a=2"), "gavel: --admission-param: a given twice"),
    ],
)
def test_a_bad_choice_is_one_line_naming_the_flag(tmp_path, capsys, flags, message):
    code, stdout, err = gavel(capsys, "simulate", *GENERATED, *flags, "--no-plots", "--out", str(tmp_path / "x"))
    assert (code, stdout) == (2, "")
    assert err.startswith(message) and err.count("\n") == 1
    assert not (tmp_path / "x").exists()  # refused before anything ran



def test_a_quota_for_an_entity_no_job_has_is_refused(tmp_path, capsys):
    """A mistyped entity would be bounded by hours= or not at all: refused before anything runs."""
    from sim.traces import TraceJob, write_trace

    job = TraceJob("a0", "ResNet-50 (batch size 64)", 1000, 1, 0.0, entity="vision")
    trace = tmp_path / "t.jsonl"
    write_trace([job, TraceJob("a1", job.job_type, 1000, 1, 60.0)], trace)
    run = ("simulate", "--trace", str(trace), "--cluster", "v100=1,k80=1", "--policy", "fifo", "--admission", "quota",
           "--no-plots")
    code, stdout, err = gavel(capsys, *run, "--admission-param", "entities=visoin:2", "--out", str(tmp_path / "x"))
    assert (code, stdout, err.count("\n")) == (2, "", 1)
    assert err.startswith(
        f"gavel: --admission-param entities: 'visoin' is no job's entity in --trace {trace} (its entities: 'vision'); "
        "its quota would bound nothing"
    )
    assert not (tmp_path / "x").exists()
    # the right name runs
    code, _, err = gavel(capsys, *run, "--admission-param", "entities=vision:2", "--out", str(tmp_path / "y"), "--json")
    assert code == 0, err
    code, _, err = gavel(capsys, "simulate", *GENERATED, "--admission", "quota", "--admission-param", "entities=teamA:3",
                         "--no-plots", "--out", str(tmp_path / "z"))
    assert code == 2 and "'teamA' is no job's entity in the generated trace (its entities: none: no job names one)" in err