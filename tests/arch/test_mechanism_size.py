"""The mechanism stays a few small collaborators (issue 24): no module of mechanism_service over
450 lines, and the service class, which only starts its collaborators and routes messages, under
300. A module that outgrows this has two reasons to change: split it by concern."""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).parents[2] / "mechanism_service"
MAX_MODULE_LINES = 450
MAX_SERVICE_CLASS_LINES = 300


def test_no_module_of_the_mechanism_is_over_450_lines() -> None:
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert len(sizes) > 20
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_the_service_class_is_under_300_lines() -> None:
    tree = ast.parse((PACKAGE / "service.py").read_text())
    (service,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "MechanismService"]
    assert service.end_lineno is not None
    assert service.end_lineno - service.lineno + 1 < MAX_SERVICE_CLASS_LINES
