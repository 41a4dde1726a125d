"""A solver name is checked where a policy is built: `gavel policy solve --solver X` and a policy
service request with solver X both refuse an unknown X as bad input (exit 2 / AllocationFailed
naming it), instead of solving, failing inside cvxpy and reporting "no feasible allocation"."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import cvxpy as cp
import pytest

from common.errors import PolicyParameterError
from common.messages import AllocationComputed, AllocationFailed, AllocationRequested, PolicyJob, PolicyProblem
from policy_service.answer import answer
from policy_service.core import make_policy
from policy_service.service import shipped_context
from services.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "problem.json"
# Every family whose constructor takes a solver, under one of its Gavel names.
CONVEX = (
    "max_min_fairness_perf",
    "max_min_fairness_packed",
    "max_min_fairness_water_filling_perf",
    "min_total_duration_perf",
    "finish_time_fairness_perf",
    "max_sum_throughput_perf",
)


def installed() -> str:
    return ", ".join(cp.installed_solvers())


@pytest.mark.parametrize("policy", CONVEX)
def test_building_a_policy_with_an_unknown_solver_names_it_and_the_installed_ones(policy):
    with pytest.raises(PolicyParameterError) as caught:
        make_policy(policy, solver="nonsense")
    assert str(caught.value) == f"unknown solver 'nonsense'; installed cvxpy solvers: {installed()}"


def test_a_solver_name_in_any_case_is_the_installed_solver():
    assert make_policy("max_min_fairness_perf", solver="ecos").options.solver == "ECOS"


def test_the_command_line_refuses_an_unknown_solver_with_one_line_and_exit_2():
    out = subprocess.run(
        [sys.executable, "-m", "services.cli", "policy", "solve", "--policy", "max_min_fairness",
         "--input", str(EXAMPLE), "--solver", "nonsense"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stdout == ""
    assert out.stderr.splitlines() == [f"gavel: --solver: unknown solver 'nonsense'; installed cvxpy solvers: {installed()}"]


def test_an_unknown_policy_is_still_reported_as_the_policy_whatever_the_solver(capsys):
    code = main(["policy", "solve", "--policy", "max_min_fairnes", "--input", str(EXAMPLE), "--solver", "nonsense"])
    (line,) = capsys.readouterr().err.splitlines()
    assert code == 2 and line.startswith("gavel: unknown policy 'max_min_fairnes'; known policies:")


def test_a_known_solver_in_lower_case_solves(tmp_path, capsys):
    out = tmp_path / "allocation.json"
    code = main(["policy", "solve", "--policy", "max_min_fairness", "--input", str(EXAMPLE), "--solver", "ecos",
                 "--output", str(out)])
    assert code == 0, capsys.readouterr().err
    assert json.loads(out.read_text())["status"] == "optimal"


def test_a_policy_service_request_with_an_unknown_solver_is_answered_failed_with_the_reason():
    problem = PolicyProblem({"v100": 1}, (PolicyJob("1", "A3C", 1, 1.0, 10, 0.0),))
    context = shipped_context()
    good = answer(AllocationRequested("ok", "max_min_fairness_perf", problem, 1e12, solver="ECOS"), context)
    assert isinstance(good, AllocationComputed) and good.status == "optimal"
    bad = answer(AllocationRequested("r", "max_min_fairness_perf", problem, 1e12, solver="nonsense"), context)
    assert isinstance(bad, AllocationFailed) and not bad.expired
    assert (bad.request_id, bad.reason) == ("r", f"unknown solver 'nonsense'; installed cvxpy solvers: {installed()}")


def test_a_solver_cvxpy_knows_but_that_is_not_installed_says_what_to_install(monkeypatch):
    """ECOS is an optional extra (preset gavel's solver): without it the error names the package
    and how to install it, not "unknown solver"."""
    from policy_service.core import formulation

    without_ecos = tuple(s for s in cp.installed_solvers() if s != "ECOS")
    monkeypatch.setattr(formulation, "installed_solvers", lambda: without_ecos)
    with pytest.raises(PolicyParameterError) as caught:
        make_policy("max_min_fairness_perf", solver="ecos")
    assert str(caught.value) == (
        "the solver ECOS is not installed: pip install 'gavel-scheduler[ecos]' (or: pip install ecos); "
        f"installed cvxpy solvers: {', '.join(without_ecos)}"
    )
    # The extra it names is the one pyproject.toml declares.
    assert 'ecos = ["ecos>=' in (ROOT / "pyproject.toml").read_text()
