"""Prometheus metrics: a registry per process, ``gavel_build_info``, and the HTTP endpoint that
serves them (docs/metrics.md is the catalog).

One registry per process, injected, never prometheus_client's global one: `gavel up` runs several
services in one process and tests start many, and each must count its own. A service given no
registry makes a private one nobody serves, so the code that counts is the same either way.

The endpoint runs on the event loop (asyncio.start_server), not in prometheus_client's thread:
scrape-time collectors (a service's state turned into gauges) then run on the loop thread, between
two handlers, and read the service's memory without locks and without seeing half a change.
"""

from __future__ import annotations

import asyncio
import bisect
import errno
import functools
from collections.abc import Callable, Iterable
from typing import TypeVar

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from common.errors import ConfigError

log = structlog.get_logger("gavel.metrics")
T = TypeVar("T", "Tally", "Spread")

DEFAULT_HOST = "127.0.0.1"
_REQUEST_LIMIT = 16 * 1024  # bytes of request head read at most: a scrape is one short GET
_READ_TIMEOUT_S = 10.0

__all__ = [
    "CollectorRegistry", "Counter", "Gauge", "Histogram", "CounterMetricFamily", "GaugeMetricFamily", "Collector",
    "MetricsEndpoint", "build_info", "gavel_version", "registry_or_private", "FunctionCollector", "WorkerMetrics",
    "LoopMetrics", "Tally", "Spread",
]


@functools.cache  # the package's metadata is read once a process: every service asks at its start
def gavel_version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415 - on first use

    try:
        return version("gavel-scheduler")
    except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
        return "unknown"


def registry_or_private(registry: CollectorRegistry | None) -> CollectorRegistry:
    """The registry given, or a private one nobody serves (metrics off: the same code counts)."""
    return registry if registry is not None else CollectorRegistry(auto_describe=False)


def build_info(registry: CollectorRegistry, service: str, version: str | None = None) -> None:
    """``gavel_build_info{version,service} 1``; `gavel up` adds one per service to one registry."""
    collector = getattr(registry, "_gavel_build_info", None)
    if collector is None:
        collector = _BuildInfo()
        registry.register(collector)
        registry._gavel_build_info = collector  # type: ignore[attr-defined]  # one family per registry
    collector.services[service] = version or gavel_version()


class _BuildInfo(Collector):
    def __init__(self) -> None:
        self.services: dict[str, str] = {}

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily("gavel_build_info", "what runs: 1 per service", labels=("version", "service"))
        for service, version in sorted(self.services.items()):
            family.add_metric((version, service), 1.0)
        yield family


class FunctionCollector(Collector):
    """Families made at scrape time by a function (a service's state read into gauges)."""

    def __init__(self, collect: Callable[[], Iterable[GaugeMetricFamily | CounterMetricFamily]]) -> None:
        self._collect = collect

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        yield from self._collect()


class Tally:
    """A counter family counted in plain numbers, per label values: a few tens of nanoseconds an
    increment where prometheus_client's counter takes a lock (about 1 us, 2.5 with its label
    look-up). Only for what is counted on the event loop's thread, which is also where the
    endpoint reads it."""

    __slots__ = ("name", "documentation", "labels", "values")

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...] = (), *, known: Iterable[tuple[str, ...]] = ()) -> None:
        self.name = name  # without _total: the exposition adds it
        self.documentation = documentation
        self.labels = labels
        # exported at 0 from the start (a counter without labels too): a series that appears only
        # at its first increment has no increase() over that increment
        self.values: dict[tuple[str, ...], float] = dict.fromkeys(known if labels else [()], 0.0)

    def inc(self, key: tuple[str, ...] = (), by: float = 1.0) -> None:
        self.values[key] = self.values.get(key, 0.0) + by

    def family(self) -> CounterMetricFamily:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        for key, value in self.values.items():
            family.add_metric(key, value)
        return family


class Spread:
    """A histogram counted as a Tally is (the loop's thread only): the bucket an observation falls
    in (bisect over the bounds), and the sum."""

    __slots__ = ("name", "documentation", "bounds", "counts", "total")

    def __init__(self, name: str, documentation: str, buckets: Iterable[float]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = sorted(b for b in buckets if b != float("inf"))
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # le: value <= bound
        self.total += value

    def family(self) -> HistogramMetricFamily:
        cumulative, buckets = 0, []
        for bound, count in zip([*self.bounds, float("inf")], self.counts, strict=True):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        return HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=self.total)


class LoopMetrics(Collector):
    """Tallies and spreads registered as one collector; ``add`` returns what it is given."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._parts: list[Tally | Spread] = []
        registry.register(self)

    def add(self, part: T) -> T:
        self._parts.append(part)
        return part

    def collect(self) -> Iterable[CounterMetricFamily | HistogramMetricFamily]:
        for part in self._parts:
            yield part.family()


class MetricsEndpoint:
    """``GET /metrics`` answered from ``registry`` in Prometheus's text format; anything else 404."""

    def __init__(self, registry: CollectorRegistry, *, host: str = DEFAULT_HOST, port: int = 0) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self._server: asyncio.base_events.Server | None = None

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None, "start() first"
        name = self._server.sockets[0].getsockname()
        return str(name[0]), int(name[1])

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host if ':' not in host else f'[{host}]'}:{port}/metrics"

    async def start(self) -> None:
        """Bind and listen; a port in use (or not ours to bind) is one ConfigError naming it."""
        try:
            self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=_REQUEST_LIMIT)
        except OSError as e:
            why = "is in use" if e.errno == errno.EADDRINUSE else f"cannot be bound ({e.strerror or e})"
            raise ConfigError(f"--metrics-port: {self.host}:{self.port} {why}") from None
        host, port = self.address
        log.info("metrics_serving", url=self.url, host=host, port=port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT_S)
            status, ctype, body = self._answer(head.split(b"\r\n", 1)[0])
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
            writer.close()
            return
        except Exception as e:  # a collector that failed: say so, and keep serving
            log.error("metrics_collect_failed", error=repr(e))
            status, ctype, body = "500 Internal Server Error", "text/plain; charset=utf-8", b"collect failed\n"
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        try:
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    def _answer(self, request_line: bytes) -> tuple[str, str, bytes]:
        parts = request_line.decode("latin-1").split()
        if len(parts) != 3 or parts[0] not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain; charset=utf-8", b"GET /metrics\n"
        if parts[1].split("?", 1)[0] != "/metrics":
            return "404 Not Found", "text/plain; charset=utf-8", b"not found: GET /metrics\n"
        body = generate_latest(self.registry)
        # the text format 0.0.4 (what generate_latest writes), as prometheus_client's own server
        # says it: every Prometheus version reads it
        return "200 OK", CONTENT_TYPE_PLAIN_0_0_4, b"" if parts[0] == "HEAD" else body


LEASE_OUTCOMES = ("lease_end", "finished", "killed", "crashed")


class WorkerMetrics:
    """docs/metrics.md, "Workers and the fleet": one family for a real worker (one worker id) and
    a simulated fleet (one per server), so a dashboard reads both alike. ``running`` says, when
    scraped, how many jobs each worker runs now."""

    def __init__(
        self, registry: CollectorRegistry | None, service: str, running: Callable[[], Iterable[tuple[str, int]]]
    ) -> None:
        r = registry_or_private(registry)
        build_info(r, service)
        self.leases = LoopMetrics(r).add(
            Tally("gavel_worker_leases", "leases ended, per how: lease_end, finished, killed, crashed", ("worker_id", "outcome"))
        )
        self._running = running
        r.register(FunctionCollector(self._families))

    def lease_ended(self, worker_id: str, outcome: str) -> None:
        """A lease's report (JobProgress.outcome; "" is a lease that ran its time)."""
        self.leases.inc((worker_id, outcome if outcome in LEASE_OUTCOMES else "lease_end"))

    def _families(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily("gavel_worker_jobs_running", "jobs running, per worker", labels=("worker_id",))
        for worker_id, n in self._running():
            family.add_metric((worker_id,), n)
        yield family
