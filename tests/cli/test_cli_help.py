"""Every command's one-line help (what `gavel --help` and each group's --help list) says what the
command does, in plain words: it starts with what it does (a verb), and uses none of the words a
new user could not read (issue 23: "summarise" for `trace show`, "attained service", "LAS")."""

from __future__ import annotations

import argparse
import re

from services.cli import build_parser

# The verbs the helps start with: a new command's help that starts otherwise (a noun phrase, "the
# registered workers") fails here, and its author either rewrites it or adds a verb.
VERBS = {
    "cancel", "check", "compute", "connect", "describe", "exit", "list", "make", "replay", "rewrite", "run", "show",
    "simulate", "submit", "take", "write",
}
JARGON = ("summarise", "attained service", "las", "jct", "effective settings", "topology", "healthchecks")


def one_line_helps(parser: argparse.ArgumentParser, prefix: str = "gavel") -> dict[str, str]:
    """Command path -> its one-line help, for every command and sub-command."""
    helps: dict[str, str] = {}
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        by_name = {choice.dest: choice.help for choice in action._choices_actions}
        for name, sub in action.choices.items():
            helps[f"{prefix} {name}"] = by_name.get(name) or ""
            helps.update(one_line_helps(sub, f"{prefix} {name}"))
    return helps


def jargon_in(text: str) -> list[str]:
    words = re.findall(r"[a-z0-9-]+", text.lower())
    return [j for j in JARGON if (j in " ".join(words) if " " in j else j in words)]


def test_every_command_says_what_it_does_in_plain_words():
    helps = one_line_helps(build_parser())
    assert {"gavel trace show", "gavel jobs", "gavel serve worker", "gavel bus dead-letters"} <= set(helps)
    starts = {command: (re.findall(r"[a-z]+", text.lower()) or [""])[0] for command, text in helps.items()}
    assert {c: s for c, s in starts.items() if s not in VERBS} == {}
    assert {c: jargon_in(t) for c, t in helps.items() if jargon_in(t)} == {}


def test_an_argument_no_command_takes_points_to_that_commands_help(capsys):
    """Issue 23: `gavel jobs --state running` said "(see gavel --help)"."""
    import pytest

    from services.cli import main

    for argv, prog in ((["jobs", "--state", "running"], "gavel jobs"), (["serve", "policy", "--bogus"], "gavel serve policy")):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 2
        said = capsys.readouterr().err.strip()
        assert said == f"{prog}: unrecognized arguments: {' '.join(argv[len(prog.split()) - 1:])} (see {prog} --help)"
