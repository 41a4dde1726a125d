"""Bus throughput: job submissions through the in-memory bus and through RabbitMQ.

For each transport: publish N realistic JobSubmitted messages and consume them, median of 3 runs.
- in-memory: publish all, then drain one consumer (objects handed over; and with every message
  through the codec, as a wire would);
- RabbitMQ: persistent messages with publisher confirms into a durable queue, many publishes in
  flight (``publish_many``), then one consumer takes them all (decode, handler, ack). The baseline
  is the same publish awaited one at a time.

Targets (issue 2): >= 5,000 confirmed persistent publishes/s over RabbitMQ from one process, and
>= 100,000 messages/s through the in-memory bus.

Usage: python bench/bus_throughput.py [--messages N] [--runs 3] [--amqp URL] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.bus import Delivery  # noqa: E402
from common.config import DEFAULT_AMQP_URL, BusSettings  # noqa: E402
from common.messages import JobSpec, JobSubmitted  # noqa: E402
from common.transport.memory import InMemoryBroker, InMemoryBus  # noqa: E402

JOB_TYPES = [
    "ResNet-18 (batch size 64)",
    "ResNet-50 (batch size 64)",
    "Transformer (batch size 128)",
    "LM (batch size 20)",
    "Recommendation (batch size 1024)",
    "A3C",
    "CycleGAN",
]
IN_MEMORY_TARGET_PER_S = 100_000
RABBIT_PUBLISH_TARGET_PER_S = 5_000


def submissions(n: int) -> list[JobSubmitted]:
    """Bodies like a trace replay sends: varied types, steps, scale factors, some SLOs."""
    out = []
    for i in range(n):
        out.append(
            JobSubmitted(
                JobSpec(
                    job_id=f"job-{i:07d}",
                    job_type=JOB_TYPES[i % len(JOB_TYPES)],
                    total_steps=1_000 + (i * 7919) % 500_000,
                    scale_factor=(1, 1, 1, 1, 1, 1, 1, 2, 4, 8)[i % 10],
                    priority_weight=(1.0, 1.0, 2.0)[i % 3],
                    slo_s=None if i % 4 else 3600.0 * (1 + i % 24),
                    entity=("team-a", "team-b", None)[i % 3],
                    command="python3 train.py --data /data --steps {steps}",
                    submit_time_s=float(i) * 2.5,
                )
            )
        )
    return out


async def in_memory_run(messages: list[JobSubmitted], serialize: bool) -> float:
    broker = InMemoryBroker(serialize=serialize)
    bus = InMemoryBus(broker)
    await bus.start()
    received = 0

    async def count(d: Delivery) -> None:
        nonlocal received
        received += 1

    await bus.subscribe("mechanism", ["job.submitted"], count, prefetch=256)
    started = time.perf_counter()
    for m in messages:
        await bus.publish(m)
    await bus.drain()
    elapsed = time.perf_counter() - started
    await bus.close()
    assert received == len(messages), (received, len(messages))
    return len(messages) / elapsed


async def rabbit_run(messages: list[JobSubmitted], url: str, one_at_a_time: bool) -> dict[str, float]:
    from common.transport.rabbit import RabbitBus

    exchange = f"gavel-bench-{uuid.uuid4().hex[:8]}"
    settings = BusSettings(kind="amqp", amqp_url=url, exchange=exchange, prefetch=512)
    bus = RabbitBus(settings, source="bench")
    await bus.start()
    try:
        done = asyncio.Event()
        received = 0
        n = len(messages)
        gate = asyncio.Event()  # consumer attached but held until every publish is confirmed

        async def count(d: Delivery) -> None:
            nonlocal received
            await gate.wait()
            received += 1
            if received == n:
                done.set()

        await bus.subscribe("mechanism", ["job.submitted"], count, prefetch=512)
        started = time.perf_counter()
        if one_at_a_time:
            for m in messages:
                await bus.publish(m)
        else:
            await bus.publish_many(messages)
        published = time.perf_counter()
        gate.set()
        await asyncio.wait_for(done.wait(), 600)
        consumed = time.perf_counter()
        return {
            "publish_per_s": n / (published - started),
            "consume_per_s": n / (consumed - published),
            "end_to_end_per_s": n / (consumed - started),
        }
    finally:
        await bus.close()
        cleaner = RabbitBus(settings, source="bench-cleanup")
        await cleaner.start()
        await cleaner.delete_topology([f"{exchange}.mechanism"])
        await cleaner.close()


def median_of(runs: int, make: Callable[[], Awaitable[float]]) -> tuple[float, list[float]]:
    values = [asyncio.run(make()) for _ in range(runs)]
    return statistics.median(values), values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--amqp", default=None, help=f"broker URL (default GAVEL_AMQP_URL or {DEFAULT_AMQP_URL})")
    parser.add_argument("--skip-rabbit", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import os

    from common.log import configure_logging

    configure_logging()
    url = args.amqp or os.environ.get("GAVEL_AMQP_URL") or DEFAULT_AMQP_URL
    messages = submissions(args.messages)
    results: dict[str, object] = {"messages": args.messages, "runs": args.runs}

    mem, mem_runs = median_of(args.runs, lambda: in_memory_run(messages, serialize=False))
    ser, ser_runs = median_of(args.runs, lambda: in_memory_run(messages, serialize=True))
    results["in_memory"] = {"messages_per_s": mem, "runs": mem_runs, "target_per_s": IN_MEMORY_TARGET_PER_S}
    results["in_memory_serialized"] = {"messages_per_s": ser, "runs": ser_runs}

    if not args.skip_rabbit:
        windowed = [asyncio.run(rabbit_run(messages, url, one_at_a_time=False)) for _ in range(args.runs)]
        baseline_n = messages[: min(len(messages), 5_000)]
        serial = [asyncio.run(rabbit_run(baseline_n, url, one_at_a_time=True)) for _ in range(args.runs)]

        def med(rows: list[dict[str, float]], key: str) -> float:
            return statistics.median(r[key] for r in rows)

        results["rabbit"] = {
            "publish_per_s": med(windowed, "publish_per_s"),
            "consume_per_s": med(windowed, "consume_per_s"),
            "end_to_end_per_s": med(windowed, "end_to_end_per_s"),
            "runs": windowed,
            "target_publish_per_s": RABBIT_PUBLISH_TARGET_PER_S,
            "baseline_one_at_a_time_publish_per_s": med(serial, "publish_per_s"),
        }

    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"bus throughput, {args.messages} JobSubmitted messages, median of {args.runs} runs\n")
    print(f"{'transport':44} {'messages/s':>12}  target")
    print(f"{'in-memory (objects)':44} {mem:>12,.0f}  >= {IN_MEMORY_TARGET_PER_S:,} {'ok' if mem >= IN_MEMORY_TARGET_PER_S else 'MISSED'}")
    print(f"{'in-memory (every message through the codec)':44} {ser:>12,.0f}")
    if "rabbit" in results:
        r = results["rabbit"]
        assert isinstance(r, dict)
        ok = "ok" if r["publish_per_s"] >= RABBIT_PUBLISH_TARGET_PER_S else "MISSED"
        print(f"{'RabbitMQ publish, persistent + confirms':44} {r['publish_per_s']:>12,.0f}  >= {RABBIT_PUBLISH_TARGET_PER_S:,} {ok}")
        print(f"{'RabbitMQ consume (decode, handle, ack)':44} {r['consume_per_s']:>12,.0f}")
        print(f"{'RabbitMQ publish + consume, end to end':44} {r['end_to_end_per_s']:>12,.0f}")
        base = r["baseline_one_at_a_time_publish_per_s"]
        print(f"{'baseline: publish awaiting each confirm':44} {base:>12,.0f}")
        print(f"\nwindowed publishing is {r['publish_per_s'] / base:.2f}x the one-at-a-time baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
