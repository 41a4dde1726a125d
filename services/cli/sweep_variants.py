"""``gavel sweep --variant LABEL=FLAGS``: the sweep's option axis (issue 26, item 6: cells are
policy x rate x seed x option).

A variant is a label and some of the per-run simulator flags the sweep itself takes (the seams,
--ideal, --preset, --round-s, the generated jobs' options), written as on the command line. They
are read by a parser of the same flag groups the sweep's parser has (module_flags.py,
simulate_flags.py, --ideal here), over the sweep's own values: a flag a variant gives replaces the
sweep's value of that flag (a variant's --admission-param list replaces the sweep's; a variant
naming another --admission starts without the sweep's parameters, which were its module's), the
flags it does not give are the sweep's. Then each variant goes through the checks the sweep's own
flags go through, so a bad one is the same one line, prefixed with ``--variant LABEL:`` (exit 2).
A flag every cell must share (the trace's size, the cluster, the output, the bus) is refused
naming the variant and the flag. Light: no simulator import at the top
(tests/cli/test_cli_imports.py).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from common.errors import CommandFailed
from services.cli.module_flags import SEAMS, add_module_flags, module_settings
from services.cli.simulate_flags import (
    add_cluster_flags,
    add_job_option_flags,
    job_options,
    round_flags_given,
)

if TYPE_CHECKING:
    from sim.sweep_cells import Variant

LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,39}")  # a column of sweep.csv and a legend's entry
# The sweep's flags that name what every cell shares (its trace's size, the cluster, the table, the
# grid, where it runs and writes): a variant naming one is refused. tests/cli/test_cli_sweep_variants.py
# checks that every flag of `gavel sweep` is here or a variant's.
SHARED_FLAGS = (
    "--policies", "--rates", "--rate-start", "--rate-stop", "--rate-count", "--until-saturated", "--cutoffs",
    "--seeds", "--jobs", "--multi-gpu", "--cluster", "--throughputs", "--gpus-per-server", "--window", "--out",
    "--bus", "--amqp", "--processes", "--json", "--variant", "--help", "-h",
)


def add_ideal_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ideal", action="store_true",
        help="every cell the fluid run of its policy (gavel simulate --ideal; Gavel's sweeps' --ideal)",
    )


def add_variant_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--variant", dest="variants", action="append", default=[], metavar='LABEL="FLAGS"',
        help="an option of the sweep's option axis (repeatable): every (policy, rate, seed) runs once per variant, "
        "with the sweep's flags and these over them, e.g. --variant load05=\"--admission load --admission-param "
        "max_load=0.5\"; FLAGS: the seams' flags, --ideal, --preset, --round-s, --priority-weights, --slos, "
        "--fixed-run-time-s, --steady-state (docs/simulator.md)",
    )


class _Refused(Exception):
    """argparse's complaint about a variant's flags, to be said in one line (not its usage and exit)."""


class _VariantParser(argparse.ArgumentParser):
    def error(self, message: str):
        raise _Refused(message)


def _parser() -> argparse.ArgumentParser:
    """The sweep's own groups of per-run flags (the shared ones among them, --cluster and its
    kin, are refused before this parser sees them); a flag not given sets nothing."""
    p = _VariantParser(prog="--variant", add_help=False, allow_abbrev=False)
    add_job_option_flags(p)  # type: ignore[arg-type]
    add_ideal_flag(p)
    add_cluster_flags(p, required=False)  # --preset, --round-s
    add_module_flags(p)
    # Not set_defaults(x=SUPPRESS): it also records them as values the namespace starts with.
    for action in p._actions:
        action.default = argparse.SUPPRESS  # not given, not set: the sweep's value stays
    return p


def variant_flags() -> tuple[str, ...]:
    """Every flag a variant may give."""
    return tuple(s for action in _parser()._actions for s in action.option_strings if s not in SHARED_FLAGS)


def parse_variants(args: argparse.Namespace) -> tuple[tuple[str, argparse.Namespace], ...]:
    """Each ``--variant`` as (label, the sweep's namespace with its flags over it); a bad label,
    flag or value refused in one line naming the variant (exit 2)."""
    parser, allowed, seen = _parser(), set(variant_flags()), set()
    variants = []
    for text in args.variants:
        label, sep, flags = text.partition("=")
        if not sep or not LABEL.fullmatch(label):
            raise CommandFailed(
                f"--variant: expected LABEL=FLAGS with a label of letters, digits, '_', '.', '+', '-' "
                f"(at most 40, the first a letter or digit), got {text!r}", exit_code=2,
            )
        if label in seen:
            raise CommandFailed(f"--variant {label}: given twice", exit_code=2)
        seen.add(label)
        with naming(label):
            try:
                tokens = shlex.split(flags)
            except ValueError as e:
                raise CommandFailed(f"its flags do not parse as a shell's words: {e}", exit_code=2) from None
            for token in tokens:
                flag = token.partition("=")[0]
                if flag in SHARED_FLAGS:
                    raise CommandFailed(f"{flag} is shared by every cell of the sweep: give it once, outside --variant", exit_code=2)
                if flag.startswith("-") and flag not in allowed and not _number(flag):
                    raise CommandFailed(f"{flag} is not a flag a variant takes (it takes {', '.join(sorted(allowed))})", exit_code=2)
            try:
                given = parser.parse_args(tokens, argparse.Namespace())
            except _Refused as e:
                raise CommandFailed(str(e), exit_code=2) from None
        for seam in SEAMS:  # the sweep's parameters are its own module's: another module starts afresh
            if seam in given and f"{seam}_params" not in given:
                setattr(given, f"{seam}_params", [])
        variants.append((label, argparse.Namespace(**(vars(args) | vars(given)))))
    return tuple(variants)


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@contextmanager
def naming(label: str | None) -> Iterator[None]:
    """A refusal inside says which variant: ``--variant LABEL: ...`` (None: the sweep's own flags,
    whose refusals are as they were)."""
    try:
        yield
    except CommandFailed as e:
        if label is None or e.exit_code != 2:
            raise
        raise CommandFailed(f"--variant {label}: {e}", exit_code=2) from None


def run_settings(args: argparse.Namespace, policies: Sequence[str]) -> tuple[tuple[str, object], ...]:
    """The flags a cell's run takes from the sweep (or a variant), checked before anything runs:
    the preset's solvers, the round, the seams (which the fluid run has not), the generated jobs'
    run time; the seams' settings returned."""
    from sim.scenario import bad_input, check_mechanism_flags, check_solvers

    check_solvers(policies, args.preset)
    check_mechanism_flags(args.round_s, args.gpus_per_server)
    modules = module_settings(args)  # the seams' choices, each built once (none: the preset's)
    # as gavel simulate --ideal (services/cli/simulate_options.py)
    ignored = [f"--{field}" for field, _ in modules] + round_flags_given(args.round_s, args.gpus_per_server)
    if args.ideal and ignored:
        raise bad_input(
            "--ideal", f"cannot go with {ignored[0]}: the fluid run has no rounds, services, estimates, admission or workers"
        )
    if args.fixed_run_time_s is not None and not 0 < args.fixed_run_time_s < float("inf"):
        raise bad_input("--fixed-run-time-s", f"expected a number of seconds > 0, got {args.fixed_run_time_s:g}")
    return modules


def plugins_named(modules: tuple[tuple[str, object], ...]) -> list[str]:
    """The seams' choices given as package.module:Name (a local sweep serves them)."""
    return [value for field, value in modules if field in SEAMS and isinstance(value, str) and ":" in value]


def cell_fields(label: str, args: argparse.Namespace, modules: tuple[tuple[str, object], ...], cluster: Mapping[str, int]) -> Variant:
    """What a cell of these flags carries (sim/sweep_cells.py): the preset, the round, the
    generator's options and the Scenario's, as JSON ("" none: a default run's cell as it was)."""
    from sim.sweep_cells import Variant

    trace_options = job_options(args, dict(cluster))  # Gavel's generated-jobs options
    scenario_options = ({"mechanism": modules} if modules else {}) | ({"engine": "ideal"} if args.ideal else {})
    return Variant(
        label, args.preset, args.round_s,
        trace_json=json.dumps(trace_options) if any(trace_options.values()) else "",
        scenario_json=json.dumps(scenario_options) if scenario_options else "",
    )
