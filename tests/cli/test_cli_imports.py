"""Every `gavel` command imports only what it uses (issue 12, item 4): `--version`, every
`--help`, the status commands and `gavel submit`/`cancel` never load the solver (cvxpy, scipy),
plotting (matplotlib) or torch stacks. Asserted on what gets imported, not on time (the time is
bench/cli_start.py's).

One fresh interpreter runs every case in turn and records, after each, which of those stacks
have appeared in sys.modules: a case that loads one is named, and nothing earlier can hide it (a
module, once imported, stays). About 1 s a test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from services.cli import COMMAND_MODULE

HEAVY = ("cvxpy", "scipy", "matplotlib", "torch")
NO_BROKER = "amqp://guest:guest@127.0.0.1:1/"  # a closed port: the command runs, then fails to connect

CHILD = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from services.cli import main
    heavy, cases = json.loads(sys.argv[1])
    loaded = {}
    for argv in cases:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as e:  # --help and --version exit from the parser
                code = e.code
        loaded[" ".join(argv)] = {"code": code, "heavy": sorted(m for m in heavy if m in sys.modules)}
    print(json.dumps(loaded))
    """
)


def imports_after(cases: list[list[str]], watched: tuple[str, ...] = HEAVY) -> dict[str, dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps([watched, cases])], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_version_help_status_and_submit_never_load_the_solver_plotting_or_torch():
    running = [
        ["jobs", "--amqp", NO_BROKER, "--timeout-s", "1"],
        ["job", "j1", "--amqp", NO_BROKER, "--timeout-s", "1"],
        ["workers", "--amqp", NO_BROKER, "--timeout-s", "1"],
        ["cluster", "--amqp", NO_BROKER, "--timeout-s", "1"],
        ["events", "--amqp", NO_BROKER, "--timeout-s", "1"],
        ["top", "--once", "--amqp", NO_BROKER, "--timeout-s", "1"],
        ["submit", "--job-type", "ResNet-50 (batch size 64)", "--steps", "100", "--amqp", NO_BROKER],
        ["cancel", "j1", "--amqp", NO_BROKER],
    ]
    helps = [["--version"], ["--help"], *([command, "--help"] for command in COMMAND_MODULE), ["policy", "solve", "--help"]]
    loaded = imports_after(helps + running)

    assert {case: seen["heavy"] for case, seen in loaded.items() if seen["heavy"]} == {}
    # and each case did run: help and version exit 0, the commands fail for the closed port (1)
    assert {case: seen["code"] for case, seen in loaded.items()} == {
        **{" ".join(argv): 0 for argv in helps},
        **{" ".join(argv): 1 for argv in running},
    }


def test_the_check_sees_a_module_arrive():
    """The same harness watching numpy, which `gavel trace` imports at its top (cheaper to load
    than the solver): it must see numpy arrive with that command and not before, or the test above
    could pass by looking at nothing."""
    loaded = imports_after([["--version"], ["jobs", "--help"], ["trace", "--help"]], watched=("numpy",))

    assert [seen["heavy"] for seen in loaded.values()] == [[], [], ["numpy"]]
