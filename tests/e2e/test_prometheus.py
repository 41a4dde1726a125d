"""The provisioned Grafana dashboard (deploy/grafana/dashboards/gavel.json) against a real Prometheus
scraping the services (issue 25): the policy, the mechanism, the estimator and a simulated fleet as
processes over RabbitMQ, each serving its metrics on a port of its own (`--metrics-port`), a
`prometheus` server (Debian's package: `make prometheus`) scraping them every second, jobs run until
they complete; then every query of every panel, evaluated by Prometheus, returns series with values,
and every metric name a query reads is one the services export (a typo fails here).

The queries are evaluated over the run (/api/v1/query_range, what Grafana sends for a time-series
panel), not at one instant: a gauge such as the pending jobs per reason has no series once every
job is done, and the panel shows the run, not its last second."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import Cluster, run_jobs
from tests.support.prometheus import dashboard_queries, free_port, metric_names, running_prometheus
from tests.support.waiting import eventually

pytestmark = pytest.mark.broker

# Grafana's variables in the dashboard's queries, as Grafana would fill them in for a Prometheus
# scraped every second (its $__rate_interval is at least four scrape intervals).
GRAFANA_VARIABLES = {"$__rate_interval": "10s", "$__interval": "1s"}
SERVICES = ("policy", "mechanism", "estimator", "fleet")
# More jobs than GPUs (3), each several rounds long: some wait (the pending panel has reasons),
# every type is busy, the policy solves again as jobs end.
JOBS = [
    ("ResNet-18 (batch size 64)", 15000), ("Transformer (batch size 16)", 6000),
    ("Recommendation (batch size 2048)", 7500), ("ResNet-18 (batch size 64)", 10000),
    ("Transformer (batch size 16)", 4000), ("Recommendation (batch size 2048)", 5000),
]  # fmt: skip


def concrete(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    left = re.findall(r"\$\w+", expr)
    assert not left, f"a variable this test does not fill in: {left} in {expr}"
    return expr


def finite_values(result: list[dict[str, Any]]) -> int:
    return sum(1 for series in result for _, value in series["values"] if math.isfinite(float(value)))


def start_services(cluster: Cluster, tmp_path: Path, ports: dict[str, int]) -> None:
    def metrics(name: str) -> list[str]:
        return ["--metrics-port", str(ports[name]), "--metrics-host", "127.0.0.1"]

    scale = ["--time-scale", "200"]  # a 360 s round in 1.8 s: each job spans several scrapes
    cluster.start("policy", "serve", "policy", "--solving", "inline", *metrics("policy"))
    cluster.start("estimator", "serve", "estimator", "--mode", "oracle", *metrics("estimator"))
    cluster.start("fleet", "serve", "fleet", "--cluster", "v100=1,p100=1,k80=1", *scale, *metrics("fleet"))
    cluster.start(
        "mechanism", "serve", "mechanism", "--journal", str(tmp_path / "journal.sqlite"), *scale,
        *metrics("mechanism"),
    )  # fmt: skip


@pytest.mark.slow  # ~18 s on an idle 2-core machine: four service processes and a Prometheus server, six jobs over ~6 rounds
async def test_every_panel_query_returns_series_from_the_services(cluster: Cluster, tmp_path: Path) -> None:
    ports = {name: free_port() for name in SERVICES}
    workdir = tmp_path / "prometheus"
    workdir.mkdir()
    targets = {f"gavel-{name}": [f"127.0.0.1:{port}"] for name, port in ports.items()}
    with running_prometheus(workdir, targets, interval_s=1.0) as prometheus:
        await eventually(prometheus.ready, timeout_s=60, poll_s=0.2)
        started = time.time()
        start_services(cluster, tmp_path, ports)

        def all_up() -> bool:
            active = prometheus.api("targets")["activeTargets"]
            return len(active) == len(SERVICES) and all(t["health"] == "up" for t in active)

        try:
            await eventually(all_up, timeout_s=60, poll_s=0.5)
        except TimeoutError:
            raise AssertionError(f"targets: {prometheus.api('targets')}\n{prometheus.tail()}\n{cluster.logs()}") from None

        await run_jobs(cluster, tmp_path / "jobs.trace", JOBS, "p")
        done = time.time()

        def scraped_since_done() -> bool:  # the last state (every job completed) is in Prometheus
            active = prometheus.api("targets")["activeTargets"]
            return all(t["health"] == "up" and _timestamp(t["lastScrape"]) > done + 1 for t in active)

        await eventually(scraped_since_done, timeout_s=30, poll_s=0.5)
        end = time.time()

        exported = set(prometheus.api("label/__name__/values"))
        empty, unknown = [], []
        for title, ref, expr in dashboard_queries():
            unknown += [f"{title} ({ref}): {name}" for name in sorted(metric_names(expr) - exported)]
            result = prometheus.api("query_range", query=concrete(expr), start=f"{started:.3f}", end=f"{end:.3f}", step="1")
            if not finite_values(result["result"]):
                empty.append(f"{title} ({ref}): {expr}")
        gavel = sorted(n for n in exported if n.startswith("gavel_"))
        report = "\n".join(
            ["metrics no service exports:", *unknown, "queries without a value over the run:", *empty, f"exported: {gavel}"]
        )
        assert not unknown and not empty, report


def _timestamp(rfc3339: str) -> float:
    """Prometheus's lastScrape (RFC 3339, nanoseconds, 'Z' or an offset) as Unix seconds."""
    from datetime import datetime

    text = re.sub(r"(\.\d{6})\d*", r"\1", rfc3339).replace("Z", "+00:00")
    return datetime.fromisoformat(text).timestamp()
