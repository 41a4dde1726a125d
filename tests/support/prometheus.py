"""The monitoring files as tests read them (deploy/grafana, deploy/prometheus, docs/metrics.md), the
metric names a PromQL expression reads, and a real Prometheus server for a test (Debian's
`prometheus` package, which scripts/ensure-prometheus installs under `make test`)."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.broker import broker_required

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "gavel.json"
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDERS = GRAFANA / "provisioning" / "dashboards" / "gavel.yml"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
CATALOG = ROOT / "docs" / "metrics.md"

# What Prometheus itself adds to every target's series: not the services' to export.
SYNTHETIC = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_series_added"})
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


@cache
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


@cache
def datasources() -> dict[str, Any]:
    return yaml.safe_load(DATASOURCES.read_text())


def provisioned_uid() -> str:
    (source,) = datasources()["datasources"]
    return source["uid"]


def dashboard_queries(board: dict[str, Any] | None = None) -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every query of every panel (rows' panels included)."""
    board = dashboard() if board is None else board
    found = []
    for panel in board["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            found += [(inner["title"], t["refId"], t["expr"]) for t in inner.get("targets", [])]
    return found


@cache
def catalog() -> dict[str, str]:
    """docs/metrics.md's metrics: name -> type (its table rows: | `name` | type | labels | meaning |)."""
    rows = re.findall(r"^\|\s*`([a-z_:][a-z0-9_:]*)`\s*\|\s*([a-z]+)", CATALOG.read_text(), re.M)
    return dict(rows)


def catalog_series_names() -> set[str]:
    """Every series name the catalog promises: a histogram is its _bucket, _sum and _count."""
    names = set()
    for name, kind in catalog().items():
        names |= {name + suffix for suffix in HISTOGRAM_SUFFIXES} if kind == "histogram" else {name}
    return names


# -- PromQL ---------------------------------------------------------------------------------------

_NOT_METRICS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
    "inf", "nan", "atan2",
})  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: its identifiers once strings, label matchers,
    range and grouping clauses are taken out, less function names (followed by "(") and keywords."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w.:$])[A-Za-z_:][A-Za-z0-9_:]*", s):
        if m.group() in _NOT_METRICS or s[m.end() :].lstrip().startswith("("):
            continue
        names.add(m.group())
    return names


# -- a real Prometheus ----------------------------------------------------------------------------


def prometheus_binary(name: str = "prometheus") -> str:
    """The `prometheus` binary (or `promtool`, from the same package). Under `make test`
    (GAVEL_REQUIRE_BROKER=1) and CI its absence is a failure (scripts/ensure-prometheus installs it
    first); elsewhere the test is skipped, saying how."""
    found = shutil.which(name)
    if found:
        return found
    how = "`make prometheus` (scripts/ensure-prometheus) installs Debian's prometheus package"
    if broker_required():
        pytest.fail(f"no `{name}` binary on PATH: {how}")
    pytest.skip(f"no `{name}` binary on PATH ({how}; under make test this is a failure)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A Prometheus server of one test: its own config, storage and port."""

    def __init__(self, url: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.url = url
        self.process = process
        self.log = log

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; its `data` (an error answer raises, with Prometheus's reason)."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        if body.get("status") != "success":
            raise AssertionError(f"/api/v1/{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def ready(self) -> bool:
        """It answers /-/ready (an AssertionError, with its log, if it exited instead)."""
        assert self.process.poll() is None, f"prometheus exited ({self.process.returncode}):\n{self.tail()}"
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def tail(self) -> str:
        return self.log.read_text()[-3000:] if self.log.exists() else ""


@contextlib.contextmanager
def running_prometheus(workdir: Path, targets: dict[str, list[str]], interval_s: float = 1.0) -> Iterator[Prometheus]:
    """A `prometheus` process scraping ``targets`` (job name -> host:port list) every
    ``interval_s``, its storage under ``workdir``, on a free loopback port; stopped after."""
    binary = prometheus_binary()
    config = {
        "global": {"scrape_interval": f"{interval_s:g}s", "scrape_timeout": f"{interval_s:g}s",
                   "evaluation_interval": f"{interval_s:g}s"},
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": hosts}]} for job, hosts in targets.items()],
    }  # fmt: skip
    config_file = workdir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    port = free_port()
    log = workdir / "prometheus.log"
    argv = [
        binary, f"--config.file={config_file}", f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    try:
        yield Prometheus(f"http://127.0.0.1:{port}", process, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
