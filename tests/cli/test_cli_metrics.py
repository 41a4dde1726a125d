"""`--metrics-port` as a user gives it (docs/metrics.md): `gavel up` serves one endpoint for all its
services; a port in use or out of range is one line, exit 2."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

from tests.support.cli import gavel
from tests.support.processes import ROOT
from tests.support.scrape import scrape, total
from tests.support.waiting import eventually


def offline_env(tmp_path) -> dict[str, str]:  # noqa: ANN001
    return {"GAVEL_BROKER_WAIT_S": "0", "GAVEL_LOG_FORMAT": "json", "XDG_STATE_HOME": str(tmp_path / "state")}


def test_a_port_in_use_is_one_line_naming_it(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = gavel("serve", "policy", "--metrics-port", str(port), env=offline_env(tmp_path))
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.strip().splitlines() if not line.startswith("{")]
    assert lines == [f"gavel: --metrics-port: 127.0.0.1:{port} is in use"]


def test_a_port_out_of_range_is_refused_at_parse_time(tmp_path):
    out = gavel("serve", "mechanism", "--metrics-port", "70000", env=offline_env(tmp_path))
    assert out.returncode == 2 and "argument --metrics-port: expected a TCP port (0-65535), got 70000" in out.stderr


async def test_up_serves_one_endpoint_for_all_its_services(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAVEL_")} | offline_env(tmp_path)
    log = tmp_path / "up.log"
    with open(log, "wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "up", "--cluster", "1:1:1", "--metrics-port", "0"],
            cwd=ROOT, env=env, stderr=sink, stdout=subprocess.DEVNULL,
        )
    try:
        def serving() -> list[dict[str, object]]:
            events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
            return [e for e in events if e.get("event") in ("metrics_serving", "host_ready")]

        await eventually(lambda: len(serving()) == 2, timeout_s=60, poll_s=0.1)
        url = str(next(e for e in serving() if e["event"] == "metrics_serving")["url"])
        s = scrape(url)
        for service in ("policy", "mechanism", "estimator", "fleet"):
            assert total(s, "gavel_build_info", service=service) == 1.0, service
        # the fleet's three servers join the mechanism in the same process
        await eventually(lambda: total(scrape(url), "gavel_mechanism_workers", state="up") == 3, timeout_s=30, poll_s=0.1)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
