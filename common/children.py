"""A child process's life tied to its parent's.

Every process the services start for their own work (the policy service's solver, a sweep's or a
simulator's cell process, a worker's job and its ranks) asks the kernel to kill it when the
process that started it dies: a parent killed with SIGKILL (or the OOM killer) cannot stop its
children, which would otherwise compute on for ever, holding CPU, memory and GPUs nobody waits for.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with_parent(parent_pid: int | None = None) -> None:
    """In the child (or between fork and exec): be sent SIGKILL when the parent dies. Linux only
    (prctl's PR_SET_PDEATHSIG); elsewhere a child ends when it next finds its pipe to a dead parent
    closed. If the parent died before the call, nobody would signal: the child ends itself.

    ``parent_pid``: the parent's pid as the parent knew it (a preexec_fn gets it from the parent).
    Default: a multiprocessing child's parent, else whoever is the parent now; the latter cannot
    tell a parent that died before the call from the process that adopted the child."""
    if not sys.platform.startswith("linux"):
        return
    if parent_pid is None:
        import multiprocessing  # only where no pid is given: never between fork and exec

        parent = multiprocessing.parent_process()
        parent_pid = parent.pid if parent is not None and parent.pid is not None else os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)
