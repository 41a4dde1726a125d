"""The metrics endpoint and the families every service shares (common/metrics.py)."""

from __future__ import annotations

import asyncio
import socket

import pytest
from prometheus_client import generate_latest

from common.errors import ConfigError
from common.metrics import CollectorRegistry, LoopMetrics, MetricsEndpoint, Spread, Tally, WorkerMetrics, build_info
from tests.support.scrape import ascrape, parse, total, value


async def get(endpoint: MetricsEndpoint, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(*endpoint.address)
    writer.write(request)
    answer = await reader.read()
    writer.close()
    return answer


async def test_get_metrics_is_the_text_format_and_anything_else_is_refused() -> None:
    registry = CollectorRegistry(auto_describe=False)
    build_info(registry, "policy", "1.2.3")
    build_info(registry, "mechanism", "1.2.3")  # `gavel up`: one family, one sample a service
    endpoint = MetricsEndpoint(registry, port=0)
    await endpoint.start()
    try:
        s = await ascrape(endpoint.url)
        assert value(s, "gavel_build_info", version="1.2.3", service="policy") == 1.0
        assert value(s, "gavel_build_info", version="1.2.3", service="mechanism") == 1.0
        assert (await get(endpoint, b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n")).startswith(b"HTTP/1.1 404 ")
        assert (await get(endpoint, b"POST /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 405 ")
        assert (await get(endpoint, b"\r\n\r\n")).startswith(b"HTTP/1.1 405 ")
        half = await asyncio.open_connection(*endpoint.address)  # a client that says nothing and goes
        half[1].close()
        assert value(await ascrape(endpoint.url), "gavel_build_info", version="1.2.3", service="policy") == 1.0
    finally:
        await endpoint.close()


async def test_a_port_in_use_is_one_error_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"--metrics-port: 127.0.0.1:{port} is in use"):
            await MetricsEndpoint(CollectorRegistry(), port=port).start()


def test_worker_leases_count_by_outcome_and_jobs_running_is_read_when_scraped() -> None:
    registry = CollectorRegistry(auto_describe=False)
    running = {"v100-0": 2, "v100-1": 0}
    metrics = WorkerMetrics(registry, "fleet", lambda: running.items())
    for outcome in ("", "lease_end", "finished", "crashed", "something new"):
        metrics.lease_ended("v100-0", outcome)
    s = parse(generate_latest(registry).decode())
    assert value(s, "gavel_worker_leases_total", worker_id="v100-0", outcome="lease_end") == 3  # "", and the unknown
    assert value(s, "gavel_worker_leases_total", worker_id="v100-0", outcome="finished") == 1
    assert value(s, "gavel_worker_leases_total", worker_id="v100-0", outcome="crashed") == 1
    assert value(s, "gavel_worker_jobs_running", worker_id="v100-0") == 2
    running["v100-0"] = 0
    assert total(parse(generate_latest(registry).decode()), "gavel_worker_jobs_running") == 0


def test_tallies_and_spreads_expose_as_prometheus_counters_and_histograms() -> None:
    registry = CollectorRegistry(auto_describe=False)
    m = LoopMetrics(registry)
    ends = m.add(Tally("gavel_test_ends", "ends", ("outcome",), known=[("completed",), ("failed",)]))
    wait = m.add(Spread("gavel_test_wait_seconds", "wait", (1.0, 10.0, float("inf"))))
    losses = m.add(Tally("gavel_test_losses", "losses"))
    assert value(parse(generate_latest(registry).decode()), "gavel_test_losses_total") == 0.0  # there before any
    losses.inc()
    ends.inc(("completed",))
    ends.inc(("completed",), 2.0)
    for seconds in (0.5, 1.0, 3.0, 50.0):
        wait.observe(seconds)
    s = parse(generate_latest(registry).decode())
    assert value(s, "gavel_test_ends_total", outcome="completed") == 3.0
    assert value(s, "gavel_test_ends_total", outcome="failed") == 0.0  # known: there from the start
    assert value(s, "gavel_test_wait_seconds_bucket", le="1.0") == 2  # le: at or below the bound
    assert value(s, "gavel_test_wait_seconds_bucket", le="10.0") == 3
    assert value(s, "gavel_test_wait_seconds_bucket", le="+Inf") == value(s, "gavel_test_wait_seconds_count") == 4
    assert value(s, "gavel_test_wait_seconds_sum") == 54.5
    assert value(s, "gavel_test_losses_total") == 1.0
