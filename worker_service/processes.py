"""Job processes: start one with its files, ask it to stop, make sure it is gone.

A job process never outlives its worker: it gets SIGKILL when the worker dies (Linux's
parent-death signal; a training process under a shell sets its own, to the shell, in
worker_service/training.py), so a worker that is SIGKILLed leaves nothing running on its GPUs, and
the job's steps since its last checkpoint are lost, as the mechanism assumes. It runs in a session
of its own (signals go to the whole group), so a Ctrl-C meant for the worker is not delivered to
it twice.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
from pathlib import Path

from worker_service.core import Launch
from worker_service.training import read_json

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

    @property
    def finished(self) -> bool:
        """The process and everything it started are gone (a shell's job outlives the shell)."""
        return self.process.returncode is not None and not self._group_alive()

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    async def wait_finished(self, poll_s: float = 0.05) -> None:
        await self.process.wait()
        while self._group_alive():
            await asyncio.sleep(poll_s)

    def signal(self, signum: int) -> None:
        """To the job's whole process group (its session): a shell running a compound command
        would otherwise die and leave the training process behind."""
        if not self.finished:
            try:
                os.killpg(self.process.pid, signum)
            except ProcessLookupError:
                pass
            except PermissionError:
                self.process.send_signal(signum)

    async def stop(self, grace_s: float) -> int:
        """SIGTERM (the iterator checkpoints at the end of its step and exits), then SIGKILL to the
        whole group after ``grace_s``. Returns the exit code.

        The SIGTERM goes to the training process itself when its progress file names it (a shell
        that ran a compound command would die at once, and its death would take the training
        process with it before its checkpoint); to the whole group otherwise."""
        trainer = self._trainer_pid()
        if trainer is not None:
            try:
                os.kill(trainer, signal.SIGTERM)
            except ProcessLookupError:
                self.signal(signal.SIGTERM)
        else:
            self.signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.wait_finished(), grace_s)
        except asyncio.TimeoutError:
            self.signal(signal.SIGKILL)
            await self.wait_finished()
        return self.process.returncode  # type: ignore[return-value]

    def _trainer_pid(self) -> int | None:
        """The training process's pid from its progress file, if it is one of ours."""
        progress = read_json(Path(self.launch.progress_file)) or {}
        pid = progress.get("pid")
        if not isinstance(pid, int) or pid <= 0:
            return None
        try:
            return pid if os.getpgid(pid) == self.process.pid else None
        except OSError:
            return None

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
    Path(launch.progress_file).unlink(missing_ok=True)  # a previous attempt's progress must not be read as ours
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
