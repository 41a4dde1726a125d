"""`gavel simulate`, `gavel sweep` and `gavel demo` as a user runs them (in-process through
services.cli.main): the files they write, what they print, and one line with exit 2 for every bad
input."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys

import pytest

from policy_service.service import shipped_context
from services.cli import main
from sim.progress import ProgressBar
from sim.traces import TraceJob, TraceSpec, TraceStreams, generate_trace, read_trace, write_trace
from tests.support.clock import SteppedClock
from tests.support.data import GAVEL_TRACES, REFERENCE

STATIC = str(REFERENCE / "static_n32_seed0.trace")
RECORDED = json.loads((REFERENCE / "results.json").read_text())["experiments"]["static_n32_seed0"]["policies"]
RUN_FILES = {"summary.json", "jobs.csv", "jct_cdf.png", "utilization.png", "queue.png"}


def gavel(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow  # ~2 s of CPU (2-5 s of wall on a loaded machine): a run with plots
def test_the_static_reference_trace_reproduces_gavels_average_jct(tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, _ = gavel(
        capsys, "simulate", "--trace", STATIC, "--cluster", "4:4:4", "--preset", "gavel",
        "--policy", "max_min_fairness_perf", "--out", str(out), "--json",
    )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["avg_jct_s"] == pytest.approx(RECORDED["max_min_fairness_perf"]["avg_jct_s"], rel=0.03)
    assert (summary["policy"], summary["preset"], summary["cluster"]) == ("max_min_fairness_perf", "gavel", {"v100": 4, "p100": 4, "k80": 4})
    assert {p.name for p in out.iterdir()} == RUN_FILES
    printed = json.loads(stdout)  # --json: summary.json's object on stdout, with where it went
    assert printed == {"out_dir": str(out), **summary}
    with (out / "jobs.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 32


@pytest.mark.slow  # ~2.5 s of CPU: a run per policy, plots drawn; then the same runs undrawn, for --json
def test_several_policies_write_a_comparison_and_print_its_table(tmp_path, capsys):
    policies = ["max_min_fairness", "max_min_fairness_perf"]
    out = tmp_path / "cmp"
    code, stdout, _ = gavel(
        capsys, "simulate", "--trace", STATIC, "--cluster", "v100=4,p100=4,k80=4", "--preset", "gavel",
        "--policies", ",".join(policies), "--out", str(out),
    )
    assert code == 0
    assert {"comparison.json", "comparison.txt", "comparison_jct_cdf.png", "comparison_utilization.png"} <= {
        p.name for p in out.iterdir()
    }
    for policy in policies:
        assert {p.name for p in (out / policy).iterdir()} == RUN_FILES
    comparison = json.loads((out / "comparison.json").read_text())
    assert [row["policy"] for row in comparison["rows"]] == policies
    table = (out / "comparison.txt").read_text()
    assert table in stdout  # the printed table is the one written
    for row in comparison["rows"]:
        assert row["avg_jct_h"] * 3600 == pytest.approx(RECORDED[row["policy"]]["avg_jct_s"], rel=0.10)

    code, stdout, _ = gavel(
        capsys, "simulate", "--trace", STATIC, "--cluster", "4:4:4", "--preset", "gavel",
        "--policies", ",".join(policies), "--out", str(tmp_path / "again"), "--json", "--no-plots",  # the same rows, undrawn
    )
    assert code == 0
    printed = json.loads(stdout)
    assert printed["rows"] == comparison["rows"] and list(printed["runs"]) == policies


def test_no_plots_writes_the_numbers_without_a_png(tmp_path, capsys):
    """Two policies (a comparison and its runs), about 5 s."""
    policies = ["max_min_fairness", "max_min_fairness_perf"]
    out = tmp_path / "cmp"
    code, stdout, _ = gavel(
        capsys, "simulate", "--trace", STATIC, "--cluster", "4:4:4", "--preset", "gavel",
        "--policies", ",".join(policies), "--out", str(out), "--no-plots",
    )
    assert code == 0
    assert {p.name for p in out.iterdir()} == {"comparison.json", "comparison.txt", *policies}
    for policy in policies:
        assert {p.name for p in (out / policy).iterdir()} == {"summary.json", "jobs.csv"}
    assert stdout.splitlines()[-2:] == [  # the files it lists are the ones written
        f"wrote {out}/: comparison.txt, comparison.json",
        f"  and per policy, in {out}/<policy>/: summary.json, jobs.csv",
    ]
    for row in json.loads((out / "comparison.json").read_text())["rows"]:
        assert row["avg_jct_h"] * 3600 == pytest.approx(RECORDED[row["policy"]]["avg_jct_s"], rel=0.10)


def test_no_plots_never_imports_matplotlib(tmp_path):
    """In a fresh interpreter (in this one, other tests have imported it): a few seconds."""
    child = (
        "import sys; from services.cli import main; "
        f"code = main(['simulate', '--trace', {STATIC!r}, '--cluster', '4:4:4', '--policy', 'fifo_perf', "
        f"'--out', {str(tmp_path / 'run')!r}, '--no-plots', '--json']); "
        "print(code, 'matplotlib' in sys.modules, file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert done.stderr.split() == ["0", "False"], done.stderr
    assert json.loads(done.stdout)["jobs_total"] == 32


@pytest.mark.slow  # ~2 s of CPU: the run on both engines (undrawn: only the numbers are compared)
def test_the_services_engine_gives_the_fast_paths_numbers(tmp_path, capsys):
    averages = {}
    for engine in ("fast", "services"):
        code, _, _ = gavel(
            capsys, "simulate", "--trace", STATIC, "--cluster", "4:4:4", "--policy", "max_min_fairness_packed",
            "--engine", engine, "--out", str(tmp_path / engine), "--no-plots",
        )
        assert code == 0
        averages[engine] = json.loads((tmp_path / engine / "summary.json").read_text())["avg_jct_s"]
    assert averages["services"] == averages["fast"]


def test_generation_options_make_gavels_trace_for_the_seed(tmp_path, capsys):
    """Two generated traces (24 and 10 jobs) simulated, undrawn: ~0.5 s."""
    out = tmp_path / "gen"
    code, stdout, _ = gavel(
        capsys, "simulate", "--jobs", "24", "--jobs-per-hour", "3", "--multi-gpu", "--trace-seed", "3",
        "--cluster", "8:8:8", "--policy", "fifo_perf", "--window", "4:20", "--out", str(out), "--json", "--no-plots",
    )
    assert code == 0
    table = shipped_context().table
    expected = generate_trace(TraceSpec(24, 3.0, multi_gpu=True), table, TraceStreams.gavel(3))
    assert read_trace(out / "trace.trace") == expected  # saved, so the run can be repeated with --trace
    assert any(job.scale_factor > 1 for job in expected)
    summary = json.loads(stdout)
    assert (summary["jobs_total"], summary["jobs_measured"], summary["jobs_completed"]) == (24, 16, 16)

    code, stdout, _ = gavel(
        capsys, "simulate", "--jobs", "10", "--static", "--cluster", "2:2:2", "--policy", "max_min_fairness",
        "--seed", "1", "--out", str(tmp_path / "static"), "--json", "--no-plots",
    )
    assert code == 0
    assert {job.arrival_time_s for job in read_trace(tmp_path / "static" / "trace.trace")} == {0.0}
    assert json.loads(stdout)["seed"] == 1


@pytest.fixture
def unknown_type_trace(tmp_path):
    path = tmp_path / "mystery.jsonl"
    jobs = [
        TraceJob("0", "ResNet-18 (batch size 64)", 1000, 1, 0.0),
        TraceJob("1", "Mystery model (batch size 7)", 1000, 1, 0.0),
        TraceJob("2", "Mystery model (batch size 7)", 1000, 1, 0.0),
    ]
    write_trace(jobs, path)
    return str(path)


BAD_INPUTS = [
    (["--trace", STATIC, "--cluster", "4:4:4", "--policy", "las"], "--policy: unknown policy 'las' (known: allox, fifo,"),
    (["--trace", STATIC, "--cluster", "4:4:4", "--policies", "fifo,nope"], "unknown policy 'nope'"),
    (["--trace", STATIC, "--cluster", "4:4:4", "--policy", "fifo,isolated"], "--policy: one policy only; for several side by side: --policies fifo,isolated"),
    (["--trace", STATIC, "--cluster", "4:4:4", "--policies", "fifo,fifo"], "fifo is listed twice"),
    (["--trace", STATIC, "--cluster", "4:4:4", "--policy", "fifo", "--policies", "fifo_perf"], "--policy: one policy, or --policies A,B,... to compare several: not both"),
    (["--trace", STATIC, "--cluster", "4:4", "--policy", "fifo"], "--cluster 4:4: Gavel's form is v100:p100:k80"),
    (["--trace", STATIC, "--cluster", "v100=four", "--policy", "fifo"], "'four' is not a whole number of GPUs"),
    (["--trace", STATIC, "--cluster", "h100=8", "--policy", "fifo"], "'h100' is not in the throughput table (known: k80, p100, v100)"),
    (["--trace", STATIC, "--cluster", "v100_unconsolidated=4", "--policy", "fifo"], "'v100_unconsolidated' is the table's steps/s of a gang spread over servers, not an accelerator type"),
    (["--trace", STATIC, "--cluster", "0:0:0", "--policy", "fifo"], "the cluster has no GPU"),
    (["--trace", STATIC, "--cluster", "4:4:4", "--policy", "fifo", "--window", "0:33"], "--window 0:33: out of range: the trace has 32 jobs"),
    (["--trace", STATIC, "--cluster", "4:4:4", "--policy", "fifo", "--window", "7"], "expected START:END"),
    (["--trace", "/no/such.trace", "--cluster", "4:4:4", "--policy", "fifo"], "--trace: /no/such.trace: cannot read"),
    (["--trace", "UNKNOWN", "--cluster", "4:4:4", "--policy", "fifo"], "2 of 3 jobs have a job type the throughput table does not know: 'Mystery model (batch size 7)' (2 jobs)"),
    (["--trace", str(GAVEL_TRACES / "msr" / "seed=0" / "0e4a51.trace"), "--cluster", "36:36:36", "--policy", "fifo"],
     "197 of 1181 jobs have a (job type, scale factor) the throughput table cannot size: 'Recommendation (batch size 512)' x4 (20 jobs)"),
    (["--jobs", "20", "--static", "--multi-gpu", "--cluster", "2:2:2", "--policy", "fifo"], "jobs can never run on this cluster"),
    (["--trace", STATIC, "--jobs", "5", "--static", "--cluster", "4:4:4", "--policy", "fifo"], "exclude each other"),
    (["--jobs", "5", "--cluster", "4:4:4", "--policy", "fifo"], "gavel: missing --jobs-per-hour R or --static (how the generated jobs arrive"),
    (["--jobs", "5", "--static", "--jobs-per-hour", "2", "--cluster", "4:4:4", "--policy", "fifo"], "--jobs-per-hour: cannot go with --static"),
    (["--cluster", "4:4:4", "--policy", "fifo"], "gavel: missing the jobs (--trace FILE, or --jobs N with --jobs-per-hour R or --static)\n"),
    (["--static", "--cluster", "4:4:4", "--policy", "fifo"], "gavel: missing --jobs N (how many jobs to generate)\n"),
    (["--jobs", "5", "--static", "--seed", "-1", "--cluster", "4:4:4", "--policy", "fifo"], "--seed: the trace's seed must be a whole number >= 0, got -1"),
    (["--trace", STATIC, "--cluster", "6:6:6", "--gpus-per-server", "4", "--policy", "fifo"], "do not fill servers of"),
    (["--trace", STATIC, "--cluster", "4:4:4", "--round-s", "0", "--policy", "fifo"], "--round-s: expected a number of seconds > 0"),
    (["--trace", STATIC, "--cluster", "4:4:4", "--throughputs", "/no/table.json", "--policy", "fifo"], "--throughputs: cannot read"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_INPUTS, ids=[m[:40] for _, m in BAD_INPUTS])
def test_a_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys, unknown_type_trace):
    argv = [unknown_type_trace if a == "UNKNOWN" else a for a in argv]
    code, stdout, stderr = gavel(capsys, "simulate", *argv, "--out", str(tmp_path / "never"))
    assert code == 2
    assert stdout == ""
    assert stderr.startswith("gavel: ") and stderr.count("\n") == 1, stderr
    assert message in stderr
    assert not (tmp_path / "never").exists()  # refused before any work


MISSING_POLICY = "--policy NAME (gavel policy list; or --policies A,B,... to compare several)"
MISSING_CLUSTER = "--cluster SPEC (GPUs per type: v100=4,p100=4,k80=4, or Gavel's 4:4:4)"
MISSING_JOBS = "the jobs (--trace FILE, or --jobs N with --jobs-per-hour R or --static)"

# A new user's careless invocations (issue 23): a wrong value is reported as itself whatever is
# missing besides; what is missing comes after, every missing flag in one line.
CARELESS = [
    ([], f"gavel: missing {MISSING_JOBS}; {MISSING_POLICY}; {MISSING_CLUSTER}"),
    (["--jobs", "10", "--static"], f"gavel: missing {MISSING_POLICY}; {MISSING_CLUSTER}"),
    (["--jobs", "10", "--static", "--cluster", "4:4:4"], f"gavel: missing {MISSING_POLICY}"),
    (["--trace", STATIC, "--policy", "fifo"], f"gavel: missing {MISSING_CLUSTER}"),
    (["--jobs", "10", "--static", "--cluster", "4:4"], "gavel: --cluster 4:4: Gavel's form is v100:p100:k80, three GPU counts"),
    (["--jobs", "10", "--static", "--cluster", "tpu=3"], "gavel: --cluster tpu=3: 'tpu' is not in the throughput table (known: k80, p100, v100)"),
    (["--trace", "/no/such.trace", "--cluster", "4:4:4"], "gavel: --trace: /no/such.trace: cannot read: No such file or directory"),
    (["--trace", "/no/such.trace"], "gavel: --trace: /no/such.trace: cannot read: No such file or directory"),
    (["--jobs", "0", "--static"], "gavel: --jobs: expected a whole number >= 1, got 0"),
    (["--jobs", "10", "--jobs-per-hour", "-2"], "gavel: --jobs-per-hour: expected a number > 0, got -2"),
    (["--jobs", "10", "--static", "--policy", "nope"], "gavel: --policy: unknown policy 'nope' (known: allox, fifo,"),
    (["--jobs", "10", "--static", "--faults", "mix", "--engine", "fast"], "gavel: --faults: needs --engine services"),
    (["--jobs", "10", "--static", "--fault-seed", "3"], "gavel: --fault-seed: needs --faults"),
    (["--jobs", "10", "--static", "--round-s", "0"], "gavel: --round-s: expected a number of seconds > 0, got 0"),
    (["--jobs", "10", "--static", "--throughputs", "/no/table.json"], "gavel: --throughputs: cannot read /no/table.json"),
]


@pytest.mark.parametrize(("argv", "line"), CARELESS, ids=[" ".join(a) or "nothing" for a, _ in CARELESS])
def test_a_careless_invocation_gets_its_own_error_first_and_every_missing_flag_in_one_line(argv, line, tmp_path, capsys):
    code, stdout, stderr = gavel(capsys, "simulate", *argv, "--out", str(tmp_path / "never"))
    assert (code, stdout, stderr.count("\n")) == (2, "", 1), stderr
    assert stderr.startswith(line), stderr
    assert not (tmp_path / "never").exists()


@pytest.mark.slow  # ~5-8 s: a sweep on worker processes
def test_a_sweep_runs_the_grid_on_worker_processes(tmp_path, capsys):
    out = tmp_path / "sweep"
    code, stdout, stderr = gavel(
        capsys, "sweep", "--policies", "max_min_fairness_perf", "--rates", "1,3", "--seeds", "2", "--jobs", "12",
        "--cluster", "2:2:2", "--processes", "2", "--out", str(out),
    )
    assert code == 0
    with (out / "sweep.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["policy"], float(r["jobs_per_hour"]), int(r["seed"])) for r in rows] == [
        ("max_min_fairness_perf", 1.0, 2),
        ("max_min_fairness_perf", 3.0, 2),
    ]
    assert all(float(r["avg_jct_s"]) > 0 for r in rows)
    assert (out / "sweep_jct.png").stat().st_size > 0
    assert sum(line.startswith("[") for line in stderr.splitlines()) == 2  # one line per finished run
    assert "jobs/hour" in stdout and "max_min_fairness_perf" in stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rates", "1,fast"], "--rates: 'fast' is not a number of jobs per hour > 0"),
        (["--rates", "1", "--seeds", "0,-3"], "--seeds: '-3' is not a whole number >= 0"),
        (["--rates", "1", "--window", "0:13"], "--jobs: 12 jobs end before the window 0:13 does"),
        (["--rates", "1", "--processes", "0"], "--processes: expected a whole number >= 1"),
    ],
)
def test_a_bad_sweep_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    code, stdout, stderr = gavel(
        capsys, "sweep", "--policies", "fifo", "--jobs", "12", "--cluster", "2:2:2", *argv, "--out", str(tmp_path / "x")
    )
    assert (code, stdout, stderr.count("\n")) == (2, "", 1)
    assert message in stderr


@pytest.mark.slow  # ~4 s of CPU (5-10 s of wall): gavel demo's three runs of 12 jobs on the services, plots drawn
def test_the_demo_prints_the_comparison_and_the_winner(tmp_path, capsys):
    out = tmp_path / "demo"
    code, stdout, _ = gavel(capsys, "demo", "--jobs", "12", "--out", str(out))  # the default 300's output, on fewer jobs
    assert code == 0
    policies = ["max_min_fairness", "max_min_fairness_perf", "max_min_fairness_packed"]
    comparison = json.loads((out / "comparison.json").read_text())
    assert [row["policy"] for row in comparison["rows"]] == policies
    assert (out / "comparison.txt").read_text() in stdout
    assert f"plots and files in {out}/" in stdout
    averages = {row["policy"]: row["avg_jct_h"] for row in comparison["rows"]}
    best = min(averages, key=averages.__getitem__)
    assert f"{best} wins: average JCT {averages[best]:.2f} h" in stdout


def test_the_progress_bar_redraws_on_a_terminal_and_stays_quiet_elsewhere():
    clock = SteppedClock(0.0)
    terminal = io.StringIO()
    bar = ProgressBar("fifo", terminal, interactive=True, clock=clock.now_s)
    for step in range(1, 5):
        clock.advance(0.5)
        bar(step * 3600.0, step, 4)
    bar.close()
    assert terminal.getvalue().count("\r") == 5 and terminal.getvalue().endswith("\n")
    assert "4/4 jobs, 4.0 h simulated" in terminal.getvalue()

    clock = SteppedClock(0.0)
    log = io.StringIO()
    bar = ProgressBar("fifo", log, interactive=False, clock=clock.now_s)
    for step in range(1, 31):
        clock.advance(1.0)
        bar(step * 3600.0, step, 30)
    bar.close()
    assert log.getvalue().splitlines() == [
        "fifo [########----------------] 10/30 jobs, 10.0 h simulated, 10.0 s",
        "fifo [################--------] 20/30 jobs, 20.0 h simulated, 20.0 s",
        "fifo [########################] 30/30 jobs, 30.0 h simulated, 30.0 s",
    ]


@pytest.mark.slow  # ~5-8 s: a run with plots
def test_plots_that_cannot_be_drawn_end_the_run_with_one_line_after_its_results(tmp_path, capsys):
    """A file in the way of a plot (here a directory named jct_cdf.png): the results are
    printed and written, every other plot is drawn, and the run ends with exit 1 and one line
    (no traceback, neither the plot process's nor this one's)."""
    out = tmp_path / "run"
    (out / "jct_cdf.png").mkdir(parents=True)
    code, stdout, stderr = gavel(
        capsys, "simulate", "--trace", STATIC, "--cluster", "4:4:4", "--policy", "max_min_fairness_perf", "--out", str(out),
    )
    assert code == 1
    assert "max_min_fairness_perf" in stdout  # the results came first
    assert stderr.startswith("gavel: the plots could not be drawn (IsADirectoryError:")
    assert stderr.count("\n") == 1 and "Traceback" not in stderr
    assert f"the other files are in {out} (--no-plots skips the plots)" in stderr
    assert {"summary.json", "jobs.csv", "utilization.png", "queue.png"} <= {p.name for p in out.iterdir()}
    assert (out / "queue.png").stat().st_size > 0 and (out / "utilization.png").stat().st_size > 0


@pytest.mark.slow  # ~4-6 s: a run with plots in a process
def test_an_mplbackend_matplotlib_does_not_know_does_not_stop_the_plots(tmp_path):
    """The plots are drawn on Agg canvases whatever MPLBACKEND says (a user's interactive
    setting); the variable is left as it was."""
    code = (
        "import os, sim.plots; "
        "from sim.plot_process import draw_on_two_cores; "
        "from tests.sim.test_plots import toy_run; "
        f"work = [('plot_jct_cdf', (toy_run(), {str(tmp_path / 'jct.png')!r})), ('plot_queue', (toy_run(), {str(tmp_path / 'queue.png')!r}))]; "
        "assert draw_on_two_cores(work) == 0; "
        "print(os.environ['MPLBACKEND'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        env={**os.environ, "MPLBACKEND": "no-such-backend"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no-such-backend"
    assert (tmp_path / "jct.png").stat().st_size > 0 and (tmp_path / "queue.png").stat().st_size > 0


def test_a_sweep_whose_plot_cannot_be_drawn_keeps_its_csv_and_ends_with_one_line(tmp_path, capsys):
    """About 4 s (one run on a worker process)."""
    out = tmp_path / "sweep"
    (out / "sweep_jct.png").mkdir(parents=True)
    code, stdout, stderr = gavel(
        capsys, "sweep", "--policies", "fifo", "--rates", "2", "--jobs", "12", "--cluster", "2:2:2",
        "--processes", "1", "--out", str(out),
    )
    assert code == 1
    assert f"wrote {out / 'sweep.csv'}\n" in stdout and "sweep_jct.png" not in stdout
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("gavel: the plots could not be drawn (IsADirectoryError:") and last.endswith(f"are in {out}")
    assert "Traceback" not in stderr
    with (out / "sweep.csv").open() as f:
        assert [r["policy"] for r in csv.DictReader(f)] == ["fifo"]


@pytest.mark.slow  # ~4-7 s: gavel simulate in a process without ecos
def test_preset_gavel_without_ecos_is_refused_at_start_naming_the_package(tmp_path):
    """A plain `pip install` has no ECOS (an extra): made to fail to import in a fresh interpreter.
    Preset gavel's convex policies are refused at once in one line (exit 2) instead of every
    solve failing and the run ending with "jobs ... can never be scheduled"; a policy that solves
    with no solver still runs. About 4 s (cvxpy's import, then a 5-job run)."""
    child = (
        "import sys; sys.modules['ecos'] = None\n"
        "from services.cli import main\n"
        "base = ['simulate', '--preset', 'gavel', '--jobs', '5', '--static', '--cluster', '1:1:1', '--no-plots', '--json']\n"
        f"print(main(base + ['--policy', 'max_min_fairness_perf', '--out', {str(tmp_path / 'refused')!r}]), file=sys.stderr)\n"
        f"print(main(base + ['--policy', 'fifo', '--out', {str(tmp_path / 'fifo')!r}]), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    refusal, refused_code, fifo_code = done.stderr.splitlines()
    assert (refused_code, fifo_code) == ("2", "0"), done.stderr
    assert refusal.startswith(
        "gavel: --preset gavel: max_min_fairness_perf cannot solve under it here: the solver ECOS is not installed: "
        "pip install 'gavel-scheduler[ecos]' (or: pip install ecos); installed cvxpy solvers: "
    )
    assert not (tmp_path / "refused").exists()
    assert json.loads(done.stdout)["jobs_completed"] == 5


def test_a_run_whose_every_solve_fails_says_the_policys_reason_not_that_the_cluster_cannot_run_it():
    from mechanism_service.core.settings import preset
    from sim.clock import SimulationStalled
    from sim.fastpath import RunConfig, simulate

    jobs = [TraceJob(str(i), "ResNet-18 (batch size 64)", 1000, 1, 0.0) for i in range(3)]
    # Under preset gavel a run that never gets an allocation schedules nothing (the default preset
    # still runs the jobs without one), as a missing ECOS did
    config = RunConfig("max_min_fairness_perf", {"v100": 1}, preset("gavel", "max_min_fairness_perf"), solver="nonsense")
    with pytest.raises(SimulationStalled) as stalled:
        simulate(jobs, config, shipped_context())
    assert str(stalled.value).startswith(
        "t=0.0 s: jobs 0, 1, 2 were never scheduled: the policy failed: unknown solver 'nonsense'; installed cvxpy solvers:"
    )


def test_the_services_engine_too_says_the_policys_reason_when_every_solve_fails():
    import asyncio

    from common.errors import ServiceError
    from mechanism_service.core.settings import preset
    from sim.driver import simulate_services
    from sim.fastpath import RunConfig

    jobs = [TraceJob(str(i), "ResNet-18 (batch size 64)", 1000, 1, 0.0) for i in range(3)]
    config = RunConfig("max_min_fairness_perf", {"v100": 1}, preset("gavel", "max_min_fairness_perf"), solver="nonsense")
    with pytest.raises(ServiceError, match=r"jobs 0, 1, 2 were never scheduled: the policy failed: unknown solver 'nonsense'"):
        asyncio.run(simulate_services(jobs, config, shipped_context()))


@pytest.mark.slow  # ~5-8 s: a run with faults on the services
def test_a_fault_runs_service_events_go_to_a_log_file_not_over_the_progress_bar(tmp_path, capsys):
    """Issue 23: the services' logs of injected faults (a crash's traceback among them) were
    printed into the progress display. They go to DIR/simulation.log, and the run's last line
    says where and how many. About 3 s (12 jobs, a mechanism crash and a worker crash)."""
    out = tmp_path / "faults"
    code, stdout, stderr = gavel(
        capsys, "simulate", "--jobs", "12", "--jobs-per-hour", "20", "--cluster", "2:2:2", "--policy",
        "max_min_fairness_perf", "--faults", "mechanism-crash=1,worker-crash=1", "--fault-seed", "7",
        "--out", str(out), "--no-plots",
    )
    assert code == 0
    assert "{" not in stderr and "Traceback" not in stderr + stdout, stderr
    events = [json.loads(line) for line in (out / "simulation.log").read_text().splitlines()]
    levels = {(e["event"], e["level"]) for e in events}
    assert {("round_loop_crashed", "error"), ("mechanism_restarting", "warning"), ("worker_lost", "warning")} <= levels
    crash = next(e for e in events if e["event"] == "round_loop_crashed")
    assert "InjectedCrash" in crash["exception"]  # the whole account is in the file
    errors = sum(e["level"] == "error" for e in events)
    warnings = sum(e["level"] == "warning" for e in events)
    assert stdout.splitlines()[-2:] == [
        f"wrote {out}/: summary.json, jobs.csv, faults.json, gpu_occupancy.csv",
        f"the services' log of the run: {out / 'simulation.log'} ({errors} error{'s' * (errors != 1)}, "
        f"{warnings} warning{'s' * (warnings != 1)}; the services' account of the injected faults)",
    ]
