"""The sweep's side of the cell protocol on RabbitMQ (services/cli/sweep_amqp.py): a result is
acknowledged only once the sweep's loop is past it, so a sweep that stops in the middle gets the
result again when it restarts, and one that completes leaves nothing behind. ~1-2 s (a broker)."""

from __future__ import annotations

import asyncio

from common.messages import SweepCellFinished
from services.cli.sweep_amqp import AmqpEngine
from sim.sweep_cells import SweepSpec, table_digest
from sim.sweep_service import CELLS_QUEUE, results_queue

SPEC = SweepSpec(20, False, {"v100": 2}, table_digest(None))


async def test_a_result_in_hand_when_the_sweep_stops_comes_back_to_its_restart(rabbit):
    cell = SPEC.cell("fifo", 2.0, 0)
    first_bus = await rabbit.connect("sweep")
    sweep = AmqpEngine(first_bus, SPEC.sweep_id)
    assert await sweep.open() == 0  # the cells queue exists, nobody consumes it yet
    await sweep.submit([cell])
    simulator = await rabbit.connect("simulator")
    assert await simulator.queue_depth(CELLS_QUEUE) == 1  # the cell waits for a simulator
    result = SweepCellFinished(SPEC.sweep_id, cell.cell_id, "sim", 3600.0, 0.5, 20, 20, 1.0)
    await simulator.publish(result)

    assert await asyncio.wait_for(sweep.next_event(), 10) == result
    sweep.close(complete=False)  # stopped before its ledger line was written
    await first_bus.close()

    second_bus = await rabbit.connect("sweep-again")
    restarted = AmqpEngine(second_bus, SPEC.sweep_id)
    await restarted.open()
    assert await asyncio.wait_for(restarted.next_event(), 10) == result  # redelivered
    restarted.close(complete=True)
    await second_bus.close()

    checker = await rabbit.connect("checker")
    assert await checker.queue_depth(results_queue(SPEC.sweep_id)) == 0  # acknowledged this time
