"""Running a sweep: the loop that asks the plan for cells, hands them to an engine and takes the
results back, and the local engine (worker processes on this machine). The engine over RabbitMQ
is services/cli/sweep_amqp.py's; both run each cell with sim/sweep_cells.py's ``run_cell``.

The loop, as numbered steps:

1. the plan names the cells it needs now, given every result so far (sim/sweep_plan.py);
2. those not asked for yet are handed to the engine;
3. when the plan needs nothing and no cell is open, the sweep is complete;
4. else wait for the engine's next event: a cell started (counted as running), or a result,
   which the book accepts once (sim/sweep_ledger.py), the ledger keeps at once, and the caller
   is told of (a progress line); then back to 1 (a search's next cell depends on it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import multiprocessing
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from common.children import die_with_parent
from common.messages import SweepCellFinished, SweepCellRequested, SweepCellStarted
from policy_service.answer import SolveContext
from sim.sweep_cells import SweepSpec, failed, run_cell
from sim.sweep_ledger import CellResult, LedgerFile, SweepBook
from sim.sweep_plan import SweepPlan

Event = SweepCellFinished | SweepCellStarted


class SweepEngine(Protocol):
    async def submit(self, cells: list[SweepCellRequested]) -> None: ...

    async def next_event(self) -> Event: ...


async def drive(
    plan: SweepPlan,
    spec: SweepSpec,
    book: SweepBook,
    ledger: LedgerFile | None,
    engine: SweepEngine,
    kept: Mapping[str, SweepCellFinished] | None = None,
    on_result: Callable[[CellResult], None] = lambda _: None,
) -> None:
    """Run the plan to completion on the engine (the numbered steps above); ``kept``: the
    ledger's results of this sweep (sim/sweep_ledger.py), taken instead of running their cells."""
    kept = kept or {}
    while True:
        # 1-2. what the plan needs now: from the ledger if it has it, else asked for once
        needed = [spec.cell(p, r, s, o) for p, r, s, o in plan.needed(book.results())]
        if book.restore(kept, needed):
            continue  # a search's next cells depend on these
        new = book.ask(needed)
        if new:
            await engine.submit(new)
        # 3. complete
        if not needed and book.open_cells == 0:
            return
        # 4. the next event
        event = await engine.next_event()
        if isinstance(event, SweepCellStarted):
            book.start(event.sweep_id, event.cell_id)
            continue
        accepted = book.accept(event)
        if accepted is None:
            continue  # another sweep's, a cell not asked for, or one finished already
        if ledger is not None:
            ledger.append(accepted.cell, accepted.result)
        on_result(accepted)


class LocalEngine:
    """Cells on worker processes of this machine (spawned: a fork would copy the parent's solver
    state). A worker that dies breaks the pool: ``BrokenProcessPool`` is raised from
    ``next_event`` (the ledger keeps what finished; a restart goes on from there)."""

    def __init__(self, contexts: Mapping[str, SolveContext], processes: int) -> None:
        self._executor = concurrent.futures.ProcessPoolExecutor(
            max_workers=processes,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(dict(contexts),),
        )
        self._events: asyncio.Queue[Event | BaseException] = asyncio.Queue()

    async def submit(self, cells: list[SweepCellRequested]) -> None:
        loop = asyncio.get_running_loop()
        for cell in cells:
            future = self._executor.submit(_run_in_worker, cell)
            # a worker process runs one cell at a time: the cell it took is the one running
            future.add_done_callback(lambda f, c=cell: _call_soon(loop, self._done, c, f))

    def _done(self, cell: SweepCellRequested, future: concurrent.futures.Future[SweepCellFinished]) -> None:
        if future.cancelled():
            return
        error = future.exception()
        if isinstance(error, concurrent.futures.process.BrokenProcessPool):
            self._events.put_nowait(error)
        elif error is not None:
            self._events.put_nowait(failed(cell, "local", f"{type(error).__name__}: {error}"))
        else:
            self._events.put_nowait(future.result())

    async def next_event(self) -> Event:
        event = await self._events.get()
        if isinstance(event, BaseException):
            raise event
        return event

    def close(self) -> None:
        # On an error or Ctrl-C, drop the cells not started yet instead of finishing them.
        self._executor.shutdown(wait=True, cancel_futures=True)


def _call_soon(loop: asyncio.AbstractEventLoop, *call: object) -> None:
    """From the executor's thread onto the loop, unless the loop is gone (the sweep stopped:
    Ctrl-C, an error) and nobody waits for the cell any more."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(*call)  # type: ignore[arg-type]


_contexts: dict[str, SolveContext] = {}


def _init_worker(contexts: dict[str, SolveContext]) -> None:
    die_with_parent()
    _contexts.update(contexts)


def _run_in_worker(cell: SweepCellRequested) -> SweepCellFinished:
    return run_cell(cell, _contexts, "local")


def elapsed_clock() -> Callable[[], float]:
    """Seconds since the call, on a monotonic clock (the progress line's ETA)."""
    started_s = time.monotonic()
    return lambda: time.monotonic() - started_s
