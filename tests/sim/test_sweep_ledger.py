"""A sweep's bookkeeping (sim/sweep_ledger.py) and its cells' ids (sim/sweep_cells.py): what a
restart keeps, what it ignores, what counts once."""

from __future__ import annotations

import json
import math

from common.messages import SweepCellFinished
from sim.sweep_cells import SweepSpec, Variant, table_digest
from sim.sweep_ledger import (
    CellResult,
    LedgerFile,
    SweepBook,
    ledger_line,
    parse_ledger,
)
from sim.sweep_plan import Figures

SPEC = SweepSpec(30, False, {"v100": 2, "p100": 2, "k80": 2}, table_digest(None))


def result(cell, jct_s=3600.0, util=0.5, error="", simulator="simA"):
    return SweepCellFinished(cell.sweep_id, cell.cell_id, simulator, jct_s, util, 30, 30, 1.0, error)


def test_ids_are_derived_from_what_they_name():
    again = SweepSpec(30, False, {"k80": 2, "p100": 2, "v100": 2}, table_digest(None))
    assert again.sweep_id == SPEC.sweep_id and again.cell("fifo", 2, 0) == SPEC.cell("fifo", 2.0, 0)
    other = SweepSpec(30, False, {"v100": 4, "p100": 2, "k80": 2}, table_digest(None))
    assert other.sweep_id != SPEC.sweep_id
    ids = {SPEC.cell(p, r, s, o).cell_id for p in ("fifo", "las") for r in (2.0, 4.0) for s in (0, 1) for o in ("", "x")}
    assert len(ids) == 16


def test_variants_leave_a_sweeps_ids_as_they_were_and_name_their_own_fields():
    import dataclasses
    import hashlib

    load = Variant("load05", scenario_json='{"mechanism": [["admission", "load"]]}')
    ideal = Variant("ideal", preset="gavel", round_s=60.0, trace_json='{"slos": true}', scenario_json='{"engine": "ideal"}')
    with_variants = dataclasses.replace(SPEC, variants=(load, ideal))
    # a sweep without variants keeps its ids (an old sweep's ledger still resumes), and variants
    # do not change the sweep's id
    old_id = hashlib.sha256(json.dumps([SPEC.sweep_id, "fifo", repr(2.0), 0, ""]).encode()).hexdigest()[:16]
    assert with_variants.sweep_id == SPEC.sweep_id and SPEC.cell("fifo", 2.0, 0).cell_id == old_id
    assert with_variants.cell("fifo", 2.0, 0) == SPEC.cell("fifo", 2.0, 0)
    # a variant's cell carries its fields
    cell = with_variants.cell("fifo", 2.0, 0, "ideal")
    assert (cell.option, cell.preset, cell.round_s, cell.trace_json, cell.scenario_json) == (
        "ideal", "gavel", 60.0, '{"slos": true}', '{"engine": "ideal"}'
    )
    # one variant more leaves the others' ids; other flags under the same label are another cell
    alone = dataclasses.replace(SPEC, variants=(load,))
    assert alone.cell("fifo", 2.0, 0, "load05") == with_variants.cell("fifo", 2.0, 0, "load05")
    changed = dataclasses.replace(SPEC, variants=(Variant("load05", scenario_json='{"mechanism": [["admission", "quota"]]}'),))
    assert changed.cell("fifo", 2.0, 0, "load05").cell_id != alone.cell("fifo", 2.0, 0, "load05").cell_id


def test_a_table_is_named_by_its_content_not_its_formatting():
    table = {"v100": {"('ResNet-18 (batch size 16)', 1)": {"null": 10.0}}}
    assert table_digest(json.dumps(table)) == table_digest(json.dumps(table, indent=4).encode())
    assert table_digest(json.dumps(table)) != table_digest(None)


def test_a_ledger_keeps_the_first_success_of_each_cell_of_this_sweep_only():
    a, b, c = SPEC.cell("fifo", 2.0, 0), SPEC.cell("fifo", 4.0, 0), SPEC.cell("fifo", 8.0, 0)
    foreign = SweepSpec(40, False, {"v100": 2}, table_digest(None)).cell("fifo", 2.0, 0)
    lines = [
        ledger_line(a, result(a, 100.0)),
        ledger_line(a, result(a, 999.0, simulator="simB")),  # redelivered, finished twice
        ledger_line(b, result(b, error="ValueError: boom")),  # a failure: tried again
        ledger_line(foreign, result(foreign)),  # another sweep in the same directory
        ledger_line(c, result(c, 300.0))[:40],  # cut short by a crash
    ]
    kept = parse_ledger(lines, SPEC.sweep_id)
    assert kept == {a.cell_id: result(a, 100.0)}
    # a saturated cell is a result: a restart keeps it, and the search reads it as saturated
    saturated = SweepCellFinished(SPEC.sweep_id, c.cell_id, "local", wall_s=3.0, jobs_arrived=676, saturated=True)
    assert parse_ledger([ledger_line(c, saturated)], SPEC.sweep_id) == {c.cell_id: saturated}
    assert CellResult(c, saturated).figures == Figures(math.inf, 1.0)


def test_the_ledger_file_survives_a_line_cut_short(tmp_path):
    a, b = SPEC.cell("fifo", 2.0, 0), SPEC.cell("fifo", 4.0, 0)
    ledger = LedgerFile(tmp_path / "out")
    assert ledger.read(SPEC.sweep_id) == {}
    ledger.append(a, result(a))
    with ledger.path.open("a") as f:
        f.write('{"sweep_id": "')  # a crash mid-line
    ledger.append(b, result(b, 7200.0))
    assert ledger.read(SPEC.sweep_id) == {a.cell_id: result(a), b.cell_id: result(b, 7200.0)}


def test_the_book_counts_a_result_once_and_refuses_what_is_not_its_own():
    book = SweepBook(SPEC.sweep_id)
    a, b = SPEC.cell("fifo", 2.0, 0), SPEC.cell("las", 2.0, 0)
    assert book.ask([a, b]) == [a, b] and book.ask([a]) == []
    foreign = SweepSpec(40, False, {"v100": 2}, table_digest(None)).cell("fifo", 2.0, 0)
    assert book.accept(result(foreign)) is None  # another sweep's
    assert book.accept(result(SPEC.cell("fifo", 99.0, 0))) is None  # not asked for
    book.start(a.sweep_id, a.cell_id)
    failure = book.accept(result(a, error="the simulator's child process died"))
    assert failure is not None and failure.figures.failed and book.started == set()
    assert book.accept(result(a, 50.0)) is not None  # the redelivered copy succeeded after all
    assert book.accept(result(a, 60.0)) is None  # a duplicate
    assert book.results() == {("fifo", 2.0, 0, ""): Figures(50.0, 0.5)}
    assert (len(book.finished), len(book.failures), book.open_cells) == (1, 0, 1)


def test_a_restored_cell_is_finished_without_running():
    a, b = SPEC.cell("fifo", 2.0, 0), SPEC.cell("fifo", 4.0, 0)
    book = SweepBook(SPEC.sweep_id)
    assert book.restore({a.cell_id: result(a)}, [a, b]) == 1
    assert book.ask([a, b]) == [b]
    assert book.accept(result(a, 1.0)) is None  # a late duplicate of a kept cell


def test_progress_says_done_running_failed_and_the_eta_from_this_runs_pace():
    book = SweepBook(SPEC.sweep_id)
    cells = [SPEC.cell("fifo", float(r), 0) for r in range(1, 9)]
    book.ask(cells)
    book.restore({cells[0].cell_id: result(cells[0])}, cells[:1])  # kept from an earlier run
    book.accept(result(cells[1]))
    book.accept(result(cells[2]))
    book.accept(result(cells[3], error="boom"))
    book.start(SPEC.sweep_id, cells[4].cell_id)
    # 2 finished here in 60 s; 4 cells left: 120 s, said in minutes past 90 s
    assert book.progress(60.0, 8) == "3/8 cells done, 1 running, 1 failed, ETA 2 min"
    assert book.progress(60.0, None, running=2) == "3/8 cells done, 2 running, 1 failed, ETA 2 min"
