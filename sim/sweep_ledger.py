"""A sweep's bookkeeping: its ledger of results (``cells.jsonl`` in the output directory) and
what it knows while it runs (which cells are finished, running, failed; its progress and ETA).

The ledger is append-only, one JSON object per line, flushed and synced as each result arrives,
so a sweep stopped in any way (Ctrl-C, SIGKILL, the machine) keeps every result it had: its
restart with the same arguments reads it and asks only for the cells without a result. Reading
keeps the first result of each cell of this sweep and ignores the rest: results of another sweep
id (other arguments in the same directory), of cells this sweep does not have, a second result of
one cell (a cell redelivered after its simulator died and finished twice), failures (a restart
tries a failed cell again: a simulator killed by the kernel for memory may fare better), and a
last line cut short by a crash.

Pure but for ``LedgerFile``, the file itself.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from common.messages import SweepCellFinished, SweepCellRequested
from sim.sweep_lines import SweepRow
from sim.sweep_plan import Figures, Key

LEDGER_NAME = "cells.jsonl"


@dataclass(frozen=True, slots=True)
class CellResult:
    """A cell and its result, as the ledger keeps them."""

    cell: SweepCellRequested
    result: SweepCellFinished

    @property
    def key(self) -> Key:
        return (self.cell.policy, self.cell.jobs_per_hour, self.cell.seed, self.cell.option)

    @property
    def figures(self) -> Figures:
        r = self.result
        if r.saturated:  # as Gavel's sweep records a run its timeout stopped
            return Figures(math.inf, 1.0)
        return Figures(
            None if r.avg_jct_s < 0 else r.avg_jct_s, None if r.cluster_utilization < 0 else r.cluster_utilization, bool(r.error)
        )

    def row(self) -> SweepRow:
        return SweepRow(self.cell.policy, self.cell.jobs_per_hour, self.cell.seed, self.figures.avg_jct_s, self.cell.option)


def ledger_line(cell: SweepCellRequested, result: SweepCellFinished) -> str:
    return json.dumps(
        {
            "sweep_id": result.sweep_id, "cell_id": result.cell_id, "policy": cell.policy,
            "jobs_per_hour": cell.jobs_per_hour, "seed": cell.seed, "option": cell.option,
            "avg_jct_s": result.avg_jct_s, "cluster_utilization": result.cluster_utilization,
            "jobs_completed": result.jobs_completed, "jobs_measured": result.jobs_measured,
            "wall_s": result.wall_s, "simulator": result.simulator, "error": result.error,
            "jobs_arrived": result.jobs_arrived, "saturated": result.saturated,
        },
        sort_keys=True,
    )


def parse_ledger(lines: Iterable[str], sweep_id: str) -> dict[str, SweepCellFinished]:
    """cell id -> the first successful result of this sweep in the ledger's lines."""
    found: dict[str, SweepCellFinished] = {}
    for line in lines:
        try:
            entry = json.loads(line)
            if entry.get("sweep_id") != sweep_id or entry.get("error") or entry["cell_id"] in found:
                continue
            result = SweepCellFinished(
                sweep_id, str(entry["cell_id"]), str(entry.get("simulator", "")),
                avg_jct_s=float(entry["avg_jct_s"]), cluster_utilization=float(entry["cluster_utilization"]),
                jobs_completed=int(entry["jobs_completed"]), jobs_measured=int(entry["jobs_measured"]),
                wall_s=float(entry.get("wall_s", 0.0)), jobs_arrived=int(entry.get("jobs_arrived", 0)),
                saturated=entry.get("saturated") is True,
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # a line cut short by a crash, or not ours
        found[result.cell_id] = result
    return found


class LedgerFile:
    """``cells.jsonl``: read at start, one line appended (and synced) per result."""

    def __init__(self, out_dir: pathlib.Path) -> None:
        self.path = out_dir / LEDGER_NAME

    def read(self, sweep_id: str) -> dict[str, SweepCellFinished]:
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return {}
        return parse_ledger(text.splitlines(), sweep_id)

    def append(self, cell: SweepCellRequested, result: SweepCellFinished) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a+b") as f:
            if f.tell():
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.write(b"\n")  # after a line a crash cut short: this one starts clean
            f.write((ledger_line(cell, result) + "\n").encode())
            f.flush()
            os.fsync(f.fileno())


@dataclass
class SweepBook:
    """What a running sweep knows: the cells it asked for, which are finished (one result each),
    which failed, which a simulator has started. Results of other sweeps or unknown cells are
    refused by ``accept``."""

    sweep_id: str
    cells: dict[str, SweepCellRequested] = field(default_factory=dict)  # asked for, by id
    finished: dict[str, CellResult] = field(default_factory=dict)
    failures: dict[str, CellResult] = field(default_factory=dict)  # the latest failure of each
    started: set[str] = field(default_factory=set)
    finished_here: int = 0  # finished since this run began (the ETA's basis)

    def ask(self, cells: Iterable[SweepCellRequested]) -> list[SweepCellRequested]:
        """Register cells the plan needs; returns those not asked for yet."""
        new = [c for c in cells if c.cell_id not in self.cells]
        self.cells.update((c.cell_id, c) for c in new)
        return new

    def restore(self, kept: Mapping[str, SweepCellFinished], cells: Iterable[SweepCellRequested]) -> int:
        """Take the ledger's results for these cells as finished; how many."""
        n = 0
        for cell in cells:
            result = kept.get(cell.cell_id)
            if result is not None and cell.cell_id not in self.finished:
                self.cells[cell.cell_id] = cell
                self.finished[cell.cell_id] = CellResult(cell, result)
                n += 1
        return n

    def accept(self, result: SweepCellFinished) -> CellResult | None:
        """A result from a simulator: the CellResult when it is new (a success, or a failure of a
        cell not finished), None when it is not this sweep's, not a cell asked for, or a cell
        already finished."""
        cell = self.cells.get(result.cell_id)
        if result.sweep_id != self.sweep_id or cell is None or result.cell_id in self.finished:
            return None
        done = CellResult(cell, result)
        self.started.discard(result.cell_id)
        if result.error:
            self.failures[result.cell_id] = done
        else:
            self.finished[result.cell_id] = done
            self.failures.pop(result.cell_id, None)
            self.finished_here += 1
        return done

    def start(self, sweep_id: str, cell_id: str) -> None:
        if sweep_id == self.sweep_id and cell_id in self.cells and cell_id not in self.finished:
            self.started.add(cell_id)

    def results(self) -> dict[Key, Figures]:
        """What the plan reads: every finished cell's figures, and the failed ones as failed."""
        known = {r.key: r.figures for r in self.failures.values()}
        known.update((r.key, r.figures) for r in self.finished.values())
        return known

    @property
    def open_cells(self) -> int:
        """Asked for and neither finished nor failed."""
        return len(self.cells) - len(self.finished) - len(self.failures)

    def progress(self, elapsed_s: float, expected_total: int | None, running: int | None = None) -> str:
        """``12/24 cells done, 2 running, 1 failed, ETA 3 min``: the ETA from this run's pace
        (cells finished per second since it began) over the cells left. ``running``: what the
        engine knows runs (None: the cells simulators said they started); ``expected_total``
        None: the cells asked for so far (a search does not know its length)."""
        total = expected_total if expected_total is not None else len(self.cells)
        done = len(self.finished)
        parts = [f"{done}/{total} cells done", f"{len(self.started) if running is None else running} running"]
        if self.failures:
            parts.append(f"{len(self.failures)} failed")
        left = max(total - done - len(self.failures), 0)
        if left and self.finished_here and elapsed_s > 0:
            parts.append(f"ETA {format_duration(left * elapsed_s / self.finished_here)}")
        return ", ".join(parts)


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "-"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
