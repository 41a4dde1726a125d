"""Where tests live and what they may do to the suite (tests/README.md), over the test sources'
AST: the `gavel` command's tests are in tests/cli; no test stops the shared broker (a test that
restarts its broker restarts a node of its own, tests/support/rabbit_node.py, so that every test
can run beside the others); no module skips itself for a missing package (the dev extra installs
them, and the Makefile checks: a skip would hide its tests)."""

from __future__ import annotations

import ast
import functools
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


@functools.cache  # parsed once for the rules below
def sources() -> list[tuple[str, frozenset[str]]]:
    """Each test source file but this one (whose rules name what they look for) and the dotted
    names and strings it uses (`pytest.importorskip`, "stop_app", ...)."""
    here = pathlib.Path(__file__).resolve()
    return [
        (str(p.relative_to(ROOT)), names(ast.parse(p.read_text(), filename=str(p))))
        for p in sorted(TESTS.rglob("*.py")) if p.resolve() != here
    ]


def attribute_chain(node: ast.AST) -> str:
    """`pytest.mark.slow` for that expression ("" when it is not a dotted name)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def names(tree: ast.Module) -> frozenset[str]:
    chains = (attribute_chain(node) for node in ast.walk(tree) if isinstance(node, ast.Attribute))
    strings = (node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str))
    return frozenset((*chains, *strings))


# rabbitmqctl commands that take a node's broker away from everyone connected to it
STOPPING = frozenset({"stop_app", "stop", "shutdown", "reset", "force_reset"})
OWN_NODE = "tests/support/rabbit_node.py"  # its rabbitmqctl always names its own node (-n)


def test_the_gavel_commands_tests_are_in_tests_cli() -> None:
    elsewhere = [str(p.relative_to(ROOT)) for p in TESTS.rglob("test_cli*.py") if p.parent.name != "cli"]
    assert not elsewhere, f"move these to tests/cli: {elsewhere}"


def test_no_test_stops_the_shared_broker() -> None:
    stopping = [path for path, used in sources() if "rabbitmqctl" in used and used & STOPPING]
    assert stopping == [OWN_NODE], f"restart a node of the test's own ({OWN_NODE}), not the shared broker: {stopping}"


def test_no_test_module_skips_itself_for_a_missing_package() -> None:
    skipping = [path for path, used in sources() if "pytest.importorskip" in used]
    assert not skipping, f"import the package plainly (add it to the dev extra and the Makefile's check): {skipping}"


def test_the_rules_above_see_what_they_look_for() -> None:
    used = names(ast.parse("import pytest\nyaml = pytest.importorskip('yaml')\nrun(['rabbitmqctl', 'stop_app'])\n"))
    assert {"pytest.importorskip", "rabbitmqctl", "stop_app"} <= used
    assert "pytest.importorskip" not in names(ast.parse("importorskip = 1\n"))


@pytest.mark.xdist_group("suite-layout")
def test_an_xdist_group_reaches_the_scheduler(request: pytest.FixtureRequest) -> None:
    """Tests marked `xdist_group` share one worker (and so its module fixtures: a demo run, a
    compose stack) only while pytest-xdist can add the group to their node ids. pytest 9.2 stopped
    that without a word (every such fixture was made once per worker); pyproject.toml keeps pytest
    below it. Under `make test` (--dist loadgroup) this fails if the group is lost again."""
    if getattr(request.config.option, "loadgroup", False):
        assert request.node.nodeid.endswith("@suite-layout"), request.node.nodeid
