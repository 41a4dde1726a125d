"""The policy core loads cvxpy only when it builds a cvxpy program: the simulator's default
programs (compiled.py, straight to CLARABEL) and every command that only imports the package do
not pay its ~1.7 s import. (A fresh interpreter: ~1 s.)"""

from __future__ import annotations

import subprocess
import sys

import cvxpy as cp

from policy_service.core.allocation import Status
from policy_service.core.solving import STATUS_OF


def test_the_status_table_speaks_cvxpys_words() -> None:
    assert STATUS_OF == {
        cp.OPTIMAL: Status.OPTIMAL,
        cp.OPTIMAL_INACCURATE: Status.OPTIMAL_INACCURATE,
        cp.INFEASIBLE: Status.INFEASIBLE,
        cp.INFEASIBLE_INACCURATE: Status.INFEASIBLE,
    }


def test_importing_the_policy_core_and_solving_a_compiled_program_does_not_load_cvxpy() -> None:
    code = """
import sys
import policy_service.core, policy_service.answer, sim.fastpath
assert "cvxpy" not in sys.modules, "imported"
assert "scipy.optimize" not in sys.modules, "scipy.optimize imported (AlloX loads it when it assigns)"
from policy_service.core import JobSpec, build_problem, make_policy
from policy_service.service import shipped_context
types = ["A3C", "ResNet-18 (batch size 64)", "LM (batch size 20)"]
jobs = [JobSpec(f"j{i}", 1000.0, job_type=t) for i, t in enumerate(types)]
problem = build_problem({"v100": 1, "p100": 1, "k80": 1}, jobs, table=shipped_context().table)
allocation = make_policy("max_min_fairness_perf").allocate(problem)
assert allocation.status.value == "optimal", allocation.status
assert "cvxpy" not in sys.modules, "solved through cvxpy"
assert "scipy.sparse" not in sys.modules, "scipy.sparse loaded (policy_service/core/sparse.py)"
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_sp_is_scipy_sparse_once_read() -> None:
    code = """
import sys
from policy_service.core.sparse import sp
assert "scipy.sparse" not in sys.modules
import scipy.sparse
assert sp.csr_matrix is scipy.sparse.csr_matrix and sp.vstack is scipy.sparse.vstack
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
