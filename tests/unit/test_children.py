"""common/children.py: a child that asked to die with its parent is gone once its parent is
SIGKILLed (which gives the parent no chance to stop it). Linux only, as the call is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.support.waiting import eventually

# The parent starts a child that ties its life to the parent's (or not), given the parent's pid as
# a preexec_fn is, and waits for ever; the child says its pid once tied, and sleeps for ever.
PARENT = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", {child!r}, str(os.getpid())])
child.wait()
"""
CHILD = "import os, sys, time\n{tie}\nprint(os.getpid(), flush=True)\nwhile True: time.sleep(60)"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie has died (its parent is gone too)
    except FileNotFoundError:
        return False


async def _orphan_after_parent_killed(tie: str) -> int:
    child = CHILD.format(tie=tie)
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(child=child)], stdout=subprocess.PIPE, text=True)  # noqa: ASYNC220 - a short start, in a test
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    return pid


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
async def test_a_child_that_dies_with_its_parent_is_gone_when_the_parent_is_killed():
    pid = await _orphan_after_parent_killed("from common.children import die_with_parent; die_with_parent(int(sys.argv[1]))")
    await eventually(lambda: not _alive(pid), timeout_s=10)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
async def test_without_it_the_child_outlives_its_killed_parent():
    """The control: what every solver, cell and job process did before it asked."""
    pid = await _orphan_after_parent_killed("")
    try:
        assert _alive(pid)
    finally:
        os.kill(pid, signal.SIGKILL)
