"""The seams' flags (docs/mechanism.md, "Seams"), shared by `gavel simulate`, `gavel sweep`,
`gavel serve mechanism` and `gavel up`: --admission, --placement, --launch and their parameters.

Each choice is built once here, when the flags are read, so a bad name or parameter is refused
in one line naming its flag (exit 2) before anything runs. Light: the seams' modules import
nothing heavy (tests/cli/test_cli_imports.py).
"""

from __future__ import annotations

import argparse
from collections.abc import Collection

from common.errors import CommandFailed

SEAMS = ("admission", "placement", "launch")
DEFAULTS = {"admission": "accept_all", "placement": "consolidated", "launch": "priority"}
_HELP = {
    "admission": (
        "which feasible jobs join the scheduled set now, the others waiting in the admission queue: accept_all "
        "(default), load (Blox's load-based admission), quota (per-entity quotas in V100-hours), an installed "
        "gavel.admission entry point, or package.module:Name"
    ),
    "placement": (
        "which free workers each gang takes: consolidated (default, Gavel's), spread, packing_aware, "
        "checkpoint_local, an installed gavel.placement entry point, or package.module:Name"
    ),
    "launch": (
        "which picked jobs launch, so which running ones are preempted: priority (default, the pick as it is), "
        "non_preemptive, an installed gavel.launch entry point, or package.module:Name"
    ),
}
_PARAM_HELP = {
    "admission": "a parameter of --admission (repeatable): load: max_load=1.0, max_jobs=N; quota: hours=H, "
    "entities=a:H1,b:H2, unit=v100|gpu",
    "placement": "a parameter of --placement (repeatable; the built-ins take none)",
    "launch": "a parameter of --launch (repeatable; the built-ins take none)",
}


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def add_module_flags(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("the mechanism's seams (docs/mechanism.md, 'Seams')")
    for seam in SEAMS:
        group.add_argument(f"--{seam}", default=DEFAULTS[seam], metavar="NAME", help=_HELP[seam])
        group.add_argument(
            f"--{seam}-param", dest=f"{seam}_params", action="append", default=[], type=_key_value,
            metavar="KEY=VALUE", help=_PARAM_HELP[seam],
        )


def module_settings(args: argparse.Namespace) -> tuple[tuple[str, object], ...]:
    """The MechanismSettings fields the flags set (none when every seam is left at its default,
    so a default run's settings are the preset's exactly), each choice built once to refuse a
    bad one here: CommandFailed naming the flag, exit 2."""
    import dataclasses

    from common.errors import PluginError
    from mechanism_service.core.settings import MechanismSettings
    from mechanism_service.plugins import choose

    fields: list[tuple[str, object]] = []
    for seam in SEAMS:
        name, params = getattr(args, seam), tuple(getattr(args, f"{seam}_params"))
        seen = [k for k, _ in params]
        repeated = sorted({k for k in seen if seen.count(k) > 1})
        if repeated:
            raise CommandFailed(f"--{seam}-param: {repeated[0]} given twice", exit_code=2)
        if name != DEFAULTS[seam] or params:
            fields += [(seam, name), (f"{seam}_params", params)]
    if fields:
        try:
            choose(dataclasses.replace(MechanismSettings(), **dict(fields)))  # type: ignore[arg-type]
        except PluginError as e:
            raise CommandFailed(f"--{e.kind}: {e}", exit_code=2) from None
    return tuple(fields)


def check_quota_entities(args: argparse.Namespace, entities: Collection[str], source: str) -> None:
    """``--admission quota --admission-param entities=a:H,...`` naming an entity that no job of
    the run belongs to is refused: its quota would bound nothing, and a name mistyped would leave
    its entity bounded by ``hours`` or not at all."""
    if args.admission != "quota":
        return
    given = dict(args.admission_params).get("entities", "")
    named = [part.strip().rpartition(":")[0] for part in given.split(",") if part.strip()]
    unknown = [name for name in named if name not in entities]
    if unknown:
        known = ", ".join(sorted(repr(e) for e in entities if e)) or "none: no job names one"
        raise CommandFailed(
            f"--admission-param entities: {unknown[0]!r} is no job's entity in {source} (its entities: {known}); "
            "its quota would bound nothing",
            exit_code=2,
        )

