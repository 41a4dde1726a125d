"""What running under a worker costs a catalog workload: steps/s by hand vs under leases.

Per run (median of --runs reported), one CPU thread per process, on a machine of two cores or more:
- by hand (the baseline): the workload's own loop (build, 5 warm-up steps, then steps, printing
  its count every second), in a process of its own, *at the same time* as the worker's job, on the
  other core. Both see the same machine over the same minutes: measured one after the other, the
  machine's drift (+-4% between minutes here) was larger than what is being measured. Each is
  pinned to its core, and the cores are swapped at every run (they differ by a few per cent).
- under a worker: the real WorkerService (in this process, on the in-memory bus; the script plays
  the mechanism) runs the workload as its child process under --leases leases of --lease-s
  seconds, each extended as soon as the previous one is reported (as a mechanism does at a round
  boundary). Steady state = the steps of leases 2..N over the time from lease 1's report to lease
  N's: pauses, checkpoints, lease-file checks and progress writes included; the baseline's rate
  is taken over the same window.
  overhead = 1 - steady / by hand (goal, issue 10: < 3%). Its structural part: the share of
  leases 2..N's wall time not spent stepping (the pause at each lease end, its report and
  extension, the checkpoint).
- run -> first step: the first lease's start-up (process start, imports, model build) plus
  restore, fresh and again when resuming from a checkpoint in a new process.
- kill -> checkpoint: from KillJobs to the checkpoint directory appearing, and to the report.

Usage: python bench/worker_overhead.py [--job-type "ResNet-18 (batch size 32)"] [--lease-s 30]
       [--leases 4] [--runs 4] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.config import LogSettings  # noqa: E402
from common.log import configure_logging  # noqa: E402
from common.messages import ExtendLease, JobProgress, KillJobs, RunJobs  # noqa: E402
from common.transport.memory import InMemoryBroker, InMemoryBus  # noqa: E402
from worker_service.core import WorkerConfig  # noqa: E402
from worker_service.service import WorkerService  # noqa: E402
from worker_service.training import checkpoint_steps  # noqa: E402

GOAL_OVERHEAD = 0.03
BY_HAND = """
import sys, time, torch
torch.set_num_threads(1)
from worker_service.workloads.catalog import entry_for
from worker_service.workloads.config import WorkloadConfig
job = entry_for(sys.argv[1]).build(WorkloadConfig(size="small"))
def forever():  # epoch after epoch, as the lease iterator cycles the loader
    while True:
        yield from job.data
batches = forever()
for _ in range(5):
    job.train_step(next(batches))
steps, last = 0, 0.0
while True:
    job.train_step(next(batches))
    steps += 1
    now = time.time()
    if now - last >= 1.0:
        print(now, steps, flush=True)
        last = now
"""


def start_by_hand(job_type: str, core: int | None) -> subprocess.Popen[str]:
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    process = subprocess.Popen([sys.executable, "-c", BY_HAND, job_type], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    if core is not None:
        os.sched_setaffinity(process.pid, {core})
    return process


def cores_for(run: int) -> tuple[int | None, int | None]:
    """(baseline's core, job's core): swapped at every run, so that two unequal cores (seen here:
    a few per cent apart) weigh on both sides alike over the runs."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    a, b = cpus[0], cpus[1]
    return (a, b) if run % 2 == 0 else (b, a)


def rate_between(samples: list[tuple[float, int]], start_unix_s: float, end_unix_s: float) -> float:
    """Steps/s between the samples nearest the window's ends."""
    first = min(samples, key=lambda s: abs(s[0] - start_unix_s))
    last = min(samples, key=lambda s: abs(s[0] - end_unix_s))
    return (last[1] - first[1]) / (last[0] - first[0])


async def pin_job(worker: WorkerService, core: int | None) -> None:
    """Put the worker's job process on ``core`` (the baseline has the other one)."""
    while core is not None:
        run = worker._runs.get("job")
        if run is not None and run.procs:
            os.sched_setaffinity(run.procs[0].pid, {core})
            return
        await asyncio.sleep(0.01)


async def under_worker(job_type: str, lease_s: float, leases: int, work: Path, core: int | None = None) -> dict[str, float]:
    broker = InMemoryBroker()
    config = WorkerConfig(
        worker_id="bench", accelerator_type="v100", gpus=1, device="cpu", checkpoint_dir=str(work / "ckpt"),
        work_dir=str(ROOT), run_dir=str(work / "run"), python=sys.executable, workload_args=("--size", "small"),
    )
    worker = WorkerService(config=config, heartbeat_s=5.0, kill_grace_s=60.0)
    mechanism, worker_bus = InMemoryBus(broker, source="mechanism"), InMemoryBus(broker, source="worker")
    reports: asyncio.Queue[tuple[float, JobProgress]] = asyncio.Queue()

    async def collect(d) -> None:  # noqa: ANN001
        await reports.put((time.time(), d.message))

    await mechanism.start()
    await mechanism.subscribe("progress", [JobProgress.ROUTING_KEY], collect)
    await worker_bus.start()
    await worker.start(worker_bus)
    budget = 10**9
    try:
        await mechanism.publish(RunJobs("bench", 0, "0:0", 1, ("job",), (0,), lease_s, (budget,), (job_type,)))
        await pin_job(worker, core)
        got = [await reports.get()]
        for n in range(1, leases):
            done = sum(r.steps_done for _, r in got)
            await mechanism.publish(ExtendLease("bench", n, f"{n}:0", 1, lease_s, ("job",), (budget - done,), (job_type,)))
            got.append(await reports.get())
        first_t, first = got[0]
        steady_steps = sum(r.steps_done for _, r in got[1:])
        steady_rate = steady_steps / (got[-1][0] - first_t)
        structural = 1 - sum(r.stepping_s for _, r in got[1:]) / (got[-1][0] - first_t)
        # kill mid-lease: how long until the checkpoint is written, and until the report
        done = sum(r.steps_done for _, r in got)
        await mechanism.publish(ExtendLease("bench", leases, f"{leases}:0", 1, 600.0, ("job",), (budget - done,), (job_type,)))
        await asyncio.sleep(min(5.0, lease_s / 3))
        before = set(checkpoint_steps(work / "ckpt" / "job"))
        killed_at = time.time()
        await mechanism.publish(KillJobs("bench", leases, f"{leases}:0", 1, "bench"))
        while set(checkpoint_steps(work / "ckpt" / "job")) <= before:
            await asyncio.sleep(0.005)
        checkpoint_s = time.time() - killed_at
        kill_report_t, killed = await reports.get()
        resumed_from = done + killed.steps_done
        # a new process resuming from that checkpoint
        await mechanism.publish(RunJobs(
            "bench", leases + 1, f"{leases + 1}:0", 1, ("job",), (0,), 10.0, (budget - resumed_from,), (job_type,),
            resume_steps=(resumed_from,),
        ))
        _, resumed = await reports.get()
        return {
            "steady_steps_per_s": steady_rate,
            "window_unix_s": (first_t, got[-1][0]),
            "structural_overhead": structural,
            "lease_steps_per_s": statistics.median(r.throughput_steps_per_s for _, r in got[1:]),
            "first_step_s": first.startup_s + first.restore_s,
            "resume_first_step_s": resumed.startup_s + resumed.restore_s,
            "resume_restore_s": resumed.restore_s,
            "checkpoint_save_s": statistics.median(r.checkpoint_s for _, r in got),
            "kill_to_checkpoint_s": checkpoint_s,
            "kill_to_report_s": kill_report_t - killed_at,
        }
    finally:
        await worker.stop()
        await worker_bus.close()
        await mechanism.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--job-type", default="ResNet-18 (batch size 32)")
    p.add_argument("--lease-s", type=float, default=30.0)
    p.add_argument("--leases", type=int, default=4)
    p.add_argument("--runs", type=int, default=4, help="an even number: each core takes each side as often")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    runs = []
    configure_logging(LogSettings(level="warning"))  # the worker's lease events are noise here
    for run in range(args.runs):
        hand_core, job_core = cores_for(run)
        baseline = start_by_hand(args.job_type, hand_core)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                worker = asyncio.run(under_worker(args.job_type, args.lease_s, args.leases, Path(tmp), job_core))
        finally:
            baseline.terminate()
            out, _ = baseline.communicate(timeout=60)
        samples = [(float(t), int(n)) for t, n in (line.split() for line in out.splitlines() if line.strip())]
        hand = rate_between(samples, *worker.pop("window_unix_s"))
        runs.append({"by_hand_steps_per_s": hand, **worker, "overhead": 1 - worker["steady_steps_per_s"] / hand})
        if not args.json:
            print(f"run {run + 1}/{args.runs}: by hand {hand:.2f} steps/s, under a worker {worker['steady_steps_per_s']:.2f} "
                  f"steps/s, overhead {runs[-1]['overhead']:+.1%}", file=sys.stderr)
    median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    if args.json:
        print(json.dumps({"job_type": args.job_type, "lease_s": args.lease_s, "leases": args.leases, "runs": runs, "median": median}))
        return
    print(f"{args.job_type}, {args.leases} leases of {args.lease_s:g} s, median of {args.runs} runs (1 CPU thread each)")
    print(f"  by hand:                {median['by_hand_steps_per_s']:8.2f} steps/s  (baseline, on the other core, same minutes)")
    print(f"  under a worker:         {median['steady_steps_per_s']:8.2f} steps/s  (steady state, pauses and checkpoints included)")
    print(f"  overhead:               {median['overhead']:+8.1%}        (goal < {GOAL_OVERHEAD:.0%}; per run: "
          + ", ".join(f"{r['overhead']:+.1%}" for r in runs) + ")")
    print(f"  of which structural:    {median['structural_overhead']:+8.1%}        (lease wall time not spent stepping)")
    print(f"  within a lease:         {median['lease_steps_per_s']:8.2f} steps/s  (as reported: stepping time only)")
    print(f"  run -> first step:      {median['first_step_s']:8.2f} s        (fresh: process, imports, model)")
    print(f"  run -> first step:      {median['resume_first_step_s']:8.2f} s        (resumed; restore {median['resume_restore_s']:.2f} s)")
    print(f"  checkpoint at lease end:{median['checkpoint_save_s']:8.3f} s")
    print(f"  kill -> checkpoint:     {median['kill_to_checkpoint_s']:8.2f} s        (kill -> report {median['kill_to_report_s']:.2f} s)")


if __name__ == "__main__":
    main()
