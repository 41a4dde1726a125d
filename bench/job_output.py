"""What keeping a job's output costs (issue 25, item 6): a job that writes as fast as it can.

The job is a Python process that writes --mib MiB of 80-byte lines to stdout. Measured side by
side, alternating run by run (median of --runs):
- to a file: its stdout is the file itself (what the worker did before it kept output for `gavel
  logs`: the kernel writes, the worker does nothing);
- kept by the worker: its stdout is the pipe the worker reads (worker_service/processes.py), whole
  lines into the attempt's segments under the job's bound (worker_service/job_logs.py), as
  `gavel serve worker` does; also the worker's own CPU seconds per MiB (its event loop's share).
Printed: MiB/s of each, the ratio kept / file, and the worker's CPU per MiB.

Usage: python bench/job_output.py [--mib 200] [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from worker_service import processes  # noqa: E402
from worker_service.core import Launch  # noqa: E402
from worker_service.job_logs import LogStore  # noqa: E402
from worker_service.logbook import LogLimits  # noqa: E402

WRITER = (
    "import sys\n"
    "line = b'x' * 79 + b'\\n'\n"
    "block = line * 800\n"
    "out = sys.stdout.buffer\n"
    "for _ in range(int(sys.argv[1]) * 1024 * 1024 // len(block)):\n"
    "    out.write(block)\n"
    "out.flush()\n"
)


def to_file(mib: int, directory: Path) -> float:
    with open(directory / "direct.log", "wb") as out:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", WRITER, str(mib)], stdout=out, check=True)
        return time.perf_counter() - t0


async def kept(mib: int, directory: Path) -> tuple[float, float]:
    store = LogStore(directory / "logs", "bench", LogLimits())
    store.open()
    attempt = store.begin("bench-job", ranks=[0], lease_id="0:0", started_unix_s=time.time())
    launch = Launch(
        job_id="bench-job", job_type="", rank=0, local_rank=0, argv=(sys.executable, "-c", WRITER, str(mib)),
        cwd=str(directory), env={"PATH": "/usr/bin:/bin"}, lease_file=str(directory / "lease.json"),
        progress_file=str(directory / "progress.json"), reports=True,
    )
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    job = await processes.start(launch, attempt.write)
    await job.wait_finished()
    await job.drained()
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    store.end(attempt, "finished")
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return wall, cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=200)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    direct, through, cpus = [], [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as d:
            direct.append(to_file(args.mib, Path(d)))
        with tempfile.TemporaryDirectory() as d:
            wall, cpu = asyncio.run(kept(args.mib, Path(d)))
            through.append(wall)
            cpus.append(cpu)
    file_mib_s = args.mib / statistics.median(direct)
    kept_mib_s = args.mib / statistics.median(through)
    result = {
        "mib": args.mib, "runs": args.runs, "file_mib_per_s": round(file_mib_s, 1), "kept_mib_per_s": round(kept_mib_s, 1),
        "kept_vs_file": round(kept_mib_s / file_mib_s, 3), "worker_cpu_ms_per_mib": round(1000 * statistics.median(cpus) / args.mib, 2),
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"a job writing {args.mib} MiB of 80-byte lines, median of {args.runs}:")
    print(f"  stdout to a file:          {file_mib_s:8.1f} MiB/s")
    print(f"  kept by the worker:        {kept_mib_s:8.1f} MiB/s  ({result['kept_vs_file']:.2f} x the file)")
    print(f"  the worker's CPU:          {result['worker_cpu_ms_per_mib']:8.2f} ms per MiB")


if __name__ == "__main__":
    main()
