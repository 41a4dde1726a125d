"""``gavel submit``: publish job submissions (one, or a whole trace) to the mechanism.

A submission is checked before it is published (an unknown job type, steps <= 0, a gang larger
than any accelerator type can hold: one line, exit 2), then published persistent and confirmed to
the mechanism's durable queue, which this command declares itself: a submission the user was told
about is kept even when the mechanism is down at that moment. Job ids are printed; resubmitting
the same id is absorbed by the mechanism (idempotent).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time
import uuid
from importlib import resources

from common.config import BusSettings, Settings
from common.errors import TraceError
from common.throughputs import ThroughputTable, throughput_table_from_json
from common.messages import JobSpec, JobSubmitted, SubmissionsSealed
from services.bus import make_bus
from services.cli.common import CommandFailed, print_json
from services.cli.progress import ProgressBar
from sim.traces import TraceJob, read_trace

SUBMISSION_QUEUE = "mechanism.submissions"  # the mechanism's queue (mechanism_service/service.py)
SUBMISSION_BINDINGS = (JobSubmitted.ROUTING_KEY, SubmissionsSealed.ROUTING_KEY)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="submit a job, or every job of a trace, to the mechanism")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--job-type", help='a job template, e.g. "ResNet-50 (batch size 64)"')
    what.add_argument("--trace", metavar="FILE", help="a trace (.trace or .jsonl): submit every job, with its arrival time")
    p.add_argument("--steps", type=int, help="total steps (with --job-type)")
    p.add_argument("--scale-factor", type=int, default=1)
    p.add_argument("--priority-weight", type=float, default=1.0)
    p.add_argument("--slo-s", type=float)
    p.add_argument("--entity")
    p.add_argument("--job-id", help="default: a new unique id")
    p.add_argument("--command", default="", help="what a real worker runs")
    p.add_argument("--max-gpus", type=int, help="refuse gangs larger than this (default: the table's largest scale factor)")
    p.add_argument("--throughputs", metavar="TABLE.json", help="to check job types (default: the shipped Gavel table)")
    p.add_argument("--amqp", metavar="URL", help="broker URL (default: GAVEL_AMQP_URL)")
    p.add_argument("--json", action="store_true", help='print {"job_ids": [...], "publish_s": ...} as JSON')
    p.set_defaults(run=run_submit)


def _table(path: str | None) -> ThroughputTable:
    """The table to check job types against (no solver stack: this command must start fast)."""
    try:
        text = pathlib.Path(path).read_text() if path else (resources.files("common") / "data" / "simulation_throughputs.json").read_text()
        return throughput_table_from_json(json.loads(text))
    except (OSError, json.JSONDecodeError) as e:
        raise CommandFailed(f"--throughputs: cannot read {path}: {e}", exit_code=2) from None


def _trace(path: str) -> tuple[TraceJob, ...]:
    try:
        jobs = read_trace(path)
    except (TraceError, OSError) as e:
        raise CommandFailed(f"--trace: {e}", exit_code=2) from None
    if not jobs:
        raise CommandFailed(f"--trace {path}: the trace has no jobs", exit_code=2)
    return jobs


def _specs(args: argparse.Namespace) -> list[JobSpec]:
    table = _table(args.throughputs)
    if args.trace:
        jobs = _trace(args.trace)
        specs = [
            JobSpec(j.job_id, j.job_type, j.total_steps, j.scale_factor, j.priority_weight, j.slo_s, None, j.command, j.arrival_time_s)
            for j in jobs
        ]
    else:
        if args.steps is None:
            raise CommandFailed("--steps: required with --job-type", exit_code=2)
        specs = [
            JobSpec(
                args.job_id or uuid.uuid4().hex[:12], args.job_type, args.steps, args.scale_factor, args.priority_weight,
                args.slo_s, args.entity, args.command, time.time(),
            )
        ]
    largest = args.max_gpus or max(sf for _, sf in table.job_keys)
    for i, spec in enumerate(specs):
        where = f"job {spec.job_id}" if args.trace else "--job-type"
        if spec.job_type not in table.job_types:
            raise CommandFailed(f"{where}: unknown job type {spec.job_type!r} (gavel policy list shows the table's)", exit_code=2)
        if spec.total_steps <= 0:
            raise CommandFailed(f"{'job ' + spec.job_id if args.trace else '--steps'}: must be positive, got {spec.total_steps}", exit_code=2)
        if spec.scale_factor < 1 or spec.scale_factor > largest:
            raise CommandFailed(
                f"{'job ' + spec.job_id if args.trace else '--scale-factor'}: {spec.scale_factor} GPUs is more than any "
                f"accelerator type holds (largest: {largest})", exit_code=2,
            )
        if not table.has_job(spec.job_type, spec.scale_factor):
            raise CommandFailed(
                f"{where}: {spec.job_type!r} has no measured throughput on {spec.scale_factor} GPUs", exit_code=2
            )
        if spec.priority_weight <= 0:
            raise CommandFailed(f"--priority-weight: must be positive, got {spec.priority_weight}", exit_code=2)
    return specs


async def run_submit(args: argparse.Namespace, settings: Settings) -> int:
    specs = _specs(args)
    bus_settings = dataclasses.replace(settings.bus, kind="amqp")
    if args.amqp:
        bus_settings = dataclasses.replace(bus_settings, amqp_url=BusSettings.from_env({"GAVEL_AMQP_URL": args.amqp}).amqp_url)
    bus = make_bus(bus_settings, source="gavel-submit")
    await bus.start()
    try:
        await bus.declare(SUBMISSION_QUEUE, SUBMISSION_BINDINGS)
        progress = ProgressBar("submit", sys.stderr, simulated=False) if len(specs) > 1 else None
        publishing = time.monotonic()
        total = len(specs)
        every = max(1, total // 200)  # the bar redraws ~200 times, not once per confirm

        def confirmed(n: int) -> None:
            if progress is not None and (n % every == 0 or n == total):
                progress(0.0, n, total)

        # one stream with a window of confirms in flight (batches would drain the window each time)
        await bus.publish_many([JobSubmitted(spec) for spec in specs], on_confirmed=confirmed)
        if args.trace:
            await bus.publish(SubmissionsSealed(args.trace, len(specs)))
        publish_s = time.monotonic() - publishing
        if progress is not None:
            progress.close()
    finally:
        await bus.close()
    ids = [spec.job_id for spec in specs]
    if args.json:
        print_json({"job_ids": ids, "published": len(ids), "publish_s": publish_s})
    elif len(ids) == 1:
        print(ids[0])
    else:
        print(f"submitted {len(ids)} jobs ({ids[0]} .. {ids[-1]})")
    return 0
