"""Shared fixtures: the bus harness every contract test runs against every transport."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import structlog

from common.transport.probe import amqp_problem
from tests.support.broker import amqp_url, broker_required
from tests.support.example_plugins import example_site
from tests.support.harness import BusHarness
from tests.support.logs import plain_tracebacks
from tests.support.seeds import DEEP_ENV, deep

plain_tracebacks()  # before any test saves structlog's configuration (tests/support/logs.py says why)

# One thread per process for torch's and the BLAS's thread pools, set before anything imports
# them (nothing above does; subprocesses inherit it). The suite runs small CPU models beside
# broker, worker and other tests' service processes on 2 cores, where a pool of spinning threads
# per process mostly waits for a core: under load average ~3.5 the CycleGAN and ResNet-50 workload
# tests took 99.8 s with the default pools and 10.0 s with one thread (the tests compare runs
# within one setting, so their results do not depend on it). A value already set is kept.
for _pool in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_pool, "1")


@pytest.fixture(scope="session")
def broker_url() -> str:
    """The AMQP URL of a reachable broker. Fails (never skips) under `make test` and CI."""
    url = amqp_url()
    problem = amqp_problem(url)
    if problem:
        if broker_required():
            pytest.fail(f"{problem}; `make broker` starts a local one (GAVEL_REQUIRE_BROKER=1 is set)")
        pytest.skip(f"{problem} (set GAVEL_REQUIRE_BROKER=1 to make this a failure)")
    return url


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """Commands run in-process (services.cli.main) configure logging for a terminal (warnings
    only); put back what the next test expects."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    libraries = {name: logging.getLogger(name).level for name in ("aiormq", "aio_pika")}
    yield
    import common.log

    common.log._configured = False  # the next in-process command configures it again
    structlog.configure(**saved)
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, lib_level in libraries.items():
        logging.getLogger(name).setLevel(lib_level)


def pytest_report_header() -> str:
    """Which tier the seed sweeps (`deep`) run in: said at the top, so a run says what it proved."""
    if deep():
        return f"seed sweeps: every seed ({DEEP_ENV}=1, make test-deep)"
    return f"seed sweeps: a representative subset of each (every seed: make test-deep, or {DEEP_ENV}=1)"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that talks to RabbitMQ carries the `broker` mark (`-m "not broker"` skips them).
    On xdist workers the slow tests come first (the order is otherwise kept, and every worker
    sorts alike): a minute-long test handed out last would keep one core busy while the other
    waits."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "broker_url" in names or "rabbit" in names:
            item.add_marker(pytest.mark.broker)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(params=["memory", "memory-serialized", pytest.param("rabbit", marks=pytest.mark.broker)])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[BusHarness]:
    url = request.getfixturevalue("broker_url") if request.param == "rabbit" else None
    h = BusHarness(request.param, url)
    try:
        yield h
    finally:
        await h.close()


@pytest.fixture
async def rabbit(broker_url: str) -> AsyncIterator[BusHarness]:
    h = BusHarness("rabbit", broker_url)
    try:
        yield h
    finally:
        await h.close()


@pytest.fixture(scope="session")
def example_plugins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example plug-in package (examples/gavel-example-plugins) pip-installed once per session
    into a temporary directory, never into the project's venv (tests/support/example_plugins.py)."""
    return example_site(tmp_path_factory)


@pytest.fixture
def on_path(example_plugins: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example plug-ins importable (and their entry points found) in this process, for a test."""
    monkeypatch.syspath_prepend(str(example_plugins))
    return example_plugins
