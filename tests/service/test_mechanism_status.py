"""Status answers from a live mechanism, over a bus that serializes every message (so the codec's
limits apply as on RabbitMQ)."""

from __future__ import annotations

import pytest

from common.errors import CommandFailed
from common.messages import JobSubmitted
from common.transport.memory import InMemoryBroker, InMemoryBus
from mechanism_service.core.status import Observations, job_report, record_placement
from services.cli.status_cmd import ask_on
from tests.support.clock import SteppedClock
from tests.support.waiting import eventually
from tests.support.world import live_mechanism, spec


async def test_an_answer_longer_than_one_message_string_comes_in_parts() -> None:
    """A few hundred jobs make `gavel jobs` longer than the 64 KiB a string may hold on the wire:
    the mechanism sends parts, the command joins them."""
    bus = InMemoryBus(InMemoryBroker(serialize=True), source="test")
    await bus.start()
    mechanism = live_mechanism(None, SteppedClock())
    await mechanism.start(bus)
    for i in range(600):
        await bus.publish(JobSubmitted(spec(i)))
    # no worker has joined: every job is held (with why) until one that can run it does
    await eventually(lambda: mechanism.state is not None and len(mechanism.memory.held) == 600)
    jobs = await ask_on(bus, "jobs", timeout_s=10)
    assert isinstance(jobs, list) and len(jobs) == 600
    assert len(str(jobs)) > 64 * 1024  # it really did not fit in one part
    assert {row["id"] for row in jobs} == {spec(i).job_id for i in range(600)}
    await mechanism.stop()
    await bus.close()


def test_a_job_that_keeps_its_place_is_one_span_of_rounds() -> None:
    obs = Observations()
    for round_id in range(1000):  # a thousand rounds on the same GPUs: one entry, not a thousand
        record_placement(obs, "a", round_id, 360.0 * round_id, "v100", [0], extended=round_id > 0, packed_with=[])
    record_placement(obs, "a", 1000, 360_000.0, "k80", [8], extended=False, packed_with=["b"])  # moved
    record_placement(obs, "a", 1005, 361_800.0, "k80", [8], extended=False, packed_with=["b"])  # back after a gap
    record_placement(obs, "a", 1006, 362_160.0, "k80", [8], extended=False, packed_with=["b"])  # same place again
    spans = obs.history["a"]
    assert [(s["first_round"], s["last_round"], s["rounds"], s["lease_extensions"]) for s in spans] == [
        (0, 999, 1000, 999), (1000, 1000, 1, 0), (1005, 1006, 2, 0),
    ]
    assert spans[1]["accelerator_type"] == "k80" and spans[1]["packed_with"] == ["b"]


def test_the_job_report_counts_rounds_and_extensions_from_its_spans() -> None:
    obs = Observations()
    for round_id in range(3):
        record_placement(obs, "a", round_id, 0.0, "v100", [0], extended=round_id > 0, packed_with=[])
    obs.rejected["a"] = "for the row to exist"  # a job the state does not know: answered from observations
    report = job_report(None, "a", 0.0, obs)
    assert report["rounds_run"] == 3 and report["lease_extensions"] == 2 and len(report["placements"]) == 1


def test_a_job_that_moves_every_round_keeps_its_newest_spans_and_true_totals() -> None:
    from mechanism_service.core.status import SPANS_KEPT

    obs = Observations()
    for round_id in range(SPANS_KEPT * 3):  # a move every round: a span each
        record_placement(obs, "a", round_id, 0.0, "v100", [round_id % 2], extended=False, packed_with=[])
    assert len(obs.history["a"]) == SPANS_KEPT and obs.history["a"][-1]["first_round"] == SPANS_KEPT * 3 - 1
    obs.rejected["a"] = "for the row to exist"
    report = job_report(None, "a", 0.0, obs)
    assert report["rounds_run"] == SPANS_KEPT * 3 and report["placements_not_shown"] == SPANS_KEPT * 2


async def test_no_mechanism_means_a_clear_error() -> None:
    bus = InMemoryBus(InMemoryBroker(), source="test")
    await bus.start()
    with pytest.raises(CommandFailed, match="not running"):
        await ask_on(bus, "jobs", timeout_s=1)
    await bus.close()
