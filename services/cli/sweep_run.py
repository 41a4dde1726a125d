"""Running a checked sweep (services/cli/sweep_cmd.py): on local worker processes or over
RabbitMQ, with its progress on stderr: a line as each cell finishes (its figures, then cells done
of the total, running, failed, the ETA from this run's pace).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping

from common.config import Settings
from common.messages import SweepCellFinished
from policy_service.answer import SolveContext
from services.cli.common import CommandFailed, print_lines
from sim.sweep_cells import SweepSpec
from sim.sweep_driver import LocalEngine, drive, elapsed_clock
from sim.sweep_jobs import saturated_note
from sim.sweep_ledger import CellResult, LedgerFile, SweepBook
from sim.sweep_plan import SweepPlan


def _say(line: str) -> None:
    print_lines([line], sys.stderr)
    sys.stderr.flush()


def _reporter(book: SweepBook, total: int | None, running: int | None = None):
    elapsed = elapsed_clock()

    def on_result(done: CellResult) -> None:
        cell, result = done.cell, done.result
        if result.error:
            what = f"failed: {result.error}"
        elif result.saturated:
            what = f"saturated ({result.wall_s:.1f} s): " + saturated_note(
                result.jobs_arrived, cell.jobs_per_hour, (cell.window_start, cell.window_end)
            )
        else:
            f = done.figures
            jct = "-" if f.avg_jct_s is None else f"{f.avg_jct_s / 3600:.2f} h"
            util = "-" if f.utilization is None else f"{f.utilization:.0%}"
            arrived = f", {result.jobs_arrived} jobs arrived" if result.jobs_arrived else ""
            what = f"avg JCT {jct}, utilisation {util}, {result.jobs_completed}/{result.jobs_measured} done{arrived} ({result.wall_s:.1f} s)"
        where = f" on {result.simulator}" if result.simulator != "local" else ""
        shown = None if running is None else min(running, book.open_cells)  # local: every worker busy while cells wait
        variant = f" [{cell.option}]" if cell.option else ""
        _say(
            f"[{book.progress(elapsed(), total, shown)}] {cell.policy}{variant} at {cell.jobs_per_hour:g} jobs/h, "
            f"seed {cell.seed}{where}: {what}"
        )

    return on_result


async def run_local(
    plan: SweepPlan, spec: SweepSpec, book: SweepBook, ledger: LedgerFile, kept: Mapping[str, SweepCellFinished],
    contexts: Mapping[str, SolveContext], processes: int, header: str, total: int | None,
) -> None:
    import concurrent.futures

    restored = _restored_line(plan, spec, kept)
    _say(header + restored)
    engine = LocalEngine(contexts, processes)
    try:
        await drive(plan, spec, book, ledger, engine, kept, _reporter(book, total, processes))
    except asyncio.CancelledError:  # Ctrl-C
        _say(_stopped(book, ledger, ""))
        raise
    except concurrent.futures.process.BrokenProcessPool as e:
        raise CommandFailed(
            f"a sweep worker process died ({e}); try fewer --processes (the finished cells are kept: the same command "
            "again goes on from them)", exit_code=1,
        ) from None
    finally:
        engine.close()


async def run_amqp(
    plan: SweepPlan, spec: SweepSpec, book: SweepBook, ledger: LedgerFile, kept: Mapping[str, SweepCellFinished],
    settings: Settings, amqp: str | None, header: str, total: int | None,
) -> None:
    import dataclasses

    from common.config import BusSettings, redact_url
    from services.cli.common import open_bus
    from services.cli.sweep_amqp import AmqpEngine, delete_results_queue

    bus_settings = dataclasses.replace(settings.bus, kind="amqp")
    if amqp:  # as open_bus reads it
        bus_settings = dataclasses.replace(bus_settings, amqp_url=BusSettings.from_env({"GAVEL_AMQP_URL": amqp}).amqp_url)
    bus = await open_bus(settings, amqp)
    try:
        engine = AmqpEngine(bus, spec.sweep_id)
        simulators = await engine.open()
        _say(
            f"{header}, over RabbitMQ at {redact_url(bus_settings.amqp_url)} (exchange {bus_settings.exchange}, "
            f"sweep {spec.sweep_id}); {simulators if simulators is not None else '?'} simulator(s) listening"
            + _restored_line(plan, spec, kept)
        )
        if not simulators:
            _say("sweep: no simulator takes cells yet: the cells wait in the queue; start `gavel serve simulator` (any machine)")
        complete = False
        try:
            await drive(plan, spec, book, ledger, engine, kept, _reporter(book, total))
            complete = True
        except asyncio.CancelledError:  # Ctrl-C
            _say(_stopped(book, ledger, "; the cells published stay queued for the simulators, and their results wait for it"))
            raise
        finally:
            engine.close(complete=complete)
    finally:
        await bus.close()
    await delete_results_queue(bus_settings, spec.sweep_id)


def _stopped(book: SweepBook, ledger: LedgerFile, more: str) -> str:
    return (
        f"sweep: stopped with {len(book.finished)} cell(s) done, kept in {ledger.path}: the same command again "
        f"goes on from them{more}"
    )


def _restored_line(plan: SweepPlan, spec: SweepSpec, kept: Mapping[str, SweepCellFinished]) -> str:
    """How many of the ledger's results this plan takes: the ledger of an --out keeps the cells
    of every variant, cutoff or rate list run there before, and only this plan's are not run
    again (the plan is walked as the driver walks it, so a search counts the chain it reuses)."""
    book = SweepBook(spec.sweep_id)
    while book.restore(kept, [spec.cell(*key) for key in plan.needed(book.results())]):
        pass
    if not book.finished:
        return ""
    return f"; {len(book.finished)} cell(s) of this sweep already in the ledger: not run again"
