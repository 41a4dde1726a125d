"""The `gavel` command as a user runs it: a real process, outside any cluster's environment."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.processes import ROOT


def gavel(*args: str, env: dict[str, str] | None = None, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """`gavel ARGS` in a process of its own, with none of this process's GAVEL_* settings (only
    ``env``'s): what it prints and its exit code."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GAVEL_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=ROOT,
        timeout=timeout_s,
    )
