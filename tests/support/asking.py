"""The mechanism's status answers, asked from the test's own process: what `gavel jobs|job|workers|
cluster --json` prints, by the command's own request (services.cli.status_cmd.ask_on), over one
connection kept open for the test.

For the loops that wait on a cluster of processes: a `gavel` subprocess costs an interpreter start
and its imports, ~0.3-0.5 s of CPU and ~1 s of wall on 2 busy cores, each time a test polls (the
e2e tests spent most of their wall time there). Where the command's own output is what a test
asserts, it runs `gavel` as a user does (Cluster.gavel)."""

from __future__ import annotations

from types import TracebackType

from common.config import BusSettings
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
