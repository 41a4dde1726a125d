"""``gavel serve simulator``: a service that takes a distributed sweep's cells from the shared
work queue, runs each one (sim/sweep_cells.py's ``run_cell``, the code a local sweep runs) and
publishes its result on the sweep's own key. Run any number, on any machines, against one broker.

Delivery, as RabbitMQ gives it (the bus: common/transport/rabbit.py):

- the queue ``<exchange>.sweep.cells`` is durable and its messages persistent (the sweep declares
  it before it publishes, so cells wait for simulators that start later);
- prefetch 1: a simulator holds one cell at a time, the others stay in the queue for the rest;
- the cell is acknowledged after its result is published and confirmed: a simulator killed
  mid-cell (SIGKILL, a lost machine) never acknowledged it, and the broker hands it to another
  simulator (marked redelivered). The sweep counts a result twice only once;
- a cell runs in a child process, so a cell that crashes its process (a native crash, the
  kernel's OOM killer) is answered with a failure result naming it and the reason, and the next
  cell gets a new process; a cell that raises is answered the same way. Neither is retried:
  a poison cell cannot loop. A result the broker cannot route (the sweep is over and deleted its
  results queue) is logged and dropped; a result that cannot be published at all makes the
  handler fail, and the bus dead-letters the cell with the reason (``<exchange>.dead-letters``);
- a cell whose sweep has no results queue any more (it completed; a copy was left in the queue by
  its restart) is acknowledged without running;
- a cell still running after ``cell_timeout_s`` (``--cell-timeout-s``, 25 minutes by default) is
  stopped and answered with a failure saying so. RabbitMQ takes back a delivery left
  unacknowledged past its ``consumer_timeout`` (30 minutes by default) and hands it to the next
  simulator, which would run it as long again: without this bound such a cell would go round the
  simulators for ever. Raise both together for longer cells (docs/simulator.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import os
import socket
from collections.abc import Mapping

import structlog

from common.bus import Bus, Delivery
from common.children import die_with_parent
from common.errors import UnroutableError
from common.messages import SweepCellFinished, SweepCellRequested, SweepCellStarted
from policy_service.answer import SolveContext
from sim.sweep_cells import describe, failed, run_cell

log = structlog.get_logger("gavel.simulator")

CELLS_QUEUE = "sweep.cells"  # below the exchange: the one queue every simulator competes on
# A cell's wall-time bound: under RabbitMQ's default consumer_timeout (30 min), so the broker
# never takes back a cell that is still running (see the module's docstring).
CELL_TIMEOUT_S = 1500.0
CELLS_BINDINGS = (SweepCellRequested.ROUTING_KEY,)


def results_queue(sweep_id: str) -> str:
    """The sweep's own durable queue of results and starts (below the exchange)."""
    return f"sweep.results.{sweep_id}"


def results_bindings(sweep_id: str) -> tuple[str, ...]:
    return (f"sweep.result.{sweep_id}", f"sweep.started.{sweep_id}")


def default_name() -> str:
    return f"simulator-{socket.gethostname()}-{os.getpid()}"


class SimulatorService:
    """One cell at a time, in a child process; ``contexts``: the throughput tables it holds, by
    digest (sim/sweep_cells.py, table_digest)."""

    def __init__(
        self, contexts: Mapping[str, SolveContext], *, name: str | None = None, cell_timeout_s: float = CELL_TIMEOUT_S
    ) -> None:
        if not cell_timeout_s > 0:
            raise ValueError(f"cell_timeout_s: a positive number of seconds, got {cell_timeout_s!r}")
        self.name = "simulator"
        self.simulator = name or default_name()
        self._cell_timeout_s = cell_timeout_s
        self._contexts = dict(contexts)
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._bus: Bus | None = None
        self._log = log.bind(simulator=self.simulator)

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        self._pool = self._new_pool()
        await bus.subscribe(CELLS_QUEUE, list(CELLS_BINDINGS), self.on_cell, prefetch=1)
        self._log.info("simulator_ready", tables=len(self._contexts))

    async def stop(self) -> None:
        if self._pool is not None:
            _terminate(self._pool)
            self._pool = None

    def _new_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        # spawn, not fork: forking a process that runs an event loop and broker I/O threads is
        # unsafe; the child imports the simulator once and keeps the tables for every cell.
        return concurrent.futures.ProcessPoolExecutor(
            max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=_init_child, initargs=(self._contexts,)
        )

    async def on_cell(self, delivery: Delivery) -> None:
        cell = delivery.message
        if not isinstance(cell, SweepCellRequested):
            raise TypeError(f"{type(cell).__name__} arrived on {delivery.routing_key}")
        assert self._bus is not None
        log_ = self._log.bind(sweep_id=cell.sweep_id, cell_id=cell.cell_id)
        # 0. a cell of a sweep that is over (its results queue deleted: a copy left in the queue
        # after a restart published it again) is not worth running
        if await self._bus.consumer_count(results_queue(cell.sweep_id)) is None:
            log_.info("sweep_gone", reason="no results queue for this sweep: it is over or was given up; cell skipped")
            return
        # 1. say it runs (the sweep's progress; not mandatory: a sweep that is gone needs no word)
        log_.info("cell_started", cell=describe(cell), redelivered=delivery.redelivered)
        await self._bus.publish(SweepCellStarted(cell.sweep_id, cell.cell_id, self.simulator), mandatory=False)
        # 2. run it in the child process
        result = await self._run(cell)
        if result.error:
            log_.warning("cell_failed", cell=describe(cell), reason=result.error)
        else:
            log_.info("cell_finished", avg_jct_s=result.avg_jct_s, saturated=result.saturated, wall_s=round(result.wall_s, 3))
        # 3. the result, confirmed; returning acknowledges the cell
        try:
            await self._bus.publish(result, correlation_id=delivery.envelope.message_id)
        except UnroutableError:
            log_.warning("sweep_gone", reason="no results queue for this sweep: it is over or was given up; result dropped")

    async def _run(self, cell: SweepCellRequested) -> SweepCellFinished:
        assert self._pool is not None
        try:
            return await asyncio.wait_for(
                asyncio.get_running_loop().run_in_executor(self._pool, _run_in_child, cell, self.simulator),
                self._cell_timeout_s,
            )
        except TimeoutError:
            _terminate(self._pool)  # the child computes on otherwise: stop it, start another
            self._pool = self._new_pool()
            return failed(
                cell, self.simulator,
                f"ran longer than the simulator's --cell-timeout-s ({self._cell_timeout_s:g} s); stopped: give the "
                "simulators a longer bound and RabbitMQ a longer consumer_timeout for cells this long (docs/simulator.md)",
            )
        except concurrent.futures.process.BrokenProcessPool:
            # The child died under this cell (killed, a native crash, out of memory): answered,
            # not retried; the next cell gets a new child.
            self._pool = self._new_pool()
            return failed(cell, self.simulator, "the simulator's child process died running this cell (killed, crashed or out of memory)")
        except Exception as e:  # noqa: BLE001 - a cell must cost one answer, never the simulator
            self._log.exception("cell_crashed", cell_id=cell.cell_id)
            return failed(cell, self.simulator, f"{type(e).__name__}: {e}")


def _terminate(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """Stop the child now, mid-cell if need be: its cell was not acknowledged and goes back to
    the queue for another simulator (waiting for it would hold a stop for as long as a cell runs)."""
    # _processes is the executor's own table of its children; there is no public way to stop a
    # running task, and leaving the child would keep it computing a cell nobody waits for.
    for process in list(getattr(pool, "_processes", {}).values()):
        process.terminate()
    pool.shutdown(wait=False, cancel_futures=True)


_contexts: dict[str, SolveContext] = {}


def _init_child(contexts: dict[str, SolveContext]) -> None:
    die_with_parent()  # a simulator killed with SIGKILL leaves no child behind
    _contexts.update(contexts)


def _run_in_child(cell: SweepCellRequested, simulator: str) -> SweepCellFinished:
    return run_cell(cell, _contexts, simulator)
