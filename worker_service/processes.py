"""Job processes: start one with its files, ask it to stop, make sure it is gone.

A job process never outlives its worker: it gets SIGKILL when the worker dies (Linux's
parent-death signal), so a worker that is SIGKILLed leaves nothing running on its GPUs, and the
job's steps since its last checkpoint are lost, as the mechanism assumes. It runs in a session of
its own, so a Ctrl-C meant for the worker is not delivered to it twice.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
from pathlib import Path

from worker_service.core import Launch

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child, between fork and exec
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class JobProcess:
    """One started process (a job, or one rank of a gang)."""

    def __init__(self, launch: Launch, process: asyncio.subprocess.Process) -> None:
        self.launch = launch
        self.process = process

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def exit_code(self) -> int | None:
        return self.process.returncode

    async def wait(self) -> int:
        return await self.process.wait()

    def signal(self, signum: int) -> None:
        if self.process.returncode is None:
            try:
                self.process.send_signal(signum)
            except ProcessLookupError:
                pass

    async def stop(self, grace_s: float) -> int:
        """SIGTERM (the iterator checkpoints at the end of its step and exits), then SIGKILL after
        ``grace_s``. Returns the exit code."""
        self.signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.process.wait(), grace_s)
        except asyncio.TimeoutError:
            self.signal(signal.SIGKILL)
            return await self.process.wait()

    def stderr_tail(self, chars: int) -> str:
        return tail(Path(self.launch.stderr_file), chars)


def tail(path: Path, chars: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - chars * 4))
            return f.read().decode("utf-8", "replace")[-chars:]
    except OSError:
        return ""


async def start(launch: Launch) -> JobProcess:
    """Start ``launch`` with stdout and stderr in its log files. Raises OSError when it cannot
    start (no such command, working directory missing)."""
    Path(launch.stderr_file).parent.mkdir(parents=True, exist_ok=True)
    for stale in (launch.progress_file,):
        Path(stale).unlink(missing_ok=True)  # a previous attempt's progress must not be read as ours
    with open(launch.stdout_file, "ab") as out, open(launch.stderr_file, "wb") as err:
        process = await asyncio.create_subprocess_exec(
            *launch.argv,
            cwd=launch.cwd,
            env=dict(launch.env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    return JobProcess(launch, process)
