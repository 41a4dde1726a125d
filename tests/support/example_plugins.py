"""The example plug-in package (examples/gavel-example-plugins) installed for a test, and broken
plug-ins beside it.

``install_example(dir)`` runs ``pip install --no-deps --target dir`` on a copy of the package (the
build leaves its ``build/`` and ``*.egg-info`` in the copy, not in the repository): the project's
venv is not changed, and a process with ``dir`` on its path (sys.path, PYTHONPATH) finds the
package's entry points as an installed distribution's. About 1.5 s; ``example_site`` does it once
per test session (per xdist worker) for every module that needs it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "gavel-example-plugins"
MODULE = "gavel_example_plugins"
POLICY_ENTRY_POINT = "weighted_share"
POLICY_REFERENCE = "gavel_example_plugins.policies:WeightedShare"

# Broken plug-ins, each a way a plug-in fails: written as modules beside the installed package.
BROKEN_MODULES = {
    "plugb_broken_import": "import plugb_no_such_dependency  # the plug-in's own dependency is missing\n",
    "plugb_broken_policies": '''
"""Plug-ins that load and then fail, or do not load."""
import os

from gavel_example_plugins.policies import WeightedShare


class WrongSignature:
    name = "wrong_signature"

    def allocate(self):  # takes no problem
        raise AssertionError("never called")


class RaisesOnSecondJob:
    """Answers while there is one job, raises once there are more: the mechanism has a good
    allocation to keep when the failures begin."""

    name = "raises_on_second_job"

    def allocate(self, problem):
        if problem.num_jobs > 1:
            raise RuntimeError(f"cannot share between {problem.num_jobs} jobs")
        return WeightedShare(self.name).allocate(problem)


class Exits:
    """Calls sys.exit() in allocate: a plug-in's bug, which must cost one answer, not the service."""

    name = "exits"

    def allocate(self, problem):
        import sys

        sys.exit("giving up")


class Oversubscribes:
    """An answer that is not an allocation: every job all of every type's time."""

    name = "oversubscribes"

    def allocate(self, problem):
        import dataclasses
        import numpy as np

        good = WeightedShare(self.name).allocate(problem)
        return dataclasses.replace(good, job_fractions=np.ones((problem.num_jobs, problem.num_types)))


def factory_that_raises():
    raise ValueError("no configuration file")
''',
}


def example_site(tmp_path_factory) -> Path:
    """The example package installed once per session, under the session's temporary directory."""
    target = tmp_path_factory.getbasetemp() / "gavel-example-plugins" / "site"
    if not (target / MODULE).is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
        install_example(target)
    return target


def install_example(target: Path) -> Path:
    """The example package installed into ``target`` (with the broken modules beside it)."""
    source = target.parent / f"{target.name}-source"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-compile",
         "--disable-pip-version-check", "--target", str(target), str(source)],
        check=True, capture_output=True, timeout=120,
    )
    for name, text in BROKEN_MODULES.items():
        (target / f"{name}.py").write_text(text)
    return target
