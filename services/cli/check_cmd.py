"""``gavel check-journal [JOURNAL]``: the invariants I1-I6 (docs/reliability.md) over a
mechanism's journal, read-only (a running mechanism's journal may be checked).

Exit codes: 0 every invariant checked holds; 1 a violation (each one a line: the invariant, what
it is about, what was seen); 2 bad input (no such journal, not a journal, a bad flag or file).
"""

from __future__ import annotations

import argparse
import json
import pathlib

from common.config import Settings
from services.cli.common import CommandFailed, non_negative_number, positive_int, print_json, print_lines, print_table

SHOWN_VIOLATIONS = 50  # the rest are counted (--json lists all)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check-journal",
        help="check a mechanism's journal for broken guarantees (the invariants I1-I6 of docs/reliability.md)",
        description=(
            "Reads a mechanism's journal (its inputs and its audit trail) without changing it and checks the "
            "invariants of docs/reliability.md: I1 one terminal state per accepted job; I2 one lease per GPU; I3 no "
            "GPU leaked; I4 GPU time charged = time the leases ran; I5 progress within --progress-rounds rounds; "
            "I6 dead letters (given with --dead-letters). Exit 0: all hold; 1: a violation; 2: bad input."
        ),
    )
    p.add_argument(
        "journal", nargs="?",
        help="the journal (default: GAVEL_JOURNAL_PATH, else the default path `gavel serve mechanism` uses)",
    )
    p.add_argument(
        "--finished", action="store_true",
        help="the run is over: a job that never reached a terminal state is a violation (I1)",
    )
    p.add_argument("--progress-rounds", type=positive_int, metavar="K", help="I5's bound: rounds a waiting job may go without progress")
    p.add_argument("--quiet-from-s", type=non_negative_number, default=0.0, metavar="T", help="I5 counts from this time (when faults stopped)")
    p.add_argument(
        "--worker-log", metavar="FILE",
        help="the workers' GPU occupancy (JSON Lines: worker_id, gpu_index, lease_id, start_s, end_s), for I2 and I3",
    )
    p.add_argument("--dead-letters", metavar="FILE", help="the dead letters (JSON Lines: queue, reason, injected), for I6")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    from common.journal import read_events
    from mechanism_service.core.invariants import DeadLetterFact, WorkerLease, check
    from services.cli.serve_cmd import default_journal_path

    path = pathlib.Path(args.journal or settings.journal_path or default_journal_path(settings))
    worker_leases = _json_lines(args.worker_log, WorkerLease, "--worker-log") if args.worker_log else None
    dead_letters = _json_lines(args.dead_letters, DeadLetterFact, "--dead-letters") if args.dead_letters else None
    report = check(
        read_events(path), worker_leases=worker_leases, dead_letters=dead_letters, finished=args.finished,
        progress_rounds=args.progress_rounds, quiet_from_s=args.quiet_from_s,
    )
    if args.json:
        print_json({"journal": str(path), **report.as_json()})
        return 0 if report.ok else 1
    by_invariant: dict[str, int] = {}
    for v in report.violations:
        by_invariant[v.invariant] = by_invariant.get(v.invariant, 0) + 1
    rows = []
    for name in ("I1", "I2", "I3", "I4", "I5", "I6"):
        if name in report.skipped:
            rows.append([name, "-", "not checked: " + report.skipped[name]])
        else:
            found = by_invariant.get(name, 0)
            rows.append([name, report.checked.get(name, 0), "holds" if not found else f"{found} violation(s)"])
    print_lines([f"journal: {path}"])
    print_table(["invariant", "checked", "result"], rows)
    if report.violations:
        shown = [f"{v.invariant} {v.subject}: {v.detail}" for v in report.violations[:SHOWN_VIOLATIONS]]
        more = len(report.violations) - len(shown)
        print_lines(["", *shown, *([f"... and {more} more (--json lists all)"] if more else [])])
        return 1
    return 0


def _json_lines(name: str, kind: type, flag: str) -> list:
    """One record a line; a bad line is one error naming the file, the line and the field."""
    path = pathlib.Path(name)
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise CommandFailed(f"{flag} {name}: {e.strerror or e}", exit_code=2) from None
    fields = kind.__dataclass_fields__  # type: ignore[attr-defined]
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out.append(kind(**{f: row[f] for f in fields}))
        except (json.JSONDecodeError, TypeError) as e:
            raise CommandFailed(f"{flag} {name}, line {number}: not a JSON object with {', '.join(fields)} ({e})", exit_code=2) from None
        except KeyError as e:
            raise CommandFailed(f"{flag} {name}, line {number}: no field {e}", exit_code=2) from None
    return out
