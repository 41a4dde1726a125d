"""``gavel policy solve`` and ``gavel policy list``: the policy library from the command line.

Exit codes: 0 solved; 2 bad input (one line naming the field); 3 solved, but no feasible
allocation exists (status infeasible or failed; the output says why).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import TYPE_CHECKING

from common.errors import PolicyParameterError
from common.throughputs import ThroughputTable, throughput_table_from_json
from services.cli.common import CommandFailed, print_json, print_table

# The policy library (cvxpy, scipy) is imported by the functions that use it: `gavel policy
# --help` starts without it (services/cli/__init__.py).
if TYPE_CHECKING:
    from common.config import Settings
    from policy_service.core import Policy

EXIT_NO_ALLOCATION = 3


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("policy", help="list the scheduling policies, or compute one's allocation for a problem file")
    policy_sub = p.add_subparsers(dest="policy_command", metavar="POLICY_COMMAND", required=True)

    solve = policy_sub.add_parser(
        "solve",
        help="compute a policy's allocation for one problem (a JSON file: docs/policies.md) and print it as JSON",
        description="Exit codes: 0 solved; 2 bad input; 3 no feasible allocation (see the output's reason).",
    )
    solve.add_argument(
        "--policy", required=True, metavar="NAME|MODULE:NAME",
        help="a policy name (gavel policy list), an installed plug-in's or package.module:Name (docs/extending.md)",
    )
    solve.add_argument("--input", required=True, metavar="PROBLEM.json", help="the problem ('-' for stdin)")
    solve.add_argument(
        "--throughputs",
        metavar="TABLE.json",
        help="throughput table in Gavel's format for jobs that omit throughputs (default: the shipped Gavel table)",
    )
    solve.add_argument("--solver", help="an installed cvxpy solver: CLARABEL (default), ECOS (Gavel's), ...")
    solve.add_argument("--output", metavar="OUT.json", help="write the allocation here instead of stdout")
    solve.set_defaults(run=run_solve)

    listing = policy_sub.add_parser("list", help="list every policy name with what it optimises")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(run=run_list)


def _read_json(path: str, what: str) -> object:
    try:
        text = sys.stdin.read() if path == "-" else pathlib.Path(path).read_text()
    except OSError as e:
        raise CommandFailed(f"{what}: cannot read {path}: {e.strerror or e}", exit_code=2) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CommandFailed(f"{what}: {path} is not JSON (line {e.lineno}, column {e.colno}: {e.msg})", exit_code=2) from None


def _table(path: str | None) -> tuple[ThroughputTable | None, dict[str, float] | None]:
    from policy_service.service import shipped_context

    shipped = shipped_context()
    if path is None:
        return shipped.table, dict(shipped.prices_per_hour or {})
    return throughput_table_from_json(_read_json(path, "--throughputs")), dict(shipped.prices_per_hour or {})


def _policy(name: str, solver: str | None) -> Policy:
    """make_policy, with a bad --solver reported as the flag's error (the core's message lists
    the installed solvers); UnknownPolicyError lists the known names. A plug-in is loaded and
    checked (PluginError names it) and makes its own choice of solver."""
    from policy_service.core import make_policy
    from policy_service.plugins import is_builtin, load_policy, make_plugin

    entry = load_policy(name)  # an unknown policy is reported as such, not as the solver's fault
    if not is_builtin(name):
        if solver:
            raise CommandFailed(f"--solver: {name} is a plug-in, which chooses its own solver", exit_code=2)
        return make_plugin(entry, {})
    if not solver:
        return make_policy(name)
    try:
        return make_policy(name, solver=solver)
    except PolicyParameterError as e:
        raise CommandFailed(f"--solver: {e}", exit_code=2) from None


def run_solve(args: argparse.Namespace, settings: Settings) -> int:
    from policy_service.core import allocation_to_json, problem_from_json
    from policy_service.plugins import allocate

    policy = _policy(args.policy, args.solver)
    table, prices = _table(args.throughputs)
    problem = problem_from_json(_read_json(args.input, "--input"), table, default_prices_per_hour=prices)
    result = allocation_to_json(allocate(policy, problem, args.policy))  # a plug-in's failure: PluginError
    if args.output:
        pathlib.Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    else:
        print_json(result)
    return 0 if result["status"] in ("optimal", "optimal_inaccurate") else EXIT_NO_ALLOCATION


def run_list(args: argparse.Namespace, settings: Settings) -> int:
    from common.plugins import installed
    from policy_service.core.catalog import REGISTRY

    rows = [(entry.name, entry.summary) for entry in REGISTRY]
    rows += [(name, f"installed plug-in ({point.value})") for name, point in sorted(installed("policy").items()) if name not in REGISTRY]
    if args.json:
        print_json([{"name": n, "summary": s} for n, s in rows])
    else:
        print_table(["policy", "what it optimises"], rows)
    return 0
