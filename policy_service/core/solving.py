"""Solving a cvxpy program with the configured solver: status mapping and where the time went.

Never raises for solver trouble: a solver error becomes status ``failed`` with a reason, so the
service can answer ``allocation.failed`` and the mechanism keep its last allocation.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from policy_service.core.allocation import Status
from policy_service.core.formulation import SolveOptions

if TYPE_CHECKING:  # annotations only: cvxpy is loaded when a program is built
    import cvxpy as cp


@dataclass(frozen=True)
class Outcome:
    """What a solve returned: status, reason, and where the time went."""

    status: Status
    reason: str
    timings: Mapping[str, float]


# cvxpy's status strings (cp.OPTIMAL, ...), written out so that importing this module does not
# load cvxpy (tests/unit/policy/test_solving_imports.py holds them to cvxpy's).
STATUS_OF = {
    "optimal": Status.OPTIMAL,
    "optimal_inaccurate": Status.OPTIMAL_INACCURATE,
    "infeasible": Status.INFEASIBLE,
    "infeasible_inaccurate": Status.INFEASIBLE,
}


def solve(program: cp.Problem, options: SolveOptions, *, build_s: float = 0.0) -> Outcome:
    """Solve with the configured solver; never raises for solver trouble (status failed)."""
    import cvxpy as cp  # noqa: PLC0415 - loaded when a program is built, not when the package is imported
    kwargs = dict(options.solver_options)
    if options.canon_backend is not None:
        kwargs["canon_backend"] = options.canon_backend
    started = time.perf_counter()
    try:
        program.solve(solver=options.solver, **kwargs)
    except cp.error.SolverError as error:
        return Outcome(Status.FAILED, f"solver {options.solver} failed: {error}", {"build_s": build_s})
    total = time.perf_counter() - started
    stats = program.solver_stats
    solver_s = float(stats.solve_time) if stats is not None and stats.solve_time is not None else float("nan")
    compile_s = float(getattr(program, "compilation_time", None) or float("nan"))
    timings = {"build_s": build_s, "compile_s": compile_s, "solver_s": solver_s, "solve_call_s": total}
    status = STATUS_OF.get(program.status, Status.FAILED)
    reason = "" if status in (Status.OPTIMAL,) else f"solver {options.solver} returned {program.status}"
    return Outcome(status, reason, timings)
