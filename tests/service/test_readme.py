"""The README says what the code does (issue 9: its services block asked for `gavel job 7`, an id
that no longer exists once a trace's ids get a prefix, and its settings table lacked variables the
services read)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from tests.deploy.test_compose import parse_gavel

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def readme_commands() -> list[list[str]]:
    """Every `gavel ...` in the README's shell blocks (several on a line split at `;`)."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", README, re.S):
        for raw in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = raw.split(" #", 1)[0].strip().rstrip("&").strip()
            for part in line.split(";"):
                words = shlex.split(part)
                if words[:1] == ["gavel"]:
                    commands.append(words[1:])
    return commands


def test_every_gavel_command_in_the_readme_parses() -> None:
    assert len(readme_commands()) >= 10
    for argv in readme_commands():
        parse_gavel(argv)  # an AssertionError names the command argparse refuses


def test_the_readme_asks_only_for_jobs_it_submitted() -> None:
    """`gavel job ID` / `gavel cancel ID` name an id the same block gave with --job-id."""
    for block in re.findall(r"```sh\n(.*?)```", README, re.S):
        given = set(re.findall(r"--job-id (\S+)", block))
        asked = re.findall(r"gavel (?:job|cancel) (\S+?)(?:;|\s|$)", block)
        assert set(asked) <= given, (asked, given)


def test_the_settings_table_lists_every_variable_the_settings_read() -> None:
    read = set(re.findall(r'"((?:GAVEL|XDG)_[A-Z0-9_]+)"', (ROOT / "common" / "config.py").read_text()))
    table = set(re.findall(r"^\| `((?:GAVEL|XDG)_[A-Z0-9_]+)`", README, re.M))
    listed_together = set(re.findall(r"`(GAVEL_[A-Z_]+)`, `GAVEL_", README))  # "GAVEL_LOG_LEVEL, GAVEL_LOG_FORMAT"
    listed_together |= set(re.findall(r"`GAVEL_[A-Z_]+`, `(GAVEL_[A-Z_]+)`", README))
    assert read and read <= table | listed_together, sorted(read - table - listed_together)
