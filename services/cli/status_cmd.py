"""``gavel jobs``, ``gavel job ID``, ``gavel workers``, ``gavel cluster``: ask the mechanism.

The question goes out on ``status.requested``; the answer comes back on this command's own key,
to a private queue that disappears with it. No mechanism: a clear line and exit 1, after the
timeout at most.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import uuid

from common.bus import Bus, Delivery
from common.config import BusSettings, Settings
from common.errors import UnroutableError
from common.messages import StatusReported, StatusRequested
from services.bus import make_bus
from services.cli.common import CommandFailed, print_json, print_table


def register(sub: argparse._SubParsersAction) -> None:
    for name, query, help_text in (
        ("jobs", "jobs", "every job: state, accelerator type now, steps, attained service, waiting time"),
        ("job", "job", "one job's history: rounds, placements, lease extensions, allocation share"),
        ("workers", "workers", "the registered workers"),
        ("cluster", "cluster", "capacity and use per accelerator type, the policy, its last solve"),
    ):
        p = sub.add_parser(name, help=help_text)
        if name == "job":
            p.add_argument("job_id")
        p.add_argument("--amqp", metavar="URL", help="broker URL (default: GAVEL_AMQP_URL)")
        p.add_argument("--timeout-s", type=float, default=5.0, help="wait this long for the mechanism (default 5)")
        p.add_argument("--json", action="store_true")
        p.set_defaults(run=run_status, query=query)


async def ask(settings: Settings, query: str, *, job_id: str = "", amqp: str | None = None, timeout_s: float = 5.0) -> object:
    bus_settings = dataclasses.replace(settings.bus, kind="amqp")
    if amqp:
        bus_settings = dataclasses.replace(bus_settings, amqp_url=BusSettings.from_env({"GAVEL_AMQP_URL": amqp}).amqp_url)
    bus = make_bus(bus_settings, source="gavel-cli")
    await bus.start()
    try:
        return await ask_on(bus, query, job_id=job_id, timeout_s=timeout_s)
    finally:
        await bus.close()


async def ask_on(bus: Bus, query: str, *, job_id: str = "", timeout_s: float = 5.0) -> object:
    """Ask the mechanism over ``bus`` and wait for every part of its answer."""
    me = uuid.uuid4().hex[:12]
    answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    parts: dict[int, str] = {}

    async def on_reply(d: Delivery) -> None:
        reply = d.message
        if not isinstance(reply, StatusReported) or reply.request_id != me or answer.done():
            return
        parts[reply.part] = reply.body
        if len(parts) >= reply.parts:
            answer.set_result("".join(parts[k] for k in range(reply.parts)))

    subscription = await bus.subscribe(f"cli.{me}", [f"status.reply.{me}"], on_reply, durable=False)
    try:
        try:
            await bus.publish(StatusRequested(me, query, me, job_id))
        except UnroutableError:
            raise CommandFailed("the mechanism is not running (nothing receives status requests)") from None
        try:
            body = await asyncio.wait_for(answer, timeout_s)
        except asyncio.TimeoutError:
            got = f" ({len(parts)} parts of the answer came)" if parts else ""
            raise CommandFailed(f"no answer from the mechanism within {timeout_s:g} s{got}: is it running?") from None
    finally:
        await subscription.cancel()
    return json.loads(body)


async def run_status(args: argparse.Namespace, settings: Settings) -> int:
    answer = await ask(settings, args.query, job_id=getattr(args, "job_id", ""), amqp=args.amqp, timeout_s=args.timeout_s)
    if isinstance(answer, dict) and "error" in answer:
        raise CommandFailed(str(answer["error"]))
    if args.json:
        print_json(answer)
    elif args.query == "jobs":
        assert isinstance(answer, list)
        print_table(
            ["id", "type", "state", "on", "steps", "service GPU-h", "waited h"],
            [
                [
                    row["id"], row.get("type", ""), row["state"], row.get("accelerator_type") or "",
                    f"{row.get('steps_done', '')}/{row.get('steps_total', '')}" if "steps_total" in row else "",
                    f"{row.get('attained_service_gpu_s', 0) / 3600:.2f}" if "attained_service_gpu_s" in row else "",
                    f"{row.get('waiting_s', 0) / 3600:.2f}" if "waiting_s" in row else "",
                ]
                for row in answer
            ],
        )
    elif args.query == "workers":
        assert isinstance(answer, list)
        print_table(["worker", "type", "GPUs"], [[r["worker_id"], r["accelerator_type"], r["gpus"]] for r in answer])
    else:
        print_json(answer)
    return 0
