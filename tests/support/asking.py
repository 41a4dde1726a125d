"""The `gavel` command and the mechanism's status answers, from the test's own process.

Status: what `gavel jobs|job|workers|cluster --json` prints, by the command's own request
(services.cli.status_cmd.ask_on), over one connection kept open for the test: for the loops that
wait on a cluster of processes. gavel_here: a command's exit code and output, by its own `main()`.
run_here: a command's parser and command alone, on the cluster's settings (its exit code; safe to
run several at once).
A `gavel` subprocess costs an interpreter start and its imports, ~0.3-0.5 s of CPU and ~1 s of
wall on 2 busy cores, each time (the e2e tests spent most of their wall time there); where the
process itself is what a test is about (the README's lines as a reader runs them), it runs
`gavel` as a user does (Cluster.gavel)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import subprocess
from types import TracebackType

from common.config import BusSettings, Settings
from common.transport.rabbit import RabbitBus
from services.cli.common import CommandFailed
from services.cli.status_cmd import ask_on
from tests.support.processes import Cluster


class Status:
    """`async with Status(cluster) as status:` then ``await status.jobs()`` etc."""

    def __init__(self, cluster: Cluster) -> None:
        settings = BusSettings(kind="amqp", amqp_url=cluster.url, exchange=cluster.exchange)
        self.bus = RabbitBus(settings, source="test-status")

    async def __aenter__(self) -> Status:
        await self.bus.start()
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.bus.close()

    async def ask(self, query: str, job_id: str = "", *, timeout_s: float = 10.0) -> object:
        """The mechanism's answer (it must answer, and without an error, as `gavel ... --json`
        exits 0)."""
        answer = await ask_on(self.bus, query, job_id=job_id, timeout_s=timeout_s)
        assert not (isinstance(answer, dict) and "error" in answer), answer
        return answer

    async def jobs(self) -> dict[str, dict[str, object]]:
        """`gavel jobs --json`, by job id."""
        return {str(row["id"]): row for row in await self.ask("jobs")}  # type: ignore[union-attr, index]

    async def state(self, job_id: str) -> str | None:
        row = (await self.jobs()).get(job_id)
        return None if row is None else str(row["state"])

    async def workers_up(self, count: int) -> bool:
        """Whether the mechanism answers and lists ``count`` workers (`gavel workers --json
        --timeout-s 2` exits 0 with them): False while it is not up yet."""
        try:
            workers = await ask_on(self.bus, "workers", timeout_s=2.0)
        except CommandFailed:  # no mechanism consuming yet, or no answer within 2 s
            return False
        return isinstance(workers, list) and len(workers) == count


async def gavel_here(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`gavel ARGS` against ``cluster``, as Cluster.gavel runs it but by `services.cli.main` in a
    thread of this process (it runs its own event loop): the same parse, command, error handling,
    exit code and output, on the same GAVEL_* settings and state directory (set in this process
    for the call). Not for `gavel serve`. Its log events go where the first in-process command
    pointed them (logging is configured once a process); the tests filter them out of stderr
    either way."""
    from services.cli import main  # noqa: PLC0415 - the command's imports only where it runs

    settings = {k: v for k, v in cluster.env.items() if k.startswith("GAVEL_") or k == "XDG_STATE_HOME"}
    before = {k: os.environ.get(k) for k in settings}

    def run() -> subprocess.CompletedProcess[str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as e:  # argparse's own exit
                code = e.code if isinstance(e.code, int) else 2
        return subprocess.CompletedProcess(["gavel", *args], code, out.getvalue(), err.getvalue())

    os.environ.update(settings)
    try:
        return await asyncio.to_thread(run)
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


async def run_here(cluster: Cluster, *argv: str) -> int:
    """`gavel ARGV`'s parser and command in this process's event loop, on the cluster's settings
    (no environment changed, so several may run at once): its exit code. Output goes to this
    process's own streams."""
    from services.cli import build_parser  # noqa: PLC0415 - the command's imports only where it runs

    args = build_parser(list(argv)).parse_args(list(argv))
    return await args.run(args, Settings.from_env(cluster.env))
