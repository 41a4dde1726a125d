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

from services.cli.common import CommandFailed, open_bus, positive_number, print_json, print_lines, print_table
from services.cli.times import ClockView, duration, readable

if TYPE_CHECKING:
    from common.bus import Bus
    from common.config import Settings


def register(sub: argparse._SubParsersAction) -> None:
    for name, query, help_text in (
        ("jobs", "jobs", "list the jobs: state, reason code, accelerator type, steps done, GPU-hours received, time waited, ETA"),
        ("job", "job", "show one job: where it ran round by round, its share of the allocation, its ETA (--why: why it waits)"),
        ("workers", "workers", "list the workers: accelerator type, GPUs, when last heard from; lost and refused ones, and why"),
        ("cluster", "cluster", "show the GPUs per accelerator type and their use, the policy and how its last solve went"),
    ):
        p = sub.add_parser(name, help=help_text)
        if name == "job":
            p.add_argument("job_id")
            p.add_argument(
                "--why", action="store_true",
                help="say why the job waits or runs where it does (a reason code and its detail) and when it should finish",
            )
        p.add_argument("--amqp", metavar="URL", help="broker URL (default: GAVEL_AMQP_URL)")
        p.add_argument("--timeout-s", type=positive_number, default=5.0, help="wait this long for the mechanism (default 5)")
        p.add_argument("--json", action="store_true", help="print the mechanism's answer as JSON")
        p.set_defaults(run=run_status, query=query)


async def ask(settings: Settings, query: str, *, job_id: str = "", amqp: str | None = None, timeout_s: float = 5.0) -> object:
    bus = await open_bus(settings, amqp)
    try:
        return await ask_on(bus, query, job_id=job_id, timeout_s=timeout_s)
    finally:
        await bus.close()


async def ask_with_clock(settings: Settings, query: str, *, amqp: str | None, timeout_s: float) -> tuple[object, object]:
    """A list answer (jobs, workers: no room for the clock in it) and the mechanism's clock, asked
    together over one connection and one reply queue."""
    from services.cli.watching import Asker

    bus = await open_bus(settings, amqp)
    try:
        async with Asker(bus) as asker:
            answers = await asker.ask({"answer": (query, "", 0), "clock": ("clock", "", 0)}, timeout_s)
    finally:
        await bus.close()
    return answers["answer"], answers["clock"]


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
    # the mechanism's clock, to show its times as dates and wall durations: in a dict answer, else
    # asked for beside it (a list has no room for it); None from an older mechanism: its seconds
    # as they come
    clock_block: object = None
    if args.query in ("jobs", "workers") and not args.json:
        answer, clock_block = await ask_with_clock(settings, args.query, amqp=args.amqp, timeout_s=args.timeout_s)
    else:
        answer = await ask(settings, args.query, job_id=getattr(args, "job_id", ""), amqp=args.amqp, timeout_s=args.timeout_s)
    if isinstance(answer, dict) and "error" in answer:
        raise CommandFailed(str(answer["error"]))
    if args.json:
        print_json(answer)
        return 0
    clock = ClockView.of(answer.get("clock") if isinstance(answer, dict) else clock_block)
    if args.query == "jobs":
        assert isinstance(answer, list)
        print_jobs(answer, clock)
    elif args.query == "workers":
        assert isinstance(answer, list)
        print_workers(answer, clock)
    elif args.query == "job" and getattr(args, "why", False):
        assert isinstance(answer, dict)
        print_why(answer, clock)
    elif args.query == "job":
        assert isinstance(answer, dict)
        # the last crash's stderr tail is many lines: after the report, as it came
        last_error = str(answer.pop("last_error", "") or "")
        print_report(readable(answer, clock) if clock is not None else answer)  # type: ignore[arg-type]
        if last_error:
            print_lines(["", "last error:", *("  " + line for line in last_error.rstrip().splitlines())])
    else:  # cluster: whatever fields the mechanism sends, those added later included
        assert isinstance(answer, dict)
        print_report(readable(answer, clock) if clock is not None else answer)  # type: ignore[arg-type]
    return 0


def print_jobs(rows: list[dict[str, object]], clock: ClockView | None) -> None:
    """One line a job: its reason code (core/why.py) and, for a job the allocation gives a rate,
    when it should finish (a local date, and how long from now); why it waits, was refused,
    failed or was cancelled in the last column, in full."""
    why = any(row.get("reason") for row in rows)
    owned = any(row.get("owner") for row in rows)  # who submitted it (core/ownership.py)
    coded = any(row.get("reason_code") for row in rows)  # (an older mechanism sends none)

    def waited(row: dict[str, object]) -> str:  # from its arrival to its first start, not the time queued since
        if "waiting_s" not in row:
            return ""
        seconds = float(row["waiting_s"])  # type: ignore[arg-type]
        return duration(clock.wall_duration(seconds) if clock is not None else seconds)

    def eta(row: dict[str, object]) -> str:
        t = row.get("eta_s")
        if not isinstance(t, (int, float)):
            return "-" if "eta_s" in row else ""
        return f"{clock.date(t)} ({clock.until(t)})" if clock is not None else f"{t:.0f}"

    print_table(
        [
            "id", "type", *(["owner"] if owned else []), "state", *(["reason"] if coded else []), "on", "steps",
            "service GPU-h", "waited", *(["eta"] if coded else []), *(["why"] if why else []),
        ],
        [
            [
                row["id"], row.get("type", ""), *([row.get("owner") or "-"] if owned else []), row["state"],
                *([row.get("reason_code") or ""] if coded else []),
                row.get("accelerator_type") or "",
                f"{row.get('steps_done', '')}/{row.get('steps_total', '')}" if "steps_total" in row else "",
                f"{row.get('attained_service_gpu_s', 0) / 3600:.2f}" if "attained_service_gpu_s" in row else "",
                waited(row), *([eta(row)] if coded else []),
                *([row.get("reason") or ""] if why else []),
            ]
            for row in rows
        ],
    )


def print_why(job: Mapping[str, object], clock: ClockView | None) -> None:
    """`gavel job ID --why`: the code and its sentence, when it should finish and on what basis,
    then what the reason rests on (its share and what it is owed per type, the jobs holding the
    GPUs it wants)."""
    detail = job.get("why") if isinstance(job.get("why"), dict) else {}
    assert isinstance(detail, dict)
    code = detail.get("code") or job.get("reason_code") or job.get("state")
    lines = [f"{job['id']}: {code}", f"  {detail.get('reason') or job.get('reason') or job.get('state')}"]

    def when(t: object) -> str:
        if not isinstance(t, (int, float)):
            return "unbounded" if t is None else str(t)
        return f"{clock.date(t)} ({clock.until(t)})" if clock is not None else f"{t:.0f} s"

    if "eta_s" in job:
        lines.append(f"eta: {when(job['eta_s'])}" if job.get("eta_s") is not None else "eta: -")
        low, high = (list(job.get("eta_range_s") or []) + [None, None])[:2]  # type: ignore[operator]
        if low is not None or high is not None:
            lines.append(f"  range: {when(low)} to {when(high)}")
        if job.get("eta_basis"):
            lines.append(f"  basis: {job['eta_basis']}")
    print_lines(lines)
    shares = detail.get("shares") or {}
    owed = detail.get("owed_s") or {}
    priority = detail.get("priority") or {}
    types = list(dict.fromkeys([*shares, *priority]))  # type: ignore[list-item]
    if types:
        def owed_text(w: str) -> str:
            seconds = owed.get(w)  # type: ignore[union-attr]
            if seconds is None:
                return "-"
            wall = clock.wall_duration(float(seconds)) if clock is not None else float(seconds)
            return duration(wall)

        print_lines(["", "per type:"])
        print_table(
            ["type", "share", "owed", "priority", "free GPUs"],
            [
                [w, f"{float(shares.get(w, 0.0)):.3f}", owed_text(w), f"{float(priority.get(w, 0.0)):.4g}",  # type: ignore[union-attr]
                 (detail.get("free_gpus") or {}).get(w, "-")]  # type: ignore[union-attr]
                for w in types
            ],
        )
    holders = detail.get("holders") or []
    if holders:
        print_lines(["", f"holding the GPUs it wants (gang of {detail.get('gang_gpus', 1)}):"])
        print_table(
            ["jobs", "type", "GPUs", "priority"],
            [["+".join(h["ids"]), h["accelerator_type"], h["gpus"], f"{float(h['priority']):.4g}"] for h in holders],  # type: ignore[index]
        )
        if detail.get("holders_not_shown"):
            print_lines([f"  and {detail['holders_not_shown']} more"])
    if detail.get("failed_attempts_in_a_row"):
        print_lines(["", f"failed attempts in a row: {detail['failed_attempts_in_a_row']}"])


def print_workers(rows: list[dict[str, object]], clock: ClockView | None = None) -> None:
    """Registered workers (up: when they were last heard, if they send heartbeats), then the lost
    ones (when, and why), then the refused ones (why); older mechanisms send neither state nor
    times. The reason comes last: it is long, and a table reads best with it at the end. How
    long ago is wall time ("heard 1.8 s ago"), whatever the mechanism's clock."""
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
                _ago(r.get("silent_s"), clock),
                *([_ago(r.get("lost_s_ago"), clock)] if lost else []),
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


def _ago(seconds: object, clock: ClockView | None) -> str:
    if seconds is None:
        return "-"
    wall = clock.wall_duration(float(seconds)) if clock is not None else float(seconds)  # type: ignore[arg-type]
    return f"{duration(wall)} ago"


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
