"""scipy.sparse, imported on first use: ``from policy_service.core.sparse import sp``.

The policy library builds sparse matrices for its cvxpy programs, its packed formulations and
column generation, and imported scipy.sparse at the top of eight modules; so every command
that loads the library paid for it (~0.15-0.25 s with the parts of numpy it pulls in), the
simulator's default runs too, whose max-min programs go to CLARABEL as plain arrays
(compiled.py) and never build a sparse matrix. ``sp.name`` imports scipy.sparse the first time
it is read, then reads ``scipy.sparse.name``: the same objects, a module lookup later
(tests/unit/policy/test_solving_imports.py holds the simulator's path to not importing it).
"""

from __future__ import annotations

import importlib
from types import ModuleType


class _OnFirstUse:
    """Stands for a module; imports it when one of its attributes is first read."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> object:
        module: ModuleType = importlib.import_module(self._name)
        return getattr(module, attribute)


sp = _OnFirstUse("scipy.sparse")
