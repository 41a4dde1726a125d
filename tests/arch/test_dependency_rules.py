"""The dependency rule of docs/ARCHITECTURE.md, enforced over every import statement (top level and
inside functions) by walking the AST of each module."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROJECT = ("common", "services", "policy_service", "mechanism_service", "estimator_service", "worker_service", "sim")
SERVICE_PACKAGES = ("policy_service", "mechanism_service", "estimator_service", "worker_service")
COMPOSITION_ROOTS = ("services.cli", "sim")  # may wire service packages together
RUNTIME = ("asyncio", "aio_pika", "aiormq", "services")


def modules() -> list[tuple[str, pathlib.Path]]:
    out = []
    for package in PROJECT:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out.append((".".join(parts), path))
    return out


def imports_of(module: str, path: pathlib.Path) -> set[str]:
    found: set[str] = set()
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: resolve against the package
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                found.add(".".join([*base, node.module] if node.module else base))
            elif node.module:
                found.add(node.module)
    return found


def top(name: str) -> str:
    return name.split(".")[0]


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


MODULES = modules()


def test_the_walk_sees_the_project():
    names = {m for m, _ in MODULES}
    assert {"common.codec", "services.bus.rabbit", "services.host"} <= names


def violations(module: str, path: pathlib.Path) -> list[str]:
    imported = imports_of(module, path)
    project_imports = {name for name in imported if top(name) in PROJECT}
    problems = []

    # Nothing imports the simulator except itself, tests, and the command line (both are
    # composition roots: `gavel simulate` runs it).
    problems += [
        f"imports {n}: nothing may import sim"
        for n in project_imports
        if top(n) == "sim" and top(module) != "sim" and not within(module, "services.cli")
    ]

    if top(module) == "common":
        problems += [f"imports {n}: common imports nothing of the project" for n in project_imports if top(n) != "common"]

    if top(module) == "services" and not any(within(module, root) for root in COMPOSITION_ROOTS):
        problems += [
            f"imports {n}: services (outside services.cli) imports only common and services"
            for n in project_imports
            if top(n) not in ("common", "services")
        ]

    if top(module) in SERVICE_PACKAGES:
        problems += [
            f"imports {n}: a service package never imports another (they meet through messages)"
            for n in project_imports
            if top(n) in SERVICE_PACKAGES and top(n) != top(module)
        ]

    if ".core" in module or module.endswith(".core"):
        problems += [
            f"imports {n}: a pure core never imports the runtime" for n in imported if top(n) in RUNTIME or within(n, "services")
        ]

    if top(module) != "worker_service":
        problems += [f"imports {n}: only worker code imports torch" for n in imported if top(n) == "torch"]

    return sorted(problems)


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[m for m, _ in MODULES])
def test_dependency_rule(module: str, path: pathlib.Path):
    problems = violations(module, path)
    assert not problems, f"{module}: " + "; ".join(problems)


def test_the_rule_catches_violations(tmp_path):
    """The checker itself, on modules written to break each rule (imports inside functions too)."""
    core = tmp_path / "core_mod.py"
    core.write_text("import asyncio\ndef f():\n    from estimator_service.core import x\n    import torch\n")
    assert violations("policy_service.core.bad", core) == [
        "imports asyncio: a pure core never imports the runtime",
        "imports estimator_service.core: a service package never imports another (they meet through messages)",
        "imports torch: only worker code imports torch",
    ]
    kernel = tmp_path / "kernel.py"
    kernel.write_text("from services.bus import make_bus\n")
    assert violations("common.kernel", kernel) == ["imports services.bus: common imports nothing of the project"]
    shell = tmp_path / "shell.py"
    shell.write_text("from sim import driver\nfrom . import rabbit\n")
    assert imports_of("services.bus.shell", shell) == {"sim", "services.bus"}
    assert violations("services.bus.shell", shell) == [
        "imports sim: nothing may import sim",
        "imports sim: services (outside services.cli) imports only common and services",
    ]
