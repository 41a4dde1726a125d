"""A RabbitMQ node of a test's own on this machine, for a test that stops or restarts its broker
(the chaos test). The shared broker on 5672 keeps serving every other test meanwhile, so such a
test runs beside the rest under `make test` instead of alone after it.

The node is the machine's own RabbitMQ installation started a second time under another node
name, with its own AMQP and distribution ports, data and log directories, an empty plugin list
and a one-line config file (the machine's rabbitmq.conf would make it listen on 5672 too). Its
directories live under /tmp, readable by the ``rabbitmq`` user that Debian's ``rabbitmq-server``
runs the node as. Starting it takes ~5-12 s; stopping it ~2 s.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from common.transport.probe import amqp_problem


def node_problem() -> str | None:
    """Why this machine cannot start a node of its own (None: it can)."""
    for tool in ("rabbitmq-server", "rabbitmqctl"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH (install Debian's rabbitmq-server: scripts/ensure-broker does, under CI)"
    if os.geteuid() != 0 and pwd.getpwuid(os.geteuid()).pw_name != "rabbitmq":
        return "only root or the rabbitmq user may start a RabbitMQ node (Debian's rabbitmq-server says so)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RabbitNode:
    """A started node: ``url`` to connect, ``restart`` for the fault, ``stop`` at the end."""

    def __init__(self, workdir: Path, name: str, port: int) -> None:
        self.workdir, self.name, self.port = workdir, name, port
        self.url = f"amqp://guest:guest@127.0.0.1:{port}/"

    @classmethod
    def start(cls, timeout_s: float = 90.0) -> RabbitNode:
        problem = node_problem()
        if problem:
            raise RuntimeError(f"cannot start a RabbitMQ node of the test's own: {problem}")
        workdir = Path(tempfile.mkdtemp(prefix="gavel-rabbit-node-"))
        name, port, dist_port = f"gavel-{uuid.uuid4().hex[:8]}@localhost", _free_port(), _free_port()
        (workdir / "rabbitmq.conf").write_text(f"listeners.tcp.local = 127.0.0.1:{port}\n")
        (workdir / "enabled_plugins").write_text("[].\n")
        if os.geteuid() == 0:  # the node runs as rabbitmq: its directory must be its own
            entry = pwd.getpwnam("rabbitmq")
            workdir.chmod(0o755)
            for path in (workdir, *workdir.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        node = cls(workdir, name, port)
        env = {
            **os.environ,
            "RABBITMQ_NODENAME": name,
            "RABBITMQ_NODE_PORT": str(port),
            "RABBITMQ_DIST_PORT": str(dist_port),
            "RABBITMQ_CONFIG_FILE": str(workdir / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(workdir / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(workdir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(workdir / "log"),
            "RABBITMQ_PID_FILE": str(workdir / "pid"),
        }
        subprocess.run(["rabbitmq-server", "-detached"], env=env, check=True, capture_output=True, timeout=60)
        try:
            node.wait_answering(timeout_s)
        except BaseException:
            node.stop()
            raise
        return node

    def rabbitmqctl(self, *args: str, timeout_s: float = 120.0) -> None:
        done = subprocess.run(["rabbitmqctl", "-n", self.name, *args], capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise RuntimeError(
                f"rabbitmqctl -n {self.name} {' '.join(args)} failed ({done.returncode}): "
                f"{done.stderr.strip() or done.stdout.strip()}"
            )

    def wait_answering(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while (problem := amqp_problem(self.url)) is not None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"RabbitMQ node {self.name} did not answer within {timeout_s:g} s: {problem}; "
                                   f"its log: {self.workdir / 'log'}")
            time.sleep(0.2)  # polling a broker that is starting

    def restart(self, down_s: float, timeout_s: float = 120.0) -> float:
        """``stop_app``, ``down_s`` of a broker that is down (the fault), ``start_app`` whatever
        happened, then wait until it answers AMQP again. Returns the wall seconds it did not answer."""
        began = time.monotonic()
        try:
            self.rabbitmqctl("stop_app")
            time.sleep(down_s)  # the fault itself: the broker stays down this long
        finally:
            self.rabbitmqctl("start_app")
            self.wait_answering(timeout_s)
        return time.monotonic() - began

    def stop(self) -> None:
        """Stop the node (``shutdown`` waits until its process has ended) and remove its files."""
        try:
            self.rabbitmqctl("shutdown", timeout_s=60)
        except (RuntimeError, subprocess.TimeoutExpired):
            pid = self.workdir / "pid"
            if pid.exists():  # a node that does not answer its CLI: end it as its parent would
                try:
                    os.kill(int(pid.read_text().strip()), 9)
                except (ProcessLookupError, ValueError):
                    pass
        shutil.rmtree(self.workdir, ignore_errors=True)
