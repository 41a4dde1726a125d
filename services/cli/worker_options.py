"""``gavel serve worker``: its flags, and the checks that refuse what the worker cannot do with one
line each (a CUDA worker on a machine without CUDA, an accelerator type the table does not know,
a checkpoint directory that cannot be written, a speed that is not a speed).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
from pathlib import Path

from common.config import Settings
from common.throughputs import ThroughputTable
from services.cli.common import CommandFailed, positive_int, positive_number

WORKER_ID = re.compile(r"[A-Za-z0-9_-]{1,100}")
SPEED_HELP = (
    "emulate a slower accelerator on this machine: each step is stretched to 1/FACTOR of its time "
    "(FACTOR in (0, 1]); 'table': per job type, its speed on --type relative to its fastest type in the "
    "throughput table (default 1: no emulation). Lets a CPU-only test cluster of 'v100' and 'k80' workers differ"
)


def add_worker_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--type", dest="accelerator_type", required=True, help="the accelerator type of this server's GPUs, e.g. v100")
    p.add_argument("--gpus", type=positive_int, required=True, help="how many of them this worker owns")
    p.add_argument("--worker-id", help="this worker's name in the cluster (default: <hostname>-<type>)")
    p.add_argument("--server-id", help="the server it is on, for gang placement (default: the worker id)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where jobs run (default cpu)")
    p.add_argument(
        "--checkpoint-dir",
        help="where jobs keep checkpoints: the same shared path on every worker, so a job resumes wherever it "
        "runs next (default: $XDG_STATE_HOME/gavel/checkpoints)",
    )
    p.add_argument("--work-dir", help="where a job's command runs unless it gave its own (default: the current directory)")
    p.add_argument("--run-dir", help="this worker's own files: lease and progress files (default: $XDG_STATE_HOME/gavel/worker-<id>)")
    p.add_argument(
        "--log-dir",
        help="where it keeps its jobs' output, which `gavel logs JOB` reads (default: $XDG_STATE_HOME/gavel/logs/<id>)",
    )
    p.add_argument(
        "--log-job-mib", type=positive_number, default=8.0, metavar="MIB",
        help="keep the last MIB of each job's output here, its attempts together (default 8)",
    )
    p.add_argument(
        "--log-total-mib", type=positive_number, default=1024.0, metavar="MIB",
        help="keep at most MIB of output of ended jobs in all; the oldest ended go first (default 1024)",
    )
    p.add_argument(
        "--log-keep-h", type=positive_number, default=168.0, metavar="H",
        help="remove a job's output H hours after it ended here (default 168: a week)",
    )
    p.add_argument("--emulate-speed", default="1", metavar="FACTOR|table", help=SPEED_HELP)
    p.add_argument("--threads-per-job", type=positive_int, default=1, help="CPU threads each job process may use (default 1)")
    p.add_argument("--workload-size", choices=("small", "full"), help="catalog workloads' size (default: small on cpu, full on cuda)")
    p.add_argument("--heartbeat-s", type=positive_number, default=2.0, help="heartbeat interval (default 2)")
    p.add_argument("--kill-grace-s", type=positive_number, default=30.0, help="after SIGTERM, wait this long for a checkpoint before SIGKILL (default 30)")
    p.add_argument(
        "--advertise-host",
        help="the address other workers reach this one at, for gangs across servers (default: this host's name "
        "when it resolves to a routable address, else 127.0.0.1)",
    )


def default_advertise_host() -> str:
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        return "127.0.0.1"
    return "127.0.0.1" if address.startswith("127.") else name


def parse_speed(text: str, accelerator_type: str, table: ThroughputTable) -> tuple[dict[str, float], float]:
    """(per job type, default) speed factors."""
    if text == "table":
        speeds: dict[str, float] = {}
        for job_type, scale_factor in table.job_keys:
            if scale_factor != 1:
                continue
            rates = {}
            for w in table.accelerator_types:
                try:
                    rates[w] = table.isolated(job_type, 1, w)
                except Exception:  # noqa: BLE001 - not measured on that type
                    continue
            fastest = max(rates.values(), default=0.0)
            if fastest > 0 and rates.get(accelerator_type, 0.0) > 0:
                speeds[job_type] = rates[accelerator_type] / fastest
        return speeds, 1.0
    try:
        factor = float(text)
    except ValueError:
        factor = float("nan")
    if not 0 < factor <= 1:
        raise CommandFailed(f"--emulate-speed: expected a factor in (0, 1] or 'table', got {text!r}", exit_code=2)
    return {}, factor


def check_device(device: str) -> None:
    from worker_service.devices import cuda_problem, torch_problem  # noqa: PLC0415

    problem = torch_problem()
    if problem:
        raise CommandFailed(f"a worker runs PyTorch jobs: {problem}", exit_code=2)
    if device != "cuda":
        return
    problem = cuda_problem()
    if problem:
        raise CommandFailed(f"--device cuda: {problem}; use --device cpu", exit_code=2)


def worker_config(args: argparse.Namespace, settings: Settings, table: ThroughputTable):  # noqa: ANN201
    from worker_service.core import WorkerConfig  # noqa: PLC0415

    if args.accelerator_type not in table.accelerator_types:
        known = ", ".join(t for t in table.accelerator_types if not t.endswith("_unconsolidated"))
        raise CommandFailed(f"--type: the throughput table has no accelerator type {args.accelerator_type!r} (known: {known})", exit_code=2)
    check_device(args.device)
    if args.worker_id is not None and not WORKER_ID.fullmatch(args.worker_id):
        raise CommandFailed(
            f"--worker-id {args.worker_id!r}: letters, digits, '-' and '_' only (it is one word of the routing "
            "key worker.cmd.<id>.run)", exit_code=2,
        )
    # the host name's dots would split the routing key: a fully qualified name becomes one word
    worker_id = args.worker_id or re.sub(r"[^A-Za-z0-9_-]+", "-", f"{socket.gethostname()}-{args.accelerator_type}")
    state = Path(settings.state_dir)
    checkpoint_dir = Path(args.checkpoint_dir or state / "checkpoints").absolute()
    run_dir = Path(args.run_dir or state / f"worker-{worker_id}").absolute()
    log_dir = Path(args.log_dir or state / "logs" / worker_id).absolute()
    work_dir = Path(args.work_dir or os.getcwd()).absolute()
    for flag, directory in (
        ("--checkpoint-dir", checkpoint_dir), ("--run-dir", run_dir), ("--log-dir", log_dir), ("--work-dir", work_dir)
    ):
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CommandFailed(f"{flag} {directory}: cannot create it: {e.strerror}", exit_code=2) from None
        if not os.access(directory, os.W_OK | os.X_OK):
            raise CommandFailed(f"{flag} {directory}: not writable by this user", exit_code=2)
    speeds, default_speed = parse_speed(args.emulate_speed, args.accelerator_type, table)
    size = args.workload_size or ("full" if args.device == "cuda" else "small")
    return WorkerConfig(
        worker_id=worker_id,
        accelerator_type=args.accelerator_type,
        gpus=args.gpus,
        device=args.device,
        checkpoint_dir=str(checkpoint_dir),
        work_dir=str(work_dir),
        run_dir=str(run_dir),
        python=sys.executable,
        emulate_speed=speeds,
        default_speed=default_speed,
        threads_per_job=args.threads_per_job,
        advertise_host=args.advertise_host or default_advertise_host(),
        workload_args=("--size", size),
        log_dir=str(log_dir),
    )


def log_limits(args: argparse.Namespace):  # noqa: ANN201
    from worker_service.logbook import MiB, LogLimits  # noqa: PLC0415

    return LogLimits(
        job_bytes=int(args.log_job_mib * MiB), total_bytes=int(args.log_total_mib * MiB), keep_s=args.log_keep_h * 3600.0
    )
