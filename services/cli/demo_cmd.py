"""``gavel demo``: the bundled scenario on the embedded default (no broker, no GPU).

Until the simulator lands (issue 4) it exercises the embedded bus end to end and says what the
full demo will show.
"""

from __future__ import annotations

import argparse
import time

from common.bus import Delivery
from common.config import Settings
from common.messages import JobSpec, JobSubmitted
from services.bus.memory import InMemoryBroker, InMemoryBus

PLAN = """\
gavel demo: replays a few hundred jobs on a small heterogeneous cluster (v100, p100, k80)
on the embedded default, under heterogeneity-agnostic LAS, aware LAS and aware LAS with space
sharing, and prints their average job completion times side by side with plots.
The policy service and simulator that run it are being built (issues 3 and 4); today this
command checks the embedded message bus that they will run on."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the bundled scenario on the embedded default")
    p.add_argument("--jobs", type=int, default=10_000, help="job submissions to push through the bus")
    p.set_defaults(run=run)


async def run(args: argparse.Namespace, settings: Settings) -> int:
    print(PLAN)
    broker = InMemoryBroker()
    submitter = InMemoryBus(broker, source="submitter")
    mechanism = InMemoryBus(broker, source="mechanism")
    estimator = InMemoryBus(broker, source="estimator")
    counts = {"mechanism": 0, "estimator": 0}

    def counter(name: str):
        async def handle(d: Delivery) -> None:
            counts[name] += 1

        return handle

    for bus in (submitter, mechanism, estimator):
        await bus.start()
    await mechanism.subscribe("mechanism.submissions", ["job.submitted"], counter("mechanism"))
    await estimator.subscribe("estimator.submissions", ["job.submitted"], counter("estimator"))
    started = time.perf_counter()
    for i in range(args.jobs):
        await submitter.publish(JobSubmitted(JobSpec(str(i), "ResNet-50 (batch size 64)", 10_000 + i)))
    await broker.drain()
    elapsed_s = time.perf_counter() - started
    for bus in (submitter, mechanism, estimator):
        await bus.close()
    print(
        f"\nembedded bus: {args.jobs} submissions reached the mechanism ({counts['mechanism']}) and the "
        f"estimator ({counts['estimator']}) in {elapsed_s:.2f} s ({args.jobs / elapsed_s:,.0f} submissions/s)"
    )
    return 0 if counts["mechanism"] == counts["estimator"] == args.jobs else 1
