"""``gavel whatif``: replay what a live cluster received (its mechanism's journal, read-only)
through the simulator under candidate policies, and compare with what really happened
(docs/whatif.md). The logic is in sim/whatif/ (history: the journal read; replay: the
simulator's input and the real run as a result; compare: the figures; plots); this is the shell.

Files in the output directory: comparison.json (what --json prints), comparison.txt (the table),
jobs.csv (each compared job's JCT in every run), jct_cdf.png and summary.png (unless --no-plots). Progress on stderr while the replays run.
Exit codes: 0 done; 1 the plots could not be drawn, or a policy could not be replayed (it stalled,
or its plug-in failed: a note says why; the others are compared); 2 bad input (a
missing or corrupt journal, a journal with no finished job, an unknown policy, --from after the
last arrival: one line naming the flag).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import pathlib
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from services.cli.common import (
    CommandFailed,
    non_negative_number,
    positive_number,
    print_json,
    print_lines,
    print_table,
)
from services.cli.module_flags import SEAMS, add_module_flags, module_settings

if TYPE_CHECKING:
    from common.config import Settings
    from sim.whatif.compare import RunFigures
    from sim.whatif.replay import ReplaySetup

PRESET_NAMES = ("default", "gavel")  # mechanism_service/core/settings.py PRESETS (not imported for --help)
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
LOG_FILE = "replays.log"  # the replays' events (a policy kept degraded, a plug-in failing), beside the results


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "whatif",
        help="replay a live cluster's jobs (its mechanism's journal) under other policies and compare with what happened",
        description=(
            "Reads a mechanism's journal without changing it: the jobs the cluster received (arrivals, sizes, steps, "
            "priority, SLO), the throughputs its workers measured, its fleet, round length and preset. Replays them "
            "through the simulator under the policy the cluster ran and each of --policies, and prints average and tail "
            "JCT, makespan, utilisation and fairness against the real run (docs/whatif.md). Exit codes: 0 done; 1 the "
            "plots could not be drawn, or a policy could not be replayed (the others are compared); 2 bad input."
        ),
    )
    p.add_argument(
        "--journal", metavar="FILE",
        help="the mechanism's journal (default: GAVEL_JOURNAL_PATH, else the default path `gavel serve mechanism` uses)",
    )
    p.add_argument("--policies", required=True, metavar="A,B,...", help="the policies to try (gavel policy list)")
    p.add_argument(
        "--from", dest="from_s", type=_duration, metavar="T",
        help="compare the jobs that arrived T or later after the journal's first arrival (seconds, or 90m, 2h, 1d of the "
        "mechanism's clock); the jobs still in the cluster then are replayed from T as load",
    )
    p.add_argument("--out", metavar="DIR", help="output directory (default: ./out/whatif-<date-time>)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON on stdout")
    p.add_argument("--no-plots", action="store_true", help="write the numbers only (no PNG; matplotlib is not loaded)")
    p.add_argument(
        "--throughputs", metavar="TABLE.json",
        help="the table the mechanism ran with, for the cells never measured (default: the shipped one)",
    )
    p.add_argument(
        "--boundary-lag-s", type=non_negative_number, metavar="S",
        help="the time the replays' rounds take from their last lease's end to the next boundary (default: the real "
        "run's mean, from the journal; 0: none, as a simulation)",
    )
    p.add_argument("--round-s", type=positive_number, metavar="S", help="the round length, if the journal does not record it")
    p.add_argument("--preset", choices=PRESET_NAMES, help="the mechanism's preset, if the journal does not record it")
    # The journal does not say which admission, placement and launch the mechanism ran with: the
    # operator gives them, as the mechanism was started (every replay, the policy it ran too).
    add_module_flags(p)
    p.set_defaults(run=run)


def _duration(text: str) -> float:
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a duration >= 0 (seconds, or with s, m, h, d), got {text!r}")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def run(args: argparse.Namespace, settings: Settings) -> int:
    from common.errors import JournalError, PluginError, ReplayError
    from common.log import logging_into
    from services.cli.serve_state import default_journal_path
    from sim.clock import SimulationStalled
    from sim.progress import ProgressBar
    from sim.scenario import bad_input, check_policies, check_solvers, load_context
    from sim.whatif.compare import HEADERS, REAL, job_rows, run_figures, table_rows
    from sim.whatif.history import read_history
    from sim.whatif.real import shifted
    from sim.whatif.replay import fleet_gpus, setup
    from sim.whatif.runs import replay

    # 1. the flags that need no journal
    candidates = check_policies("--policies", [n.strip() for n in args.policies.split(",")])
    mechanism = module_settings(args)  # a bad --admission, --placement, --launch: one line, exit 2
    context = load_context(args.throughputs)
    assert context.table is not None
    path = pathlib.Path(args.journal or settings.journal_path or default_journal_path(settings))
    out = pathlib.Path(args.out) if args.out else pathlib.Path("out") / f"whatif-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    if out.exists() and not out.is_dir():
        raise bad_input("--out", f"{out} exists and is not a directory")
    # 2. the journal, and the replay's input
    try:
        history = read_history(
            str(path), lambda events: print_lines([f"whatif: {events:,} journal events read"], stream=sys.stderr)
        )
        replay_setup = setup(history, context.table, from_s=args.from_s, round_s=args.round_s, preset_name=args.preset)
    except ReplayError as e:
        flag = "" if str(e).startswith("--") else f"--journal {path}: "
        raise CommandFailed(f"{flag}{e}", exit_code=2) from None
    except JournalError as e:
        raise CommandFailed(f"--journal: {e}", exit_code=2) from None
    as_run = replay_setup.policy
    notes = list(replay_setup.notes)
    policies = list(candidates)
    if as_run is not None and as_run not in policies:
        try:  # a built-in, or a plug-in that loads here too
            check_policies("--policies", [as_run])
            policies.insert(0, as_run)
        except CommandFailed as e:
            notes.append(f"the real run's policy is not replayed: {e}")
    elif as_run is not None:
        policies.insert(0, policies.pop(policies.index(as_run)))  # the policy it ran first
    check_solvers(policies, replay_setup.preset)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise bad_input("--out", f"cannot create {out}: {e.strerror or e}") from None
    # 3. the replays, with progress on stderr
    real = shifted(replay_setup.real, replay_setup.origin_s)
    prices = context.prices_per_hour or {}
    gpus = fleet_gpus(replay_setup)
    runs = [run_figures(REAL, real, replay_setup.table, prices, fleet_gpus=gpus)]
    results = {REAL: real}
    width = max(len(p) for p in policies)
    failed_policies = []
    with logging_into(out / LOG_FILE) as log_file:  # the replays' events: in a file, not over the bars
        for policy in policies:
            bar = ProgressBar(f"whatif {policy.ljust(width)}")
            try:
                results[policy] = replay(replay_setup, policy, prices, bar, boundary_lag_s=args.boundary_lag_s, mechanism=mechanism)
            except (SimulationStalled, PluginError) as e:  # one policy's failure: the others are still compared
                notes.append(f"{policy} could not be replayed: {e}")
                failed_policies.append(policy)
                continue
            finally:
                bar.close()
            if results[policy].policy_error:  # it ran on the allocation kept in force: not this policy's schedule
                notes.append(
                    f"{policy} could not be replayed: its solves failed ({results.pop(policy).policy_error}); the jobs ran "
                    "on the allocation kept in force, not on the policy's"
                )
                failed_policies.append(policy)
                continue
            runs.append(run_figures(policy, results[policy], replay_setup.table, prices, runs[0].avg_jct_s, gpus))
    if log_file.by_level:
        notes.append(f"the replays' log: {out / LOG_FILE} ({log_file.summary()})")
    # 4. what it says, and the files
    lag_s = replay_setup.boundary_lag_s if args.boundary_lag_s is None else args.boundary_lag_s
    report = _report(path, replay_setup, as_run, notes, runs, lag_s or 0.0)
    report["seams"] = {  # what every replay ran with (the journal does not record the real run's)
        seam: {"name": getattr(args, seam), "params": dict(getattr(args, f"{seam}_params"))} for seam in SEAMS
    }
    (out / "comparison.json").write_text(json.dumps(report, indent=2) + "\n")
    rows = table_rows(runs)
    (out / "comparison.txt").write_text(_text_table(HEADERS, rows))
    with (out / "jobs.csv").open("w", newline="") as f:
        headers, job_lines = job_rows(results)
        csv.writer(f).writerows([headers, *job_lines])
    files = ["comparison.json", "comparison.txt", "jobs.csv"]
    failed = ""
    if not args.no_plots:
        try:
            from sim.whatif.plots import plot_jct_cdfs, plot_summary_bars

            plot_jct_cdfs(results, out / "jct_cdf.png")
            plot_summary_bars(runs, out / "summary.png")
            files += ["jct_cdf.png", "summary.png"]
        except Exception as e:  # noqa: BLE001 - the numbers are written; say why the plots are not
            failed = f"the plots could not be drawn: {type(e).__name__}: {e}"
    report["files"] = [str(out / f) for f in files]
    if args.json:
        print_json(report)
    else:
        print_lines(_header(path, replay_setup, as_run, notes))
        print_table(HEADERS, rows)
        print_lines(["", f"written to {out}: {', '.join(files)}"])
    for problem in ([failed] if failed else []) + [f"{p} could not be replayed (see its note)" for p in failed_policies]:
        print_lines([f"gavel: {problem}"], stream=sys.stderr)
    return 1 if failed or failed_policies else 0


def _report(
    path: pathlib.Path, s: ReplaySetup, as_run: str | None, notes: Sequence[str], runs: Sequence[RunFigures],
    lag_s: float,
) -> dict[str, object]:
    return {
        "journal": str(path),
        "real_run": {
            "policy": as_run, "preset": s.preset, "round_s": s.round_s, "cluster": dict(s.cluster),
            "gpus_per_server": s.gpus_per_server, "origin_s": s.origin_s, "jobs_measured": s.window[1] - s.window[0],
            "jobs_replayed": len(s.trace), "clocks": list(s.clocks), "boundary_lag_s": lag_s,
            # the fleet at each change, from the comparison's time zero (the replay runs on the last)
            "fleets": [{"at_s": at_s - s.origin_s, "gpus": dict(gpus)} for at_s, gpus in s.fleets],
        },
        "cells": {"measured": s.cells.measured, "assumed": s.cells.assumed, "by_source": dict(s.cells.by_source)},
        "notes": list(notes),
        "runs": [r.as_dict() for r in runs],
    }


def _header(path: pathlib.Path, s: ReplaySetup, as_run: str | None, notes: Sequence[str]) -> list[str]:
    cluster = ", ".join(f"{g} {w}" for w, g in s.cluster.items())
    measured = s.window[1] - s.window[0]
    load = len(s.trace) - measured
    sources = ", ".join(f"{n} {source}" for source, n in s.cells.by_source.items())
    lines = [
        f"journal: {path}",
        f"real run: {as_run or 'policy unknown'}, preset {s.preset}, rounds of {s.round_s:g} s, {cluster}"
        + (" at the start" if s.fleet_changes else ""),
        f"jobs compared: {measured} (completed in the real run)" + (f", {load} more replayed as load" if load else ""),
        f"throughputs (job x type): {s.cells.measured} measured, {s.cells.assumed} assumed ({sources})",
    ]
    lines += [f"note: {n}" for n in notes]
    return [*lines, ""]


def _text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    cells = [list(headers), *rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() + "\n" for row in cells)
