"""`gavel sweep`'s rates (Gavel's -a/-b/-n, -u, the cutoff file) and its resume, as a user runs it
(in-process through services.cli.main; the cells on local worker processes)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from services.cli import main

BASE = ("sweep", "--policies", "fifo,max_min_fairness_perf", "--jobs", "12", "--cluster", "2:2:2")


def gavel(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def rows(out) -> list[tuple[str, float, int]]:
    with (out / "sweep.csv").open() as f:
        return [(r["policy"], float(r["jobs_per_hour"]), int(r["seed"])) for r in csv.DictReader(f)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rates", "1", "--rate-start", "1"], "--rate-start: --rates and --rate-start exclude each other"),
        (["--rates", "1", "--until-saturated"], "--until-saturated: --rates and --until-saturated exclude each other"),
        ([], "--rates: say which rates"),
        (["--rate-stop", "4"], "--rate-start: an interval needs --rate-start A and --rate-stop B"),
        (["--rate-start", "4", "--rate-stop", "2", "--rate-count", "3"], "--rate-stop: 3 rates need --rate-stop > --rate-start"),
        (["--rate-start", "0", "--rate-stop", "2", "--rate-count", "0"], "--rate-count: expected a whole number >= 1"),
        (["--until-saturated", "1.5"], "--until-saturated: expected a utilisation in (0, 1]"),
        (["--rates", "1", "--cutoffs", "/nonexistent/cutoffs.json"], "--cutoffs: cannot read /nonexistent/cutoffs.json"),
        (["--rates", "1", "--amqp", "amqp://x"], "--amqp: names the broker of --bus amqp"),
        (["--rates", "1", "--bus", "amqp", "--processes", "4"], "--processes: with --bus amqp the cells run on `gavel serve simulator`"),
        # a seam's module every cell would fail on, on every simulator: refused before any is published
        # (a policy's package.module:Name is not: a simulator started with it runs it)
        (["--rates", "1", "--bus", "amqp", "--placement", "mechanism_service.core.seams.placement_builtins:Spread"],
         "--bus: amqp: mechanism_service.core.seams.placement_builtins:Spread names a module"),
    ],
)
def test_a_bad_range_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    code, stdout, stderr = gavel(capsys, *BASE, *argv, "--out", str(tmp_path / "x"))
    assert (code, stdout, stderr.count("\n")) == (2, "", 1)
    assert message in stderr
    assert not (tmp_path / "x").exists()


def test_cutoffs_that_leave_nothing_to_run_are_refused(tmp_path, capsys):
    cutoffs = tmp_path / "cutoffs.json"
    cutoffs.write_text(json.dumps({"2:2:2": {"fifo": 1, "max_min_fairness_perf": 0.5}}))
    code, _, stderr = gavel(capsys, *BASE, "--rates", "1,2", "--cutoffs", str(cutoffs), "--out", str(tmp_path / "x"))
    assert code == 2 and "--cutoffs: every rate is at or above its policy's cutoff" in stderr


@pytest.mark.slow  # ~6-12 s (the load): three sweeps of at most 4 cells of 12 jobs on worker processes
def test_an_interval_with_cutoffs_runs_gavels_points_and_a_second_run_redoes_nothing(tmp_path, capsys):
    out = tmp_path / "sweep"
    cutoffs = tmp_path / "cutoffs.json"
    cutoffs.write_text(json.dumps({"2:2:2": {"fifo": 2.0}, "36:36:36": {"max_min_fairness_perf": 1.0}}))
    argv = (*BASE, "--rate-start", "0", "--rate-stop", "3", "--rate-count", "4", "--cutoffs", str(cutoffs), "--out", str(out))
    code, _, stderr = gavel(capsys, *argv)
    assert code == 0, stderr
    # linspace(0, 3, 4) = 0, 1, 2, 3 without the 0; fifo stops below its cutoff of 2 jobs/hour
    rates = [float(r) for r in np.linspace(0, 3, 4)][1:]
    assert rows(out) == [("fifo", 1.0, 0), *[("max_min_fairness_perf", r, 0) for r in rates]]
    assert "--cutoffs leaves out 2 (policy, rate): fifo at 2, fifo at 3" in stderr
    ledger = (out / "cells.jsonl").read_text()
    assert len(ledger.splitlines()) == 4

    code, _, stderr = gavel(capsys, *argv)
    assert code == 0 and "4 cell(s) of this sweep already in the ledger: not run again" in stderr
    assert (out / "cells.jsonl").read_text() == ledger and "cells done" not in stderr
    assert rows(out) == [("fifo", 1.0, 0), *[("max_min_fairness_perf", r, 0) for r in rates]]

    # a cell lost from the ledger (as if the sweep had died before it) is the only one run again
    lines = ledger.splitlines()
    (out / "cells.jsonl").write_text("\n".join(lines[1:]) + "\n")
    code, _, stderr = gavel(capsys, *argv)
    assert code == 0 and "3 cell(s) of this sweep already" in stderr
    assert sum(line.startswith("[") for line in stderr.splitlines()) == 1


@pytest.mark.slow  # ~5-12 s (the load): the search of one policy on a 1-GPU cluster, cells of 12 jobs one after another
def test_until_saturated_runs_gavels_search_per_policy(tmp_path, capsys):
    out = tmp_path / "search"
    code, _, stderr = gavel(
        capsys, "sweep", "--policies", "fifo", "--until-saturated", "0.5", "--jobs", "12", "--cluster", "v100=1",
        "--out", str(out),
    )
    assert code == 0, stderr
    found = rows(out)
    ran = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    assert found[0] == ("fifo", 3600 / 32768, 0)
    # (1) doubling until a cell reaches the threshold; every cell before it below it
    first_saturated = next(i for i, r in enumerate(ran) if r["cluster_utilization"] >= 0.5)
    assert [r["jobs_per_hour"] for r in ran[: first_saturated + 1]] == [3600 / 32768 * 2**k for k in range(first_saturated + 1)]
    assert all(r["cluster_utilization"] < 0.5 for r in ran[:first_saturated])
    # (3) it ends past the knee: at a tenfold spread of average JCT or after 19 steps
    jcts = [r["avg_jct_s"] for r in ran]
    assert max(jcts) / min(jcts) >= 10 or len(ran) >= first_saturated + 1 + 19


def test_cutoffs_of_other_clusters_only_are_said_to_leave_nothing_out(tmp_path, capsys):
    """Gavel's file holds many clusters and the other clusters' entries are ignored; a file with
    none for this one (a cluster written another way than meant) says so instead of silence."""
    cutoffs = tmp_path / "cutoffs.json"
    cutoffs.write_text(json.dumps({"4:4:4": {"fifo": 1.5}}))
    code, _, stderr = gavel(capsys, *BASE, "--rates", "1", "--cutoffs", str(cutoffs), "--out", str(tmp_path / "x"))
    assert code == 0, stderr
    assert ("sweep: --cutoffs has no cutoff for fifo, max_min_fairness_perf on this cluster (2 v100, 2 p100, 2 k80): "
            "nothing is left out") in stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rates", "1"], "--jobs: say how many jobs each trace has (--jobs N), or measure a window (--window START:END"),
        (["--rates", "1", "--window", "6:2"], "--window 6:2: expected START:END, job positions from 0 with START < END"),
        (["--rates", "1", "--window", "4000:5000", "--jobs", "4500"],
         ("--jobs: 4500 jobs end before the window 4000:5000 does (its last job is 4999): give --jobs >= 5000, or leave "
          "--jobs out to generate jobs until the window's jobs finish, as Gavel does")),
    ],
)
def test_jobs_and_window_go_together_as_gavels_sweep_or_say_why_in_one_line(argv, message, tmp_path, capsys):
    code, stdout, stderr = gavel(capsys, "sweep", "--policies", "fifo", "--cluster", "2:2:2", *argv, "--out", str(tmp_path / "x"))
    assert (code, stdout, stderr.count("\n")) == (2, "", 1)
    assert message in stderr


# Gavel's README sweep, small: -s 2 -e 6 -p max_min_fairness max_min_fairness_perf --seeds 0 1 2 -c 2:2:2 -a 0 -b 0.1 -n 3
README_SMALL = (
    "sweep", "--window", "2:6", "--policies", "max_min_fairness", "max_min_fairness_perf", "--seeds", "0", "1", "2",
    "--cluster", "2:2:2", "--rate-start", "0", "--rate-stop", "0.1", "--rate-count", "3",
)


@pytest.mark.slow  # ~5-12 s (the load): 12 cells of a few jobs on worker processes, the same sweep printed from its ledger
def test_gavels_readme_sweep_runs_gavels_points_and_reports_each_point_over_its_seeds(tmp_path, capsys):
    from sim.plots import sweep_figure
    from tests.support.plots import band

    out = tmp_path / "readme"
    code, stdout, stderr = gavel(capsys, *README_SMALL, "--out", str(out), "--json")
    assert code == 0, stderr
    assert "= 12 cells, jobs drawn until jobs 2-5 finish (as Gavel's), on 2 v100" in stderr.splitlines()[0]
    # Gavel's points: linspace(0, 0.1, 3) without its 0, every policy and seed
    rates = [float(r) for r in np.linspace(0, 0.1, 3)][1:]
    policies, seeds = ["max_min_fairness", "max_min_fairness_perf"], [0, 1, 2]
    assert sorted(rows(out)) == sorted((p, r, s) for p in policies for r in rates for s in seeds)
    answer = json.loads(stdout)
    runs = {(r["policy"], r["jobs_per_hour"], r["seed"]): r for r in answer["runs"]}
    # every window job done, with the jobs that arrived before (0 and 1) and after it (as many as Gavel's run drew)
    assert all(r["jobs_measured"] == r["jobs_completed"] == 4 and r["jobs_arrived"] >= 6 for r in runs.values())
    # the table: a row per (policy, rate), its seeds' values, their mean, min and max
    table = answer["table"]
    assert [(row["policy"], row["jobs_per_hour"]) for row in table] == [(p, r) for p in policies for r in rates]
    for row in table:
        jcts = [runs[(row["policy"], row["jobs_per_hour"], s)]["avg_jct_s"] for s in seeds]
        assert [s["seed"] for s in row["seeds"]] == seeds and [s["avg_jct_s"] for s in row["seeds"]] == jcts
        assert (row["mean_avg_jct_s"], row["min_avg_jct_s"], row["max_avg_jct_s"]) == (pytest.approx(sum(jcts) / 3), min(jcts), max(jcts))
    # the plot's band over the seeds is the table's min to max
    with (out / "sweep.csv").open() as f:
        from sim.sweep_lines import SweepRow

        written = [SweepRow(r["policy"], float(r["jobs_per_hour"]), int(r["seed"]), float(r["avg_jct_s"])) for r in csv.DictReader(f)]
    (ax,) = sweep_figure(written).axes
    for i, policy in enumerate(policies):
        assert band(ax, i) == {
            row["jobs_per_hour"]: (row["min_avg_jct_s"] / 3600, row["max_avg_jct_s"] / 3600) for row in table if row["policy"] == policy
        }

    # the same command again runs nothing and prints the table: a line per (policy, rate)
    code, stdout, stderr = gavel(capsys, *README_SMALL, "--out", str(out))
    assert code == 0 and "12 cell(s) of this sweep already in the ledger" in stderr
    printed = stdout.splitlines()
    assert printed[0] == "average JCT of jobs 2-5 in hours, mean over the seeds (min, max), on 2 v100, 2 p100, 2 k80 (preset default)"
    assert printed[1].split() == ["policy", "jobs/hour", "seeds", "avg", "JCT", "min", "max", "utilisation"]
    by_row = {(line.split()[0], float(line.split()[1])): line.split()[2:6] for line in printed[3:7]}
    assert by_row == {
        (row["policy"], row["jobs_per_hour"]): ["3", *(f"{row[k] / 3600:.2f}" for k in ("mean_avg_jct_s", "min_avg_jct_s", "max_avg_jct_s"))]
        for row in table
    }


def test_a_trace_of_n_jobs_that_ran_out_before_the_window_finished_is_said(tmp_path, capsys):
    code, _, stderr = gavel(
        capsys, "sweep", "--policies", "max_min_fairness_perf", "--cluster", "2:2:2", "--window", "2:6", "--jobs", "6",
        "--rates", "0.1", "--out", str(tmp_path / "short"),
    )
    assert code == 0, stderr
    assert ("sweep: in 1 of 1 cells all 6 jobs had arrived before jobs 2-5 finished: Gavel draws jobs until they finish, so "
            "its runs would have measured them under more arrivals; leave --jobs out to do the same") in stderr
