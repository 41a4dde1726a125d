"""`gavel policy solve` and `gavel policy list`: allocations as JSON, bad input as one line."""

from __future__ import annotations

import copy
import json
import pathlib
import subprocess
import sys

import pytest

from services.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = json.loads((ROOT / "docs" / "examples" / "problem.json").read_text())


def solve(tmp_path: pathlib.Path, problem: object, *args: str) -> tuple[int, str, str]:
    path = tmp_path / "problem.json"
    path.write_text(problem if isinstance(problem, str) else json.dumps(problem))
    out = tmp_path / "out.json"
    code = main(["policy", "solve", "--input", str(path), "--output", str(out), *args])
    return code, out.read_text() if out.exists() else "", str(path)


@pytest.mark.parametrize("policy", ["max_min_fairness", "max_min_fairness_perf", "max_min_fairness_packed", "fifo_perf"])
def test_solve_writes_a_feasible_allocation(tmp_path, policy):
    code, text, _ = solve(tmp_path, EXAMPLE, "--policy", policy)
    assert code == 0
    result = json.loads(text)
    assert result["policy"] == policy and result["status"] == "optimal"
    counts = EXAMPLE["worker_types"]
    scale = {j["id"]: j.get("scale_factor", 1) for j in EXAMPLE["jobs"]}
    time_per_job = dict.fromkeys(scale, 0.0)
    used = dict.fromkeys(counts, 0.0)
    for entry in result["allocation"]:
        assert all(f >= 0 for f in entry["fractions"].values())
        for job in entry["jobs"]:
            time_per_job[job] += sum(entry["fractions"].values())
        for gpu_type, f in entry["fractions"].items():
            used[gpu_type] += f * scale[entry["jobs"][0]]  # a pair occupies its gang once
    assert all(t <= 1 + 1e-6 for t in time_per_job.values())
    assert all(used[k] <= counts[k] + 1e-6 for k in counts)


def _with(path: str, value: object) -> dict:
    problem = copy.deepcopy(EXAMPLE)
    target = problem
    *parents, leaf = path.split(".")
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    target[leaf] = value
    return problem


@pytest.mark.parametrize(
    ("problem", "message"),
    [
        (_with("jobs.0.job_type", "ResNet-51"), "jobs[0].job_type: unknown job type 'ResNet-51'"),
        (_with("jobs.1.throughputs", {"v100": float("nan"), "p100": 1, "k80": 1}), "jobs[1].throughputs.v100: NaN"),
        (_with("jobs.1.throughputs", {"v100": float("inf"), "p100": 1, "k80": 1}), "jobs[1].throughputs.v100"),
        (_with("jobs.1.throughputs", {"v100": -1.0, "p100": 1, "k80": 1}), "jobs[1].throughputs.v100"),
        (_with("jobs.3.scale_factor", 8), "jobs[3].scale_factor"),
        (_with("jobs.2.id", "1"), "jobs[2].id: duplicate job id '1'"),
        ("{not json", "--input: "),
    ],
)
def test_bad_input_is_one_line_naming_the_field_and_exit_2(tmp_path, capsys, problem, message):
    code, _, path = solve(tmp_path, problem, "--policy", "max_min_fairness_perf")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith(f"gavel: {message}"), err


def test_an_unknown_policy_lists_the_known_ones(tmp_path, capsys):
    code, _, _ = solve(tmp_path, EXAMPLE, "--policy", "max_min_fairnes")
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert line.startswith("gavel: unknown policy 'max_min_fairnes'; known policies: allox, fifo,")
    assert "max_min_fairness_packed" in line


def test_infeasible_slos_exit_3_with_the_reason_in_the_output(tmp_path):
    problem = _with("jobs.5.slo_s", 1.0)  # 8000 CycleGAN steps in one second
    code, text, _ = solve(tmp_path, problem, "--policy", "max_sum_throughput_normalized_by_cost_perf_SLOs")
    result = json.loads(text)
    assert code == 3
    assert result["status"] == "infeasible" and result["objective"] is None and "'6'" in result["reason"]


def test_the_command_itself_runs_and_lists_policies():
    out = subprocess.run(
        [sys.executable, "-m", "services.cli", "policy", "list", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr
    names = [p["name"] for p in json.loads(out.stdout)]
    assert {"max_min_fairness_perf", "max_min_fairness_packed", "gandiva", "allox", "proportional"} <= set(names)
