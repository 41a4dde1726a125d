"""``gavel job-types``: the job types a throughput table knows (what ``gavel submit --job-type``
accepts), each with its scale factors and its isolated steps/s on every accelerator type.

Gavel's table also has a pseudo-type ``<type>_unconsolidated`` beside each accelerator type: the
steps/s of a gang whose GPUs are spread over several servers instead of packed into one (the
same as ``<type>`` on 1 GPU). No cluster has such a type and the scheduler does not use them
(as in Gavel, docs/gavel-semantics.md); the table shows those columns only with
``--unconsolidated`` and says they are hidden; ``--json`` always has them.

Reads the table and nothing else (no solver or plotting stack), so it answers at once.
Exit codes: 0 listed; 2 bad input (a table that cannot be read or parsed, a scale factor no job
type has), as one line naming the flag.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from dataclasses import dataclass

from common.config import Settings
from common.throughputs import ThroughputTable
from services.cli.common import CommandFailed, load_table, print_json, print_lines, print_table

NOT_MEASURED = "-"  # a job key the table has on some accelerator types but not this one
UNCONSOLIDATED = "_unconsolidated"  # Gavel's pseudo-types: a gang spread over servers


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "job-types",
        help="list the job types you can submit and how fast each runs on each accelerator type",
        description="One row per job type: its scale factors (GPUs per job) and its steps/s alone on each "
        "accelerator type, for scale factor 1 or --scale-factor N. Gavel's table also has TYPE_unconsolidated "
        "columns: the steps/s of a gang spread over several servers instead of one (the same as TYPE on 1 GPU; "
        "the scheduler does not use them), shown with --unconsolidated. Exit codes: 0 listed; 2 bad input.",
    )
    p.add_argument(
        "--throughputs", metavar="TABLE.json", help="throughput table in Gavel's format (default: the shipped Gavel table)"
    )
    p.add_argument(
        "--scale-factor", type=int, metavar="N",
        help="steps/s of a job on N GPUs (default: 1 in the table; every scale factor with --json)",
    )
    p.add_argument(
        "--unconsolidated", action="store_true",
        help="also show the TYPE_unconsolidated columns (a gang spread over servers; hidden by default)",
    )
    p.add_argument(
        "--json", action="store_true",
        help="a list of {job_type, scale_factors, throughputs_steps_per_s: {scale factor: {accelerator type: steps/s}}}, "
        "every type of the table included",
    )
    p.set_defaults(run=run_job_types)


@dataclass(frozen=True)
class JobType:
    """One job type of the table. ``steps_per_s``: scale factor -> accelerator type -> isolated
    steps/s of the gang (None: not measured there; 0: it cannot run there)."""

    name: str
    scale_factors: tuple[int, ...]
    steps_per_s: Mapping[int, Mapping[str, float | None]]

    def as_json(self) -> dict[str, object]:
        return {
            "job_type": self.name,
            "scale_factors": list(self.scale_factors),
            "throughputs_steps_per_s": {str(sf): dict(by_type) for sf, by_type in self.steps_per_s.items()},
        }


def _by_name(job_type: str) -> tuple[object, ...]:
    """Job types in name order, numbers by value: "batch size 16" before "batch size 128"."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", job_type))


def job_types(table: ThroughputTable, scale_factor: int | None = None) -> list[JobType]:
    """Every job type of the table, sorted by name, with its steps/s for every scale factor it
    has (or only for ``scale_factor``)."""
    scale_factors: dict[str, list[int]] = {}
    for job_type, sf in sorted(table.job_keys):
        scale_factors.setdefault(job_type, []).append(sf)
    return [
        JobType(
            name,
            tuple(sfs),
            {
                sf: {w: table.isolated_steps_per_s.get((name, sf, w)) for w in table.accelerator_types}
                for sf in sfs
                if scale_factor in (None, sf)
            },
        )
        for name, sfs in sorted(scale_factors.items(), key=lambda item: _by_name(item[0]))
    ]


def run_job_types(args: argparse.Namespace, settings: Settings) -> int:
    table = load_table(args.throughputs)
    known = sorted({sf for _, sf in table.job_keys})
    if args.scale_factor is not None and args.scale_factor not in known:
        raise CommandFailed(
            f"--scale-factor: no job type has a throughput on {args.scale_factor} GPUs "
            f"(scale factors in the table: {', '.join(map(str, known))})",
            exit_code=2,
        )
    if args.json:
        print_json([job_type.as_json() for job_type in job_types(table, args.scale_factor)])
        return 0
    scale_factor = args.scale_factor or 1
    gpus = "1 GPU" if scale_factor == 1 else f"{scale_factor} GPUs"
    spread = [w for w in table.accelerator_types if w.endswith(UNCONSOLIDATED)]
    shown = list(table.accelerator_types) if args.unconsolidated else [w for w in table.accelerator_types if w not in spread]
    caption = [f"steps/s of one job alone on {gpus} of each accelerator type (0: cannot run there; {NOT_MEASURED}: not measured)"]
    if spread:
        # A new user read these columns as more accelerator types: say what they are either way.
        what = "steps/s with the gang's GPUs spread over several servers instead of one; the scheduler does not use them"
        caption.append(
            f"*{UNCONSOLIDATED}: {what}" if args.unconsolidated
            else f"not shown: the {len(spread)} *{UNCONSOLIDATED} columns of the table ({what}; --unconsolidated shows them)"
        )
    print_lines(caption)
    rows = []
    for job_type in job_types(table, scale_factor):
        steps_per_s = job_type.steps_per_s.get(scale_factor, {})
        cells = [NOT_MEASURED if steps_per_s.get(w) is None else steps_per_s[w] for w in shown]
        rows.append([job_type.name, ",".join(map(str, job_type.scale_factors)), *cells])
    print_table(["job type", "scale factors", *shown], rows)
    return 0
