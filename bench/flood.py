"""A flood of submissions against the bound of the mechanism's queue (issue 13, backpressure).

The services run as processes on a private exchange (mechanism with its journal, policy,
estimator, and a simulated fleet, the clock 1000x), and `gavel submit --trace` publishes N jobs
(default 100,000) of a generated trace while the mechanism runs and schedules. The trace keeps its
spacing, so the mechanism takes every job in at once and admits them as they arrive. Printed:
- the jobs accepted and not accepted by the broker, with the reason the command gave;
- what the mechanism answered for the batch (new, known, refused);
- the peak resident memory (VmHWM) of each service process, and of its children (the policy's
  solver), and of the submitting command;
- the time the command took, and until the mechanism had journaled every accepted job;
- whether the mechanism's journal holds exactly the accepted jobs (its kind='submitted' events,
  read-only, decoded).
The exchange and the queues are deleted afterwards, whatever happens.

The bound is 10,000 unless --max-length says otherwise: a tenth of the flood, so that it is
reached (the default setting, 100,000, holds a whole flood of 100,000 waiting).

Usage: python bench/flood.py [--jobs 100000] [--max-length 10000] [--amqp URL] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.config import DEFAULT_AMQP_URL  # noqa: E402

SERVICES = ("mechanism", "policy", "estimator", "fleet")
FLOOD_MAX_LENGTH = 10_000  # below the flood, so the bound is reached (the setting's default is 100,000)
SAMPLE_S = 0.2  # how often the process trees are looked at (a child's peak is lost when it exits)
PROGRESS_S = 5.0


def note(text: str) -> None:
    """Progress, on stderr (stdout is the report)."""
    sys.stderr.write(f"flood: {text}\n")
    sys.stderr.flush()


# -- peak resident memory ------------------------------------------------------------------------


def vm_hwm_kib(pid: int) -> int | None:
    """The process's peak resident set (VmHWM), KiB; None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def descendants(pid: int) -> Iterator[int]:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return
    for tid in tasks:
        try:
            children = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        for child in map(int, children):
            yield child
            yield from descendants(child)


@dataclass
class Peaks:
    """Peak VmHWM per named process (KiB), its own and the largest of its descendants'."""

    own: dict[str, int] = field(default_factory=dict)
    children: dict[str, int] = field(default_factory=dict)

    def sample(self, name: str, pid: int) -> None:
        own = vm_hwm_kib(pid)
        if own is not None:
            self.own[name] = max(self.own.get(name, 0), own)
        for child in descendants(pid):
            kib = vm_hwm_kib(child)
            if kib is not None:
                self.children[name] = max(self.children.get(name, 0), kib)


class Sampler(threading.Thread):
    def __init__(self, processes: Callable[[], dict[str, int]]) -> None:
        super().__init__(daemon=True, name="rss-sampler")
        self.peaks = Peaks()
        self._processes = processes
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            for name, pid in self._processes().items():
                self.peaks.sample(name, pid)
            self._halt.wait(SAMPLE_S)

    def stop(self) -> Peaks:
        self._halt.set()
        self.join()
        for name, pid in self._processes().items():  # a last look before they stop
            self.peaks.sample(name, pid)
        return self.peaks


# -- the services --------------------------------------------------------------------------------


class Services:
    """`gavel serve ...` processes on one private exchange; stopped and cleaned up on exit."""

    def __init__(self, url: str, workdir: Path, max_length: int | None) -> None:
        self.url = url
        self.workdir = workdir
        self.exchange = f"gavel-flood-{uuid.uuid4().hex[:8]}"
        self.journal = workdir / "mechanism.sqlite"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("GAVEL_")},
            "GAVEL_AMQP_URL": url, "GAVEL_EXCHANGE": self.exchange, "GAVEL_LOG_LEVEL": "warning",
            "GAVEL_LOG_FORMAT": "json", "XDG_STATE_HOME": str(workdir),
            "GAVEL_SUBMISSIONS_MAX_LENGTH": "none" if max_length is None else str(max_length),
        }
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.pids: dict[str, int] = {}  # what the sampler watches (the submitting command too)

    def start(self, fleet: str, time_scale: float) -> None:
        scale = ("--time-scale", f"{time_scale:g}")
        argv = {
            "mechanism": ("serve", "mechanism", "--journal", str(self.journal), *scale),
            "policy": ("serve", "policy"),
            "estimator": ("serve", "estimator", "--state", str(self.workdir / "estimator.sqlite")),
            "fleet": ("serve", "fleet", "--cluster", fleet, *scale),
        }
        for name in SERVICES:
            health = self.workdir / f"{name}.health"
            log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
            self.processes[name] = subprocess.Popen(
                [sys.executable, "-m", "services.cli", *argv[name], "--health-file", str(health)],
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            )
            self.pids[name] = self.processes[name].pid
        deadline = time.monotonic() + 90
        for name in SERVICES:
            health = self.workdir / f"{name}.health"
            while not (health.exists() and json.loads(health.read_text() or "{}").get("ready")):
                if self.processes[name].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not start: {self.log_tail(name)}")
                time.sleep(0.05)

    def log_tail(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text()[-2000:] if path.exists() else "(no log)"

    def alive(self) -> list[str]:
        return [name for name, p in self.processes.items() if p.poll() is None]

    def stop(self) -> dict[str, int | None]:
        for p in self.processes.values():
            if p.poll() is None:
                p.terminate()
        codes: dict[str, int | None] = {}
        for name, p in self.processes.items():
            try:
                codes[name] = p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                codes[name] = p.wait()
        return codes

    def queue_depths(self) -> dict[str, int]:
        """Messages waiting in each submission queue now (the broker's count: not yet delivered)."""
        from common.topology import SUBMISSION_QUEUES

        async def depths() -> dict[str, int]:
            import aio_pika

            connection = await aio_pika.connect(self.url)
            try:
                channel = await connection.channel()
                out = {}
                for queue in SUBMISSION_QUEUES:
                    declared = await channel.declare_queue(f"{self.exchange}.{queue.name}", passive=True)
                    out[queue.name] = int(declared.declaration_result.message_count)
                return out
            finally:
                await connection.close()

        return asyncio.run(depths())

    def clean_up(self) -> None:
        from tests.support.broker import delete_topology
        from tests.support.processes import SERVICE_QUEUES

        asyncio.run(delete_topology(self.url, self.exchange, SERVICE_QUEUES))


# -- the flood -----------------------------------------------------------------------------------


def journaled_ids(path: Path) -> list[str]:
    """The job ids of the mechanism's accepted submissions, from its journal (read-only)."""
    from common.codec import DEFAULT_CODEC
    from common.messages import JobSubmitted

    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT body FROM events WHERE kind = 'submitted' ORDER BY seq").fetchall()
    finally:
        db.close()
    ids = []
    for (body,) in rows:
        message = DEFAULT_CODEC.decode(body).message
        assert isinstance(message, JobSubmitted), type(message).__name__
        ids.append(message.spec.job_id)
    return ids


def journaled_count(path: Path) -> int:
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return int(db.execute("SELECT COUNT(*) FROM events WHERE kind = 'submitted'").fetchone()[0])
        finally:
            db.close()
    except sqlite3.Error:
        return 0


def generate_trace(path: Path, jobs: int, jobs_per_hour: float) -> None:
    subprocess.run(
        [sys.executable, "-m", "services.cli", "trace", "generate", "--jobs", str(jobs), "--jobs-per-hour",
         f"{jobs_per_hour:g}", "--seed", "0", "--output", str(path)],
        cwd=ROOT, check=True, capture_output=True,
    )


def submit(services: Services, trace: Path, timeout_s: float) -> tuple[dict[str, object], int, float, list[str]]:
    """`gavel submit --trace --json` as a user runs it: (its answer, exit code, wall seconds, its
    stderr lines that are not progress). Its progress bar goes to our stderr as it runs."""
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "submit", "--trace", str(trace), "--id-prefix", "", "--json",
         "--timeout-s", f"{timeout_s:g}"],
        cwd=ROOT, env=services.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    services.pids["gavel submit"] = process.pid
    lines: list[str] = []

    def relay() -> None:  # progress through to the user, the rest kept for the report
        assert process.stderr is not None
        for raw in iter(lambda: process.stderr.readline(), b""):  # type: ignore[union-attr]
            text = raw.decode("utf-8", "replace")
            sys.stderr.write(text)
            for part in text.replace("\r", "\n").splitlines():
                if part.startswith("gavel: "):
                    lines.append(part)

    relay_thread = threading.Thread(target=relay, daemon=True)
    relay_thread.start()
    assert process.stdout is not None
    out = process.stdout.read()
    code = process.wait()
    relay_thread.join()
    took_s = time.monotonic() - started
    services.pids.pop("gavel submit", None)
    if not out.strip():
        raise RuntimeError(f"gavel submit printed no answer (exit {code}): {' / '.join(lines)}")
    return json.loads(out), code, took_s, lines


def wait_journaled(services: Services, accepted: int, timeout_s: float) -> float:
    """Seconds until the mechanism's journal holds ``accepted`` submissions."""
    started = time.monotonic()
    last_note = started
    while True:
        count = journaled_count(services.journal)
        now = time.monotonic()
        if count >= accepted:
            return now - started
        if now - started > timeout_s:
            raise RuntimeError(f"the mechanism journaled {count} of {accepted} within {timeout_s:g} s")
        if "mechanism" not in services.alive():
            raise RuntimeError(f"the mechanism exited: {services.log_tail('mechanism')}")
        if now - last_note >= PROGRESS_S:
            note(f"journaled {count:,} of {accepted:,}")
            last_note = now
        time.sleep(0.05)


def flood(args: argparse.Namespace, workdir: Path) -> dict[str, object]:
    trace = workdir / "flood.trace"
    note(f"generating a trace of {args.jobs:,} jobs")
    generate_trace(trace, args.jobs, args.jobs_per_hour)
    services = Services(args.amqp, workdir, args.max_length)
    sampler = Sampler(lambda: dict(services.pids))
    try:
        note(f"starting {', '.join(SERVICES)} on exchange {services.exchange} (bound {args.max_length})")
        services.start(args.fleet, args.time_scale)
        sampler.start()
        note(f"submitting {args.jobs:,} jobs (gavel submit --trace)")
        answer, code, submit_s, lines = submit(services, trace, args.timeout_s)
        not_accepted = answer["not_accepted"]
        assert isinstance(not_accepted, dict)
        refused_ids = set(not_accepted["job_ids"])
        all_ids = list(answer["job_ids"])  # type: ignore[call-overload]
        accepted_ids = [job_id for job_id in all_ids if job_id not in refused_ids]
        note(f"{len(accepted_ids):,} accepted, {len(refused_ids):,} not accepted; waiting for the journal")
        journal_s = wait_journaled(services, len(accepted_ids), args.timeout_s * 10)
        dead = [name for name in SERVICES if name not in services.alive()]
        depths = services.queue_depths()  # the estimator's backlog waits in the broker, not in it
        peaks = sampler.stop()
        note("checking the journal")
        journaled = journaled_ids(services.journal)
        exit_codes = services.stop()
    finally:  # each step whatever the one before did: no process or queue is left behind
        try:
            if sampler.is_alive():
                sampler.stop()
        finally:
            try:
                services.stop()
            finally:
                note(f"deleting exchange {services.exchange} and its queues")
                services.clean_up()
    in_journal = set(journaled)
    return {
        "jobs": args.jobs,
        "max_length": args.max_length,
        "exchange": services.exchange,  # deleted, with its queues
        "accepted": len(accepted_ids),
        "not_accepted": len(refused_ids),
        "reason": not_accepted["reason"],
        "cli_lines": lines,
        "cli_exit_code": code,
        "mechanism_answer": {k: answer.get(k) for k in ("new", "known", "refused", "sealed", "confirmed")},
        "submit_s": round(submit_s, 2),
        "publish_s": round(float(answer["publish_s"]), 2),  # type: ignore[arg-type]
        "journaled_after_submit_s": round(journal_s, 2),
        "journal_submitted_events": len(journaled),
        "journal_is_exactly_the_accepted": in_journal == set(accepted_ids) and len(journaled) == len(in_journal),
        "accepted_missing_from_journal": len(set(accepted_ids) - in_journal),
        "in_journal_not_accepted": len(in_journal - set(accepted_ids)),
        "queue_depths_at_the_end": depths,
        "peak_rss_mib": {name: round(kib / 1024, 1) for name, kib in peaks.own.items()},
        "peak_rss_children_mib": {name: round(kib / 1024, 1) for name, kib in peaks.children.items()},
        "services_died_during_the_flood": dead,
        "service_exit_codes": exit_codes,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument(
        "--max-length", type=lambda v: None if v == "none" else int(v), default=FLOOD_MAX_LENGTH,
        help=f"the submissions bound (GAVEL_SUBMISSIONS_MAX_LENGTH; default {FLOOD_MAX_LENGTH:,}: a tenth of the flood; 'none')",
    )
    parser.add_argument("--fleet", default="v100=4,p100=4,k80=4", help="the simulated fleet (default v100=4,p100=4,k80=4)")
    parser.add_argument("--time-scale", type=float, default=1000.0)
    parser.add_argument("--jobs-per-hour", type=float, default=30.0, help="the trace's arrival rate (default 30)")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="gavel submit's --timeout-s (default 60)")
    parser.add_argument("--amqp", default=os.environ.get("GAVEL_AMQP_URL", DEFAULT_AMQP_URL))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from common.config import LogSettings
    from common.log import configure_logging

    configure_logging(LogSettings(level="warning"))  # the cleanup's connection notes are noise here
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gavel-flood-") as tmp:
        report = flood(args, Path(tmp))
    report["total_s"] = round(time.monotonic() - started, 1)
    ok = bool(report["journal_is_exactly_the_accepted"]) and not report["services_died_during_the_flood"]
    if args.json:
        print(json.dumps(report, indent=2))
        return 0 if ok else 1
    answer = report["mechanism_answer"]
    assert isinstance(answer, dict)
    print(f"flood: {args.jobs:,} jobs through gavel submit --trace, bound {args.max_length} (GAVEL_SUBMISSIONS_MAX_LENGTH)")
    print(f"  accepted by the broker:   {report['accepted']:>9,}")
    print(f"  not accepted:             {report['not_accepted']:>9,}  ({report['reason'] or '-'})")
    print(f"  the mechanism's answer:   {answer['new']} new, {answer['known']} known, {answer['refused']} refused "
          f"(sealed: {answer['sealed']})")
    print(f"  the command said:         {report['cli_lines'][0] if report['cli_lines'] else '-'} (exit {report['cli_exit_code']})")
    print(f"  gavel submit took         {report['submit_s']:>9} s (publishing {report['publish_s']} s)")
    print(f"  all accepted journaled    {report['journaled_after_submit_s']:>9} s after it returned")
    verdict = "yes" if report["journal_is_exactly_the_accepted"] else (
        f"NO: {report['accepted_missing_from_journal']} accepted missing, {report['in_journal_not_accepted']} extra")
    print(f"  journal = the accepted:   {verdict} ({report['journal_submitted_events']:,} submitted events)")
    print("  peak resident memory (VmHWM), MiB:")
    own, children = report["peak_rss_mib"], report["peak_rss_children_mib"]
    assert isinstance(own, dict) and isinstance(children, dict)
    for name in (*SERVICES, "gavel submit"):
        extra = f"  (children: {children[name]})" if name in children else ""
        print(f"    {name:<14} {own.get(name, '-'):>8}{extra}")
    depths = report["queue_depths_at_the_end"]
    assert isinstance(depths, dict)
    print(f"  waiting in the broker when the journal was complete: {', '.join(f'{q} {n:,}' for q, n in depths.items())}")
    if report["services_died_during_the_flood"]:
        print(f"  DIED during the flood: {report['services_died_during_the_flood']}")
    print(f"  total {report['total_s']} s ({os.cpu_count()} CPUs shared by the broker, the services and the command)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
