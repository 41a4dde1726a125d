"""``gavel simulate``'s options from Gavel's simulator drivers beyond the jobs (docs/simulator.md,
"Gavel's and Blox's options"): the fluid run (``--ideal``) and checkpoints (``--checkpoint-to``,
``--resume``). Each is turned into values here and refused in one line when it contradicts
another flag.
"""

from __future__ import annotations

import argparse
import math
import pathlib
from typing import TYPE_CHECKING

from services.cli.simulate_flags import resolve_faults, round_flags_given

if TYPE_CHECKING:
    from sim.checkpoint import CheckpointSpec
    from sim.faults import FaultSpec


def add_run_option_flags(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("Gavel's run options (docs/simulator.md)")
    group.add_argument(
        "--ideal", action="store_true",
        help="the fluid run: the policy's allocation realised exactly, continuously, solved again at every arrival "
        "and completion, no rounds (Gavel's ideal; the round-based runs stay above it on average)",
    )
    group.add_argument(
        "--checkpoint-to", metavar="FILE",
        help="save the whole run's state to FILE once, at the boundary --checkpoint-at-s or --checkpoint-after-jobs "
        "names, and go on to the end (Gavel's --checkpoint_file with --checkpoint_threshold; fast engine, one policy)",
    )
    group.add_argument("--checkpoint-at-s", type=float, metavar="T", help="--checkpoint-to at the first boundary at or after T simulated seconds")
    group.add_argument(
        "--checkpoint-after-jobs", type=int, metavar="N", help="--checkpoint-to at the first boundary once N jobs have arrived"
    )
    group.add_argument(
        "--resume", metavar="FILE",
        help="take up the run a --checkpoint-to FILE saved, with the same trace and flags, and run it to the end",
    )


def resolve_engine(args: argparse.Namespace) -> tuple[str, FaultSpec | None]:
    """(engine, fault spec): --engine and --faults as resolve_faults says, or the fluid run, which
    has no services, faults or estimator to run, and no admission, placement or launch (it
    realises the policy's allocation for every job at once, on no worker in particular)."""
    from services.cli.common import PRESET_VALUE
    from services.cli.module_flags import DEFAULTS
    from sim.scenario import bad_input

    if not args.ideal:
        return resolve_faults(args)
    seams = [(f"--{seam}", getattr(args, seam) != default or bool(getattr(args, f"{seam}_params")))
             for seam, default in DEFAULTS.items()]
    for flag, given in (
        ("--engine", args.engine is not None), ("--faults", args.faults is not None),
        ("--estimator", args.estimator != "oracle"), *seams,
        # how the rounds charge a move: the fluid run makes none
        ("--catch-up-ratio", getattr(args, "catch_up_ratio", PRESET_VALUE) is not PRESET_VALUE),
        # the rounds' length, how they are skipped and how GPUs are grouped into servers: the
        # fluid run has no rounds and places no job on a server (a value given was ignored)
        *((flag, True) for flag in round_flags_given(args.round_s, args.gpus_per_server)),
        ("--no-skip-quiet-rounds", not args.skip_quiet_rounds),
    ):
        if given:
            raise bad_input(
                "--ideal", f"cannot go with {flag}: the fluid run has no rounds, services, estimates, admission or workers"
            )
    return "ideal", None


def checkpoint_spec(args: argparse.Namespace, engine: str, policies: tuple[str, ...]) -> CheckpointSpec | None:
    """--checkpoint-to and its point, --resume: checked against each other and the run (a
    checkpoint is the bus-free loop's state, of one run)."""
    from sim.checkpoint import CheckpointSpec
    from sim.scenario import bad_input

    if args.checkpoint_to is None:
        for flag, value in (("--checkpoint-at-s", args.checkpoint_at_s), ("--checkpoint-after-jobs", args.checkpoint_after_jobs)):
            if value is not None:
                raise bad_input(flag, "needs --checkpoint-to FILE (where to save)")
        if args.resume is None:
            return None
    flag = "--checkpoint-to" if args.checkpoint_to is not None else "--resume"
    if engine != "fast":
        raise bad_input(flag, f"a checkpoint is the fast engine's state: it cannot go with the {engine} engine")
    if len(policies) != 1:
        raise bad_input(flag, "a checkpoint is one run's: give one --policy")
    save_to = None
    if args.checkpoint_to is not None:
        given = [f for f, v in (("--checkpoint-at-s", args.checkpoint_at_s), ("--checkpoint-after-jobs", args.checkpoint_after_jobs)) if v is not None]
        if len(given) != 1:
            raise bad_input("--checkpoint-to", "needs one of --checkpoint-at-s T or --checkpoint-after-jobs N (when to save)")
        if args.checkpoint_at_s is not None and not 0 <= args.checkpoint_at_s < math.inf:
            raise bad_input("--checkpoint-at-s", f"expected a number of seconds >= 0, got {args.checkpoint_at_s:g}")
        if args.checkpoint_after_jobs is not None and args.checkpoint_after_jobs < 1:
            raise bad_input("--checkpoint-after-jobs", f"expected a whole number >= 1, got {args.checkpoint_after_jobs}")
        save_to = pathlib.Path(args.checkpoint_to)
        if not save_to.parent.is_dir():
            raise bad_input("--checkpoint-to", f"{save_to.parent} is not a directory")
        if save_to.is_dir():
            raise bad_input("--checkpoint-to", f"{save_to} is a directory: give the file to write")
    resume_from = None
    if args.resume is not None:
        resume_from = pathlib.Path(args.resume)
        if not resume_from.is_file():
            raise bad_input("--resume", f"{resume_from} is not a file")
    return CheckpointSpec(save_to, args.checkpoint_at_s, args.checkpoint_after_jobs, resume_from)
