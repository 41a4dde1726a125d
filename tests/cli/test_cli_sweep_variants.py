"""`gavel sweep --variant LABEL=FLAGS` (services/cli/sweep_variants.py), the sweep's option axis: a
variant's cells are what `gavel simulate` runs with the sweep's flags and the variant's over them,
sweep.csv, the table and --json name the variant, a restart runs only the cells without a result,
and a bad variant is one line naming it, exit 2, before anything runs."""

from __future__ import annotations

import argparse
import csv
import json

import pytest

from services.cli import build_parser, main
from services.cli.sweep_variants import SHARED_FLAGS, variant_flags

CLUSTER = ("--cluster", "v100=1,k80=1")
SWEEP = ("sweep", "--policies", "max_min_fairness_perf", "--rates", "6", "--jobs", "12", *CLUSTER)
BY_MODULE = "mechanism_service.core.seams.placement_builtins:Spread"
SHARED = ("--admission", "load", "--admission-param", "max_load=1.0")  # the variants' base
VARIANTS = {  # label -> its flags; what `gavel simulate` is given for its cells
    "tight": ("--admission-param max_load=0.5", (*SHARED[:2], "--admission-param", "max_load=0.5")),
    # by package.module:Name: a local sweep serves the plug-ins its own flags name, its variants' too
    "open": (f"--admission accept_all --placement {BY_MODULE}", ("--placement", BY_MODULE)),
}
IDEAL = ("--ideal --admission accept_all", ("--ideal",))  # the fluid run has no admission


def gavel(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def simulated_jct_s(capsys, tmp_path, flags) -> float:
    code, stdout, err = gavel(
        capsys, "simulate", "--jobs", "12", "--jobs-per-hour", "6", *CLUSTER, "--policy", "max_min_fairness_perf",
        *flags, "--no-plots", "--out", str(tmp_path / "one"), "--json",
    )
    assert code == 0, err
    return json.loads(stdout)["avg_jct_s"]


@pytest.mark.slow  # ~6-15 s (the load): a sweep of 2 cells of 12 jobs on 2 worker processes, its restart with one cell more, 3 runs
def test_variant_cells_are_simulate_runs_with_their_flags_and_a_restart_runs_only_a_new_variant(tmp_path, capsys):
    out = tmp_path / "sweep"
    variants = [f"--variant={label}={flags}" for label, (flags, _) in VARIANTS.items()]
    argv = (*SWEEP, *SHARED, *variants, "--processes", "2", "--out", str(out))
    code, stdout, stderr = gavel(capsys, *argv, "--json")
    assert code == 0, stderr
    assert "1 policies x 1 seeds x 2 variants x 1 rates = 2 cells" in stderr
    runs = {run["option"]: run["avg_jct_s"] for run in json.loads(stdout)["runs"]}
    for label, (_, flags) in VARIANTS.items():
        assert runs[label] == pytest.approx(simulated_jct_s(capsys, tmp_path, flags), rel=1e-12), label
    assert runs["tight"] != runs["open"]  # the variants ran differently
    with (out / "sweep.csv").open() as f:
        table = [(r["policy"], r["option"], float(r["avg_jct_s"])) for r in csv.DictReader(f)]
    assert table == [("max_min_fairness_perf", label, runs[label]) for label in VARIANTS]
    ledger = (out / "cells.jsonl").read_text()

    # again with a third variant: the two finished cells are not run again, only the new one
    code, stdout, stderr = gavel(capsys, *argv, f"--variant=ideal={IDEAL[0]}")
    assert code == 0, stderr
    assert "2 cell(s) of this sweep already in the ledger: not run again" in stderr
    assert [line for line in stderr.splitlines() if line.startswith("[")] == [
        next(line for line in stderr.splitlines() if "max_min_fairness_perf [ideal] at 6 jobs/h" in line)
    ]
    added = (out / "cells.jsonl").read_text()
    assert added.startswith(ledger) and len(added.splitlines()) == 3
    assert json.loads(added.splitlines()[-1])["avg_jct_s"] == pytest.approx(simulated_jct_s(capsys, tmp_path, IDEAL[1]), rel=1e-12)
    printed = stdout.splitlines()  # a row per (policy, variant, rate), the variants in the order given
    header = next(i for i, line in enumerate(printed) if line.startswith("policy"))
    assert printed[header].split()[:3] == ["policy", "variant", "jobs/hour"]
    assert [line.split()[:3] for line in printed[header + 2 : header + 5]] == [
        ["max_min_fairness_perf", label, "6"] for label in ("tight", "open", "ideal")
    ]

    # the third variant alone: the ledger holds 3 cells of this sweep, and it takes 1 of them
    code, _, stderr = gavel(capsys, *SWEEP, *SHARED, f"--variant=ideal={IDEAL[0]}", "--processes", "2", "--out", str(out))
    assert code == 0, stderr
    assert "; 1 cell(s) of this sweep already in the ledger: not run again" in stderr
    assert not [line for line in stderr.splitlines() if line.startswith("[")]


BAD = [
    (("--variant", "x=--jobs 5"), "--variant x: --jobs is shared by every cell of the sweep: give it once, outside --variant"),
    (("--variant", "x=--cluster=v100=2"), "--variant x: --cluster is shared by every cell"),
    (("--variant", "x=--out /tmp/y"), "--variant x: --out is shared by every cell"),
    (("--variant", "x=--bus amqp"), "--variant x: --bus is shared by every cell"),
    (("--variant", "x=--engine services"), "--variant x: --engine is not a flag a variant takes (it takes --admission,"),
    (("--variant", "x=--admission nope"), "--variant x: --admission: admission plug-in 'nope': unknown"),
    (("--variant", "x=--admission load --admission-param max_lod=1"), "--variant x: --admission: admission plug-in 'load': its parameters: load: unknown parameter max_lod"),
    (("--variant", "x=--placement no_such.module:Thing"), "--variant x: --placement: placement plug-in 'no_such.module:Thing': module 'no_such.module' does not import"),
    (("--variant", "x=--round-s -3"), "--variant x: --round-s: expected a number of seconds > 0, got -3"),
    (("--variant", "x=--round-s abc"), "--variant x: argument --round-s: invalid float value: 'abc'"),
    (("--variant", "x=--preset zzz"), "--variant x: argument --preset: invalid choice: 'zzz'"),
    (("--variant", "x=--fixed-run-time-s 0"), "--variant x: --fixed-run-time-s: expected a number of seconds > 0, got 0"),
    (("--variant", "x=--ideal 'open"), "--variant x: its flags do not parse as a shell's words: No closing quotation"),
    (("--variant", "x=--ideal", "--variant", "x=--slos"), "--variant x: given twice"),
    (("--variant", "two words=--ideal"), "--variant: expected LABEL=FLAGS with a label of letters"),
    (("--variant=--ideal",), "--variant: expected LABEL=FLAGS"),
    # the sweep's own parameters go with its module: a variant naming another starts afresh, so
    # a variant's parameters for the sweep's module are checked against it
    (("--admission", "load", "--variant", "x=--admission-param hours=1"), "--variant x: --admission: admission plug-in 'load': its parameters"),
    # the checks of the sweep's own flags hold for the variants' as they combine with them
    (("--admission", "load", "--variant", "x=--ideal"), "--variant x: --ideal: cannot go with --admission: the fluid run has no rounds"),
    (("--placement", "spread", "--ideal"), "--ideal: cannot go with --placement: the fluid run has no rounds"),  # as simulate's
    (("--round-s", "60", "--ideal"), "--ideal: cannot go with --round-s: the fluid run has no rounds"),
]


@pytest.mark.parametrize(("argv", "message"), BAD, ids=[m.split(":")[1].strip()[:40] for _, m in BAD])
def test_a_bad_variant_is_one_line_naming_it_and_exit_2(argv, message, tmp_path, capsys):
    code, stdout, stderr = gavel(capsys, *SWEEP, *argv, "--out", str(tmp_path / "x"))
    assert (code, stdout, stderr.count("\n")) == (2, "", 1), stderr
    assert stderr.startswith(f"gavel: {message}"), stderr
    assert not (tmp_path / "x").exists()


def test_every_flag_of_sweep_either_varies_per_cell_or_is_shared():
    """A flag added to `gavel sweep` must be sorted into one or the other (sweep_variants.py)."""
    parser = build_parser(["sweep"])
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    flags = {s for action in commands.choices["sweep"]._actions for s in action.option_strings}
    varying = set(variant_flags())
    assert varying <= flags and not varying & set(SHARED_FLAGS)
    assert flags - varying == set(SHARED_FLAGS)
