"""common/plugins.py: a spec resolved as a built-in, an installed entry point or module:Name, and
every way it can fail refused with one line naming the kind and the plug-in.

Entry points are made real: a ``*.dist-info`` directory with an ``entry_points.txt`` on sys.path is
what an installed distribution is to importlib.metadata.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from common.errors import GavelError, PluginError
from common.plugins import (
    KINDS,
    check_callable,
    check_method,
    installed,
    is_builtin_or_installed,
    resolve,
)

MODULE = """
class Good:
    name = "good"

    def allocate(self, problem):
        return problem

class TooMany:
    def allocate(self, problem, extra):
        return problem

class Flexible:
    def allocate(self, *args, **kwargs):
        return args

class StaticOne:
    @staticmethod
    def allocate(problem):
        return problem

class Outer:
    class Inner:
        pass

def factory():
    return Good()

def needs_argument(x):
    return x

NOT_CALLABLE = 3
"""


@pytest.fixture
def plugin_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory on sys.path holding modules and a distribution's entry points."""
    (tmp_path / "plugtest_mod.py").write_text(MODULE)
    (tmp_path / "plugtest_broken.py").write_text("import plugtest_no_such_module_anywhere\n")
    (tmp_path / "plugtest_raises.py").write_text("raise RuntimeError('top-level boom\\nsecond line')\n")
    dist = tmp_path / "plugtest_dist-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: plugtest-dist\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(textwrap.dedent("""
        [gavel.policies]
        good = plugtest_mod:Good
        broken = plugtest_broken:Anything
        missing = plugtest_mod:NoSuchThing
        fifo = plugtest_mod:Good

        [gavel.placement]
        spread_ep = plugtest_mod:factory
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


BUILTINS = {"fifo": "the built-in fifo", "las": "the built-in las"}


def test_a_builtin_comes_first_even_over_an_entry_point_of_its_name(plugin_path: Path) -> None:
    assert resolve("policy", "fifo", BUILTINS) == "the built-in fifo"
    assert resolve("policy", " las ", BUILTINS) == "the built-in las"


def test_an_installed_entry_point_is_found_by_name_in_its_kinds_group(plugin_path: Path) -> None:
    good = resolve("policy", "good", BUILTINS)
    assert isinstance(good, type) and good.__name__ == "Good" and good.__module__ == "plugtest_mod"
    factory = resolve("placement", "spread_ep", {})
    assert callable(factory) and factory.__name__ == "factory"
    # Another kind's group is not searched: spread_ep is a placement, not a policy.
    with pytest.raises(PluginError, match="unknown"):
        resolve("policy", "spread_ep", BUILTINS)
    assert {"good", "broken", "missing", "fifo"} <= set(installed("policy"))
    assert is_builtin_or_installed("policy", "good", BUILTINS)
    assert not is_builtin_or_installed("policy", "plugtest_mod:Good", BUILTINS)


def test_module_colon_name_imports_the_module_and_takes_the_attribute(plugin_path: Path) -> None:
    good = resolve("admission", "plugtest_mod:Good", {})
    assert good.__name__ == "Good"
    inner = resolve("policy", "plugtest_mod:Outer.Inner", BUILTINS)
    assert inner.__qualname__ == "Outer.Inner"


def test_an_unknown_name_lists_the_builtins_and_the_installed(plugin_path: Path) -> None:
    with pytest.raises(PluginError) as caught:
        resolve("policy", "nope", BUILTINS)
    message = str(caught.value)
    assert message.startswith("policy plug-in 'nope': unknown; built-in: fifo, las; installed (gavel.policies): ")
    assert "broken, fifo, good, missing" in message
    assert "\n" not in message
    assert isinstance(caught.value, GavelError)
    assert (caught.value.kind, caught.value.spec) == ("policy", "nope")


def test_an_import_error_names_the_module_and_the_exception(plugin_path: Path) -> None:
    with pytest.raises(PluginError) as caught:
        resolve("policy", "plugtest_broken:Anything", BUILTINS)
    assert str(caught.value) == (
        "policy plug-in 'plugtest_broken:Anything': module 'plugtest_broken' does not import: "
        "ModuleNotFoundError: No module named 'plugtest_no_such_module_anywhere'"
    )
    with pytest.raises(PluginError, match=r"does not import: RuntimeError: top-level boom$"):
        resolve("policy", "plugtest_raises:X", BUILTINS)
    with pytest.raises(PluginError, match="module 'plugtest_nowhere' does not import: ModuleNotFoundError"):
        resolve("placement", "plugtest_nowhere:X", {})


def test_an_entry_point_that_fails_to_load_names_its_target(plugin_path: Path) -> None:
    with pytest.raises(PluginError, match=r"^policy plug-in 'broken': entry point 'plugtest_broken:Anything' does not import: ModuleNotFoundError"):
        resolve("policy", "broken", BUILTINS)
    with pytest.raises(PluginError, match=r"^policy plug-in 'missing': entry point 'plugtest_mod:NoSuchThing': AttributeError"):
        resolve("policy", "missing", BUILTINS)


def test_a_missing_attribute_or_a_half_reference_is_refused(plugin_path: Path) -> None:
    with pytest.raises(PluginError, match="^policy plug-in 'plugtest_mod:Nope': module 'plugtest_mod' has no attribute 'Nope'$"):
        resolve("policy", "plugtest_mod:Nope", BUILTINS)
    with pytest.raises(PluginError, match="both parts"):
        resolve("policy", "plugtest_mod:", BUILTINS)
    with pytest.raises(PluginError, match="both parts"):
        resolve("policy", ":Good", BUILTINS)
    with pytest.raises(PluginError, match="an empty name"):
        resolve("policy", "  ", BUILTINS)


def test_an_unknown_kind_is_refused() -> None:
    assert set(KINDS) == {"policy", "placement", "admission", "launch"}
    with pytest.raises(PluginError, match=r"no such kind of plug-in \(kinds: policy, placement, admission, launch\)"):
        resolve("scheduler", "x", {})


def test_check_method_takes_what_will_be_passed(plugin_path: Path) -> None:
    module = __import__("plugtest_mod")
    check_method("policy", "s", module.Good(), "allocate", args=("problem",))
    check_method("policy", "s", module.Good, "allocate", args=("problem",))  # on the class: self too
    check_method("policy", "s", module.Flexible(), "allocate", args=("problem",))
    check_method("policy", "s", module.StaticOne, "allocate", args=("problem",))
    with pytest.raises(PluginError) as caught:
        check_method("policy", "plugtest_mod:TooMany", module.TooMany(), "allocate", args=("problem",))
    assert str(caught.value) == (
        "policy plug-in 'plugtest_mod:TooMany': allocate(problem, extra) cannot be called as "
        "allocate(problem): missing a required argument: 'extra'"
    )
    with pytest.raises(PluginError, match=r"allocate\(self, problem, extra\) cannot be called as allocate\(self, problem\)"):
        check_method("policy", "s", module.TooMany, "allocate", args=("problem",))
    with pytest.raises(PluginError, match=r"^policy plug-in 's': has no method place\(jobs, servers\)$"):
        check_method("policy", "s", module.Good(), "place", args=("jobs", "servers"))
    with pytest.raises(PluginError, match="its name is not callable"):
        check_method("policy", "s", module.Good(), "name", args=())


def test_check_callable_refuses_what_cannot_be_called_so(plugin_path: Path) -> None:
    module = __import__("plugtest_mod")
    check_callable("policy", "s", module.factory)
    check_callable("policy", "s", module.Good)
    with pytest.raises(PluginError, match=r"^policy plug-in 's': the factory is not callable \(a int\)$"):
        check_callable("policy", "s", module.NOT_CALLABLE, what="the factory")
    with pytest.raises(PluginError, match=r"^policy plug-in 's': the factory takes \(x\), not \(\): missing a required argument: 'x'$"):
        check_callable("policy", "s", module.needs_argument, what="the factory")
    check_callable("policy", "s", module.needs_argument, args=("x",))


def test_a_plugin_error_survives_pickling() -> None:
    import pickle

    error = pickle.loads(pickle.dumps(PluginError("policy", "a:b", "went wrong")))
    assert (str(error), error.kind, error.spec, error.reason) == ("policy plug-in 'a:b': went wrong", "policy", "a:b", "went wrong")
