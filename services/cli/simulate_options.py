"""``gavel simulate``'s options from Gavel's simulator drivers beyond the jobs (docs/simulator.md,
"Gavel's and Blox's options"): the fluid run (``--ideal``). Each is turned into values here and
refused in one line when it contradicts another flag.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from services.cli.simulate_flags import resolve_faults

if TYPE_CHECKING:
    from sim.faults import FaultSpec


def add_run_option_flags(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("Gavel's run options (docs/simulator.md)")
    group.add_argument(
        "--ideal", action="store_true",
        help="the fluid run: the policy's allocation realised exactly, continuously, solved again at every arrival "
        "and completion, no rounds (Gavel's ideal; the round-based runs stay above it on average)",
    )


def resolve_engine(args: argparse.Namespace) -> tuple[str, FaultSpec | None]:
    """(engine, fault spec): --engine and --faults as resolve_faults says, or the fluid run, which
    has no services, faults or estimator to run."""
    from sim.scenario import bad_input

    if not args.ideal:
        return resolve_faults(args)
    for flag, given in (
        ("--engine", args.engine is not None), ("--faults", args.faults is not None),
        ("--estimator", args.estimator != "oracle"),
    ):
        if given:
            raise bad_input("--ideal", f"cannot go with {flag}: the fluid run has no rounds, services or estimates")
    return "ideal", None
