"""``gavel jobs``, ``gavel job ID``, ``gavel workers``, ``gavel cluster``: ask the mechanism.

The question goes out on ``status.requested``; the answer comes back on this command's own key,
to a private queue that disappears with it. No mechanism: a clear line and exit 1, after the
timeout at most. Answers print for people (tables, aligned ``key: value`` lines) unless ``--json``
asks for the mechanism's JSON as it came.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from services.cli.common import CommandFailed, positive_number, print_json, print_lines, print_table

if TYPE_CHECKING:
    from common.bus import Bus
    from common.config import Settings


def register(sub: argparse._SubParsersAction) -> None:
    for name, query, help_text in (
        ("jobs", "jobs", "list the jobs: state, accelerator type, steps done, GPU-hours received, hours waited"),
        ("job", "job", "show one job's history: where it ran round by round, lease extensions, its share of the allocation"),
        ("workers", "workers", "list the workers: accelerator type, GPUs, when last heard from; lost and refused ones, and why"),
        ("cluster", "cluster", "show the GPUs per accelerator type and their use, the policy and how its last solve went"),
    ):
        p = sub.add_parser(name, help=help_text)
        if name == "job":
            p.add_argument("job_id")
        p.add_argument("--amqp", metavar="URL", help="broker URL (default: GAVEL_AMQP_URL)")
        p.add_argument("--timeout-s", type=positive_number, default=5.0, help="wait this long for the mechanism (default 5)")
        p.add_argument("--json", action="store_true", help="print the mechanism's answer as JSON")
        p.set_defaults(run=run_status, query=query)


async def ask(settings: Settings, query: str, *, job_id: str = "", amqp: str | None = None, timeout_s: float = 5.0) -> object:
    from common.config import BusSettings  # the bus stack only when asking (see services/cli/__init__.py)
    from common.transport import make_bus

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
    from common.errors import UnroutableError
    from common.messages import StatusRequested
    from services.cli.replies import Replies

    async with Replies(bus) as replies:
        request_id = replies.key
        try:
            await bus.publish(StatusRequested(request_id, query, replies.key, job_id))
        except UnroutableError:
            raise CommandFailed("the mechanism is not running (nothing receives status requests)") from None
        try:
            return await replies.wait(request_id, timeout_s)
        except TimeoutError:
            parts = replies.parts_received(request_id)
            got = f" ({parts} parts of the answer came)" if parts else ""
            raise CommandFailed(f"no answer from the mechanism within {timeout_s:g} s{got}: is it running?") from None


async def run_status(args: argparse.Namespace, settings: Settings) -> int:
    answer = await ask(settings, args.query, job_id=getattr(args, "job_id", ""), amqp=args.amqp, timeout_s=args.timeout_s)
    if isinstance(answer, dict) and "error" in answer:
        raise CommandFailed(str(answer["error"]))
    if args.json:
        print_json(answer)
    elif args.query == "jobs":
        assert isinstance(answer, list)
        # why a job waits, was refused, failed or was cancelled: in the last column, in full
        why = any(row.get("reason") for row in answer)
        owned = any(row.get("owner") for row in answer)  # who submitted it (core/ownership.py)
        # "to start h": from its arrival to its first start (waiting_s), not the time queued since
        print_table(
            [
                "id", "type", *(["owner"] if owned else []), "state", "on", "steps", "service GPU-h", "to start h",
                *(["why"] if why else []),
            ],
            [
                [
                    row["id"], row.get("type", ""), *([row.get("owner") or "-"] if owned else []), row["state"],
                    row.get("accelerator_type") or "",
                    f"{row.get('steps_done', '')}/{row.get('steps_total', '')}" if "steps_total" in row else "",
                    f"{row.get('attained_service_gpu_s', 0) / 3600:.2f}" if "attained_service_gpu_s" in row else "",
                    f"{row.get('waiting_s', 0) / 3600:.2f}" if "waiting_s" in row else "",
                    *([row.get("reason") or ""] if why else []),
                ]
                for row in answer
            ],
        )
    elif args.query == "workers":
        assert isinstance(answer, list)
        print_workers(answer)
    elif args.query == "job":
        assert isinstance(answer, dict)
        # the last crash's stderr tail is many lines: after the report, as it came
        last_error = str(answer.pop("last_error", "") or "")
        print_report(answer)
        if last_error:
            print_lines(["", "last error:", *("  " + line for line in last_error.rstrip().splitlines())])
    else:  # cluster: whatever fields the mechanism sends, those added later included
        assert isinstance(answer, dict)
        print_report(answer)
    return 0


def print_workers(rows: list[dict[str, object]]) -> None:
    """Registered workers (up: when they were last heard, if they send heartbeats), then the lost
    ones (when, and why), then the refused ones (why); older mechanisms send neither state nor
    times. The reason comes last: it is long, and a table reads best with it at the end."""
    lost = any(r.get("state") == "lost" for r in rows)
    why = lost or any(r.get("state") == "refused" for r in rows)
    slow = any(r.get("straggler") for r in rows)
    print_table(
        [
            "worker", "type", "GPUs", "state", "heard", *(["lost"] if lost else []), *(["straggler"] if slow else []),
            *(["why"] if why else []),
        ],
        [
            [
                r["worker_id"], r.get("accelerator_type") or "-", r.get("gpus") or "-", r.get("state", "up"),
                _ago(r.get("silent_s")),
                *([_ago(r.get("lost_s_ago"))] if lost else []),
                *([_straggler(r.get("straggler"))] if slow else []),
                *([r.get("reason") or ""] if why else []),
            ]
            for r in rows
        ],
    )


def _straggler(flag: object) -> str:
    """The estimator's flag: how fast the worker measures against what its jobs should do."""
    if not isinstance(flag, dict):
        return ""
    return f"{float(flag['speed_vs_predicted']):.2f}x predicted over {flag['jobs']} jobs"


def _ago(seconds: object) -> str:
    return "-" if seconds is None else f"{float(seconds):.0f} s ago"  # type: ignore[arg-type]


# -- a report for people -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Table:
    """A field whose value is a list of records (a job's placements), shown as a table."""

    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


def describe(report: Mapping[str, object]) -> tuple[list[str], list[Table]]:
    """Aligned ``key: value`` lines (nested mappings flattened to ``outer.inner``), then a table
    per field that holds a list of records. Generic on purpose: a field the mechanism adds later
    shows up without a change here."""
    fields: list[tuple[str, str]] = []
    tables: list[Table] = []
    for key, value in report.items():
        if _is_records(value):
            assert isinstance(value, list)
            headers = tuple(dict.fromkeys(k for record in value for k in record))
            rows = tuple(tuple(_text(record[h]) if h in record else "" for h in headers) for record in value)
            tables.append(Table(key, headers, rows))
        else:
            fields += _flatten(key, value)
    width = max((len(key) for key, _ in fields), default=0) + 1
    return [f"{key + ':':<{width}}  {text}" for key, text in fields], tables


def print_report(report: Mapping[str, object]) -> None:
    lines, tables = describe(report)
    print_lines(lines)
    for table in tables:
        print_lines(["", f"{table.title}:"])
        print_table(table.headers, table.rows)


def _is_records(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _flatten(key: str, value: object) -> list[tuple[str, str]]:
    if isinstance(value, dict) and value:
        return [pair for k, v in value.items() for pair in _flatten(f"{key}.{k}", v)]
    return [(key, _text(value))]


def _text(value: object) -> str:
    if value is None or value == {} or value == []:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e6 else f"{value:.0f}"
    if isinstance(value, list) and not any(isinstance(v, (dict, list)) for v in value):
        return ", ".join(_text(v) for v in value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    return str(value)
