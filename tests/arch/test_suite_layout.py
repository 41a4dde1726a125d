"""Where tests live and what they may do to the suite (tests/README.md), over the test sources'
AST: the `gavel` command's tests are in tests/cli; a test that stops the shared broker (`serial`)
is in tests/e2e, where `make test` runs those alone; no module skips itself for a missing
package (the dev extra installs them, and the Makefile checks: a skip would hide its tests)."""

from __future__ import annotations

import ast
import functools
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


@functools.cache  # parsed once for the rules below
def sources() -> list[tuple[str, frozenset[str]]]:
    """Each test source file and the dotted names it uses (`pytest.mark.serial`, ...)."""
    return [(str(p.relative_to(ROOT)), names(ast.parse(p.read_text(), filename=str(p)))) for p in sorted(TESTS.rglob("*.py"))]


def attribute_chain(node: ast.AST) -> str:
    """`pytest.mark.serial` for that expression ("" when it is not a dotted name)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def names(tree: ast.Module) -> frozenset[str]:
    return frozenset(attribute_chain(node) for node in ast.walk(tree) if isinstance(node, ast.Attribute))


def test_the_gavel_commands_tests_are_in_tests_cli() -> None:
    elsewhere = [str(p.relative_to(ROOT)) for p in TESTS.rglob("test_cli*.py") if p.parent.name != "cli"]
    assert not elsewhere, f"move these to tests/cli: {elsewhere}"


def test_only_e2e_tests_stop_the_shared_broker() -> None:
    marked = [path for path, used in sources() if "pytest.mark.serial" in used]
    assert marked and all(path.startswith("tests/e2e/") for path in marked), marked


def test_no_test_module_skips_itself_for_a_missing_package() -> None:
    skipping = [path for path, used in sources() if "pytest.importorskip" in used]
    assert not skipping, f"import the package plainly (add it to the dev extra and the Makefile's check): {skipping}"


def test_the_rules_above_see_what_they_look_for() -> None:
    used = names(ast.parse("import pytest\npytestmark = pytest.mark.serial\nyaml = pytest.importorskip('yaml')\n"))
    assert {"pytest.mark.serial", "pytest.importorskip"} <= used
    assert "pytest.mark.serial" not in names(ast.parse("serial = 1\n"))
