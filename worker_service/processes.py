"""Job processes: start one with its files, ask it to stop, make sure it is gone.

A job process never outlives its worker: it gets SIGKILL when the worker dies (Linux's
parent-death signal; a training process under a shell sets its own, to the shell, in
worker_service/training.py), so a worker that is SIGKILLed leaves nothing running on its GPUs, and
the job's steps since its last checkpoint are lost, as the mechanism assumes. It runs in a session
of its own (signals go to the whole group), so a Ctrl-C meant for the worker is not delivered to
it twice. Its stdout and stderr are one pipe the worker reads, so the worker keeps (and bounds)
what it writes, in the order it wrote it (worker_service/job_logs.py).
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from common.children import die_with_parent
from worker_service.core import Launch
from worker_service.logbook import complete_lines
from worker_service.training import read_json

READ_BYTES = 64 * 1024
OUTPUT_FLUSH_S = 0.5  # a partial line (a prompt, a progress bar without its end) is written after this much quiet
OUTPUT_DRAIN_S = 2.0  # after its group is gone, how long its output may take to be read to the end
TAIL_KEPT_BYTES = 8 * 1024

Output = Callable[[bytes], None]  # where a process's output goes, whole lines at a time


class JobProcess:
    """One started process (a job, or one rank of a gang)."""

    def __init__(self, launch: Launch, process: asyncio.subprocess.Process, output: Output | None = None) -> None:
        self.launch = launch
        self.process = process
        self._tail = bytearray()  # its last TAIL_KEPT_BYTES of output: a crash report's tail
        self._gone_at: float | None = None
        streams = [process.stdout] if process.stdout is not None else []
        self._readers = [asyncio.get_running_loop().create_task(self._read(stream, output)) for stream in streams]

    async def _read(self, stream: asyncio.StreamReader, output: Output | None) -> None:
        """Whole lines to ``output`` as they come (a partial line after OUTPUT_FLUSH_S of quiet)."""
        held = b""
        while True:
            try:
                chunk = await asyncio.wait_for(stream.read(READ_BYTES), OUTPUT_FLUSH_S)
            except asyncio.TimeoutError:
                if held and output is not None:
                    output(held)
                held = b""
                continue
            except (OSError, ValueError):
                chunk = b""
            if chunk:
                self._tail += chunk
                del self._tail[: max(0, len(self._tail) - TAIL_KEPT_BYTES)]
            ready, held = complete_lines(held, chunk, final=not chunk)
            if ready and output is not None:
                output(ready)
            if not chunk:
                return

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def exit_code(self) -> int | None:
        return self.process.returncode

    @property
    def finished(self) -> bool:
        """The process and everything it started are gone (a shell's job outlives the shell), and
        its output is read to the end (or, should something outside its group hold its pipes,
        OUTPUT_DRAIN_S after)."""
        if self.process.returncode is None or self._group_alive():
            return False
        self._gone_at = self._gone_at or time.monotonic()
        return all(r.done() for r in self._readers) or time.monotonic() - self._gone_at > OUTPUT_DRAIN_S

    async def drained(self) -> None:
        """Its output is all written (waits OUTPUT_DRAIN_S at most)."""
        if self._readers:
            await asyncio.wait(self._readers, timeout=OUTPUT_DRAIN_S)

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
        while not self.finished:
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

    def output_tail(self, chars: int) -> str:
        """The end of what it wrote (stdout and stderr: a traceback comes last)."""
        return bytes(self._tail).decode("utf-8", "replace")[-chars:]


async def start(launch: Launch, output: Output | None = None) -> JobProcess:
    """Start ``launch``; its stdout and stderr, one pipe (so they interleave as written), go to
    ``output`` as whole lines (the job's log, worker_service/job_logs.py). Raises OSError when it cannot start (no such command, working
    directory missing)."""
    Path(launch.progress_file).parent.mkdir(parents=True, exist_ok=True)
    Path(launch.progress_file).unlink(missing_ok=True)  # a previous attempt's progress must not be read as ours
    process = await asyncio.create_subprocess_exec(
        *launch.argv,
        cwd=launch.cwd,
        env=dict(launch.env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=functools.partial(die_with_parent, os.getpid()),  # runs in the child, between fork and exec
    )
    return JobProcess(launch, process, output)
