"""The example plug-in package (examples/gavel-example-plugins) installed and run from the command
line as a user runs it: `gavel simulate` (both engines), `gavel sweep` (its worker processes
resolve the spec), `gavel policy solve` and `gavel policy list`, by entry point and by
package.module:Name; a broken plug-in refused in one line naming it, exit 2, before anything runs.

The package is pip-installed once into a temporary directory (the project's venv is not changed).
The commands run in-process (services.cli.main) with that directory on sys.path, where
importlib.metadata finds the entry points as it does on PYTHONPATH; the sweeps' worker processes
are real (spawned, they resolve the spec again). `gavel policy solve`/`list` and one refusal run
as processes on PYTHONPATH, as a user's do: a fresh interpreter, its whole stderr one line.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from services.cli import main
from tests.support.example_plugins import (
    POLICY_ENTRY_POINT,
    POLICY_REFERENCE,
)

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("--jobs", "8", "--static", "--multi-gpu", "--cluster", "v100=8,p100=8,k80=8", "--gpus-per-server", "4")


@pytest.fixture
def plugged(on_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example plug-ins found in this process, and no GAVEL_ setting of the test run's."""
    for name in [k for k in os.environ if k.startswith("GAVEL_")]:
        monkeypatch.delenv(name)
    return on_path


def gavel(capfd: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`gavel ARGV` in this process: its exit code, stdout and stderr (file descriptors: what a
    sweep's worker processes write too)."""
    code = main(list(argv))
    out, err = capfd.readouterr()
    return code, out, err


def gavel_process(example_plugins: Path, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """`gavel ARGS` as a user's process, the plug-ins on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAVEL_")}
    env["PYTHONPATH"] = str(example_plugins)
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args], check=False, cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=timeout_s,
    )


def jobs_csv(out: Path) -> list[dict[str, str]]:
    with (out / "jobs.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # ~2 s of CPU: four 8-job simulations in-process, one on the services engine
def test_simulate_runs_the_example_policy_by_entry_point_and_by_module_reference(plugged: Path, tmp_path: Path, capfd) -> None:
    """The same schedule by either name and on either engine; the plug-in's own (not FIFO's)."""
    runs = {}
    for label, policy, engine in (
        ("entry", POLICY_ENTRY_POINT, "fast"), ("module", POLICY_REFERENCE, "fast"),
        ("services", POLICY_REFERENCE, "services"), ("fifo", "fifo", "fast"),
    ):
        out = tmp_path / label
        code, _, stderr = gavel(capfd, "simulate", *GENERATED, "--policy", policy, "--engine", engine, "--out", str(out), "--no-plots")
        assert code == 0, stderr
        summary = json.loads((out / "summary.json").read_text())
        assert summary["policy"] == policy and summary["jobs_completed"] == 8
        runs[label] = [(r["job_id"], r["start_s"], r["completion_s"]) for r in jobs_csv(out)]
    assert runs["entry"] == runs["module"] == runs["services"]
    assert runs["entry"] != runs["fifo"]


@pytest.mark.slow  # ~1.5 s of CPU (2-5 s of wall on a loaded machine): a sweep of 3 runs on 2 spawned worker processes
def test_sweep_resolves_the_plugin_in_its_worker_processes(plugged: Path, tmp_path: Path, capfd) -> None:
    out = tmp_path / "sweep"
    code, _, stderr = gavel(
        capfd, "sweep", "--policies", f"{POLICY_ENTRY_POINT},{POLICY_REFERENCE},fifo", "--rates", "4", "--jobs", "8",
        "--cluster", "2:2:2", "--processes", "2", "--out", str(out),
    )
    assert code == 0, stderr
    with (out / "sweep.csv").open() as f:
        jct = {row["policy"]: float(row["avg_jct_s"]) for row in csv.DictReader(f)}
    assert set(jct) == {POLICY_ENTRY_POINT, POLICY_REFERENCE, "fifo"}
    assert jct[POLICY_ENTRY_POINT] == jct[POLICY_REFERENCE] != jct["fifo"]


def test_policy_solve_and_list_take_the_plugin(example_plugins: Path, tmp_path: Path) -> None:
    """As processes on PYTHONPATH, as a user runs them: ~1 s of CPU (two interpreters)."""
    out = tmp_path / "allocation.json"
    problem = ROOT / "docs" / "examples" / "problem.json"
    done = gavel_process(example_plugins, "policy", "solve", "--policy", POLICY_REFERENCE, "--input", str(problem), "--output", str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["status"] == "optimal" and result["policy"] == "weighted_share"
    assert all(0 <= sum(entry["fractions"].values()) <= 1 + 1e-9 for entry in result["allocation"])
    listing = gavel_process(example_plugins, "policy", "list", "--json")
    rows = {row["name"]: row["summary"] for row in json.loads(listing.stdout)}
    assert rows[POLICY_ENTRY_POINT] == f"installed plug-in ({POLICY_REFERENCE})"
    assert "max_min_fairness_perf" in rows


BROKEN = [
    ("plugb_broken_import:Anything",
     "module 'plugb_broken_import' does not import: ModuleNotFoundError: No module named 'plugb_no_such_dependency'"),
    ("plugb_broken_policies:WrongSignature", "allocate() cannot be called as allocate(problem)"),
    ("plugb_broken_policies:Missing", "module 'plugb_broken_policies' has no attribute 'Missing'"),
]


def refusals(spec: str, tmp_path: Path) -> dict[str, tuple[str, ...]]:
    """The commands that must refuse ``spec``, by the flag that names it."""
    return {
        "--policy": ("simulate", *GENERATED, "--policy", spec, "--out", str(tmp_path / "run")),
        "--policies": ("sweep", "--policies", f"fifo,{spec}", "--rates", "4", "--jobs", "4", "--cluster", "2:2:2",
                       "--out", str(tmp_path / "sweep")),
    }


@pytest.mark.parametrize(("spec", "reason"), BROKEN)
def test_a_broken_plugin_is_refused_in_one_line_by_every_command(plugged: Path, tmp_path: Path, capfd, spec: str, reason: str) -> None:
    """In-process, a few hundredths of a second each (the refusal comes before anything runs)."""
    for flag, argv in refusals(spec, tmp_path).items():
        code, stdout, stderr = gavel(capfd, *argv)
        line = stderr.strip()
        assert (code, stdout) == (2, "") and "\n" not in line, stderr
        assert line.startswith(f"gavel: {flag}: policy plug-in {spec!r}: {reason}"), line
    # the services refuse it at start, before they reach a broker
    for argv in (("serve", "policy", "--policy", spec), ("serve", "mechanism", "--policy", spec, "--no-journal")):
        code, _, stderr = gavel(capfd, *argv, "--broker-wait-s", "0", "--amqp", "amqp://guest:guest@127.0.0.1:1/")
        assert code == 2, stderr
        assert f"gavel: --policy: policy plug-in {spec!r}: {reason}" in stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


def test_a_broken_plugin_is_refused_by_a_users_process_in_its_one_line(example_plugins: Path, tmp_path: Path) -> None:
    """What the process writes to stderr as a whole (a fresh interpreter's imports, its logging)
    is the one line, for `gavel simulate` and `gavel sweep` alike. ~1 s: two processes that stop
    before running anything."""
    spec, reason = BROKEN[0]
    for flag, argv in refusals(spec, tmp_path).items():
        done = gavel_process(example_plugins, *argv)
        line = done.stderr.strip()
        assert (done.returncode, done.stdout) == (2, "") and "\n" not in line, done.stderr
        assert line.startswith(f"gavel: {flag}: policy plug-in {spec!r}: {reason}"), line
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


@pytest.mark.slow  # ~1 s of CPU: two 8-job simulations in-process
def test_a_plugin_raising_in_allocate_costs_answers_not_the_run(plugged: Path, tmp_path: Path, capfd) -> None:
    """The plug-in answers while one job is known and raises once more arrive: the run keeps the
    last allocation (jobs it leaves out run on the GPUs it leaves idle), every job completes on
    either engine, and the run's log says so once, naming the plug-in and what it raised."""
    spec = "plugb_broken_policies:RaisesOnSecondJob"
    pattern = re.compile(rf"policy plug-in {re.escape(repr(spec))}: allocate raised RuntimeError: cannot share between [2-8] jobs")
    for engine in ("fast", "services"):
        out = tmp_path / engine
        code, stdout, stderr = gavel(
            capfd, "simulate", *GENERATED, "--policy", spec, "--engine", engine, "--out", str(out), "--no-plots",
        )
        assert code == 0, stderr
        assert json.loads((out / "summary.json").read_text())["jobs_completed"] == 8
        assert f"the services' log of the run: {out / 'simulation.log'}" in stdout
        events = [json.loads(line) for line in (out / "simulation.log").read_text().splitlines()]
        degraded = [e for e in events if e["event"] == "allocation_degraded"]
        assert len(degraded) == 1 and pattern.fullmatch(str(degraded[0]["error"])), degraded  # said once
    events = [json.loads(line) for line in (tmp_path / "services" / "simulation.log").read_text().splitlines()]
    failed = [e for e in events if e["event"] == "allocation_failed" and e["service"] == "mechanism"]
    assert failed and all(pattern.fullmatch(e["reason"]) for e in failed), failed[:3]


SEAMS_BY_ENTRY_POINT = ("--placement", "fewest_servers", "--admission", "per_entity_jobs", "--admission-param", "max_jobs=2")
SEAMS_BY_REFERENCE = (
    "--placement", "gavel_example_plugins.placement:FewestServers",
    "--admission", "gavel_example_plugins.admission:PerEntityJobs", "--admission-param", "max_jobs=2",
)


def most_at_once(rows: list[dict[str, str]]) -> int:
    """The most jobs between their first start and their completion at one time (each inside the
    time it was scheduled, so never more than were scheduled)."""
    events = sorted([(float(r["start_s"]), 1) for r in rows] + [(float(r["completion_s"]), -1) for r in rows])
    running = most = 0
    for _, step in events:  # an end sorts before a start at the same instant
        running += step
        most = max(most, running)
    return most


@pytest.mark.slow  # ~3 s of CPU: three simulations in-process, three sweeps of two runs on one worker process each
def test_simulate_and_sweep_take_the_example_placement_and_admission(plugged: Path, tmp_path: Path, capfd) -> None:
    """per_entity_jobs with max_jobs=2 (a generated trace's jobs have no entity: one entity)
    keeps at most 2 jobs running at once where accept-all runs more; by entry point and by
    module:Name the same schedule, in `gavel simulate` and in `gavel sweep` (its worker process
    resolves the seams again)."""
    runs = {}
    for label, seams in (("entry", SEAMS_BY_ENTRY_POINT), ("module", SEAMS_BY_REFERENCE), ("default", ())):
        out = tmp_path / label
        code, _, stderr = gavel(
            capfd, "simulate", *GENERATED, "--policy", "max_min_fairness_perf", *seams, "--out", str(out), "--no-plots",
        )
        assert code == 0, stderr
        runs[label] = jobs_csv(out)
        assert len(runs[label]) == 8 and all(r["completion_s"] for r in runs[label])
    assert runs["entry"] == runs["module"]
    assert most_at_once(runs["entry"]) == 2 < most_at_once(runs["default"])

    sweeps = {}
    for label, seams in (("entry", SEAMS_BY_ENTRY_POINT), ("module", SEAMS_BY_REFERENCE), ("default", ())):
        out = tmp_path / f"sweep-{label}"
        code, _, stderr = gavel(
            capfd, "sweep", "--policies", "fifo,max_min_fairness_perf", "--rates", "4", "--jobs", "8", "--cluster", "2:2:2",
            "--processes", "1", *seams, "--out", str(out),
        )
        assert code == 0, stderr
        sweeps[label] = (out / "sweep.csv").read_text()
    assert sweeps["entry"] == sweeps["module"] != sweeps["default"]  # the cap reaches the sweep's workers
