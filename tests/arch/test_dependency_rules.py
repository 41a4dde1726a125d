"""The dependency rule of docs/ARCHITECTURE.md, enforced over every import statement (top level and
inside functions) by walking the AST of each module.

The rule: **imports point down the layers, never up or sideways.**

    common  <  policy_service, mechanism_service, estimator_service, worker_service  <  sim  <  services  <  bench

common holds the contracts and the runtime every service shares (messages, codec, bus, transports,
host, journal, logging); each service package imports common and itself (services meet through
messages, never through each other's code); the simulator assembles services; `services` is the
application (the command line and the process entry points) and may use everything below it; the
benchmarks sit on top. Within that: a pure core (`*.core`) never imports the runtime, and only
worker code imports torch.
"""

from __future__ import annotations

import ast
import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAYERS = {
    "common": 0,
    "policy_service": 1,
    "mechanism_service": 1,
    "estimator_service": 1,
    "worker_service": 1,
    "sim": 2,
    "services": 3,
    "bench": 4,
}
PROJECT = tuple(LAYERS)
# What a pure core may not import: the event loop, the broker client and the shared runtime.
RUNTIME = ("asyncio", "aio_pika", "aiormq", "common.transport", "common.host", "common.journal", "common.log")


def modules(root: pathlib.Path = ROOT) -> list[tuple[str, pathlib.Path]]:
    out = []
    for package in PROJECT:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
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


def test_the_walk_sees_every_layer():
    names = {m for m, _ in MODULES}
    assert {"common.codec", "common.transport.rabbit", "common.host", "sim.driver", "services.cli"} <= names
    assert {top(m) for m in names} == set(LAYERS)


def violations(module: str, path: pathlib.Path) -> list[str]:
    imported = imports_of(module, path)
    layer = LAYERS[top(module)]
    problems = []
    for name in sorted(n for n in imported if top(n) in LAYERS and top(n) != top(module)):
        other = LAYERS[top(name)]
        if other > layer:
            problems.append(f"imports {name}: {top(name)} is above {top(module)} (imports point down)")
        elif other == layer:
            problems.append(f"imports {name}: {top(name)} is beside {top(module)} (they meet through messages)")
    if ".core" in module or module.endswith(".core"):
        problems += [f"imports {n}: a pure core never imports the runtime" for n in sorted(imported) if any(within(n, r) for r in RUNTIME)]
    if top(module) != "worker_service":
        problems += [f"imports {n}: only worker code imports torch" for n in sorted(imported) if top(n) == "torch"]
    return problems


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[m for m, _ in MODULES])
def test_dependency_rule(module: str, path: pathlib.Path):
    problems = violations(module, path)
    assert not problems, f"{module}: " + "; ".join(problems)


def test_the_rule_refuses_an_upward_import_planted_in_the_tree(tmp_path):
    """A module planted in a copy of a real package that imports upward (inside a function, as
    lazy imports are) is found by the walk and refused; so is one that imports sideways or breaks
    the core rules. (The copy, not the tree itself: other test processes walk the tree meanwhile.)"""
    shutil.copytree(ROOT / "mechanism_service", tmp_path / "mechanism_service", ignore=shutil.ignore_patterns("__pycache__"))
    planted = tmp_path / "mechanism_service" / "core" / "planted.py"
    planted.write_text("def f():\n    from services.cli import main\n    from sim import driver\n")
    walked = dict(modules(tmp_path))
    assert len(walked) == sum(1 for m, _ in MODULES if top(m) == "mechanism_service") + 1
    assert violations("mechanism_service.core.planted", walked["mechanism_service.core.planted"]) == [
        "imports services.cli: services is above mechanism_service (imports point down)",
        "imports sim: sim is above mechanism_service (imports point down)",
    ]
    assert [m for m, p in walked.items() if violations(m, p)] == ["mechanism_service.core.planted"]
    core = tmp_path / "core_mod.py"
    core.write_text("import asyncio\ndef f():\n    from estimator_service.core import x\n    import torch\n    from common.journal import Journal\n")
    assert violations("policy_service.core.bad", core) == [
        "imports estimator_service.core: estimator_service is beside policy_service (they meet through messages)",
        "imports asyncio: a pure core never imports the runtime",
        "imports common.journal: a pure core never imports the runtime",
        "imports torch: only worker code imports torch",
    ]
    kernel = tmp_path / "kernel.py"
    kernel.write_text("from common.transport import make_bus\nfrom policy_service import answer\n")
    assert violations("common.kernel", kernel) == ["imports policy_service: policy_service is above common (imports point down)"]
    shell = tmp_path / "shell.py"
    shell.write_text("from services.cli import simulate_cmd\nfrom . import rabbit\n")
    assert imports_of("sim.shell", shell) == {"services.cli", "sim"}
    assert violations("sim.shell", shell) == ["imports services.cli: services is above sim (imports point down)"]
    bench = tmp_path / "bench_mod.py"
    bench.write_text("from services.cli import main\nfrom sim import driver\n")
    assert violations("bench.bench_mod", bench) == []  # the top may use everything
