"""The one loader of plug-ins: policies, placement strategies, admission policies and launch
strategies found by name.

A spec names a plug-in in one of three ways, tried in this order:

1. a built-in name (looked up in the ``builtins`` mapping the caller passes);
2. the name of an installed entry point in the kind's group (``KINDS``), so a package that
   declares ``[project.entry-points."gavel.policies"] weighted = "mypkg.policies:Weighted"`` is
   found by ``weighted`` once it is installed: no fork, no edit of the registry;
3. ``package.module:Name`` (``Name`` may be dotted: ``mod:Outer.inner``), imported directly.

A built-in shadows an entry point of the same name: a name that means one thing in this project
cannot be taken over by whatever happens to be installed. Every failure is one ``PluginError``
whose message names the kind and the spec and says in one line what went wrong (an unknown name,
with what is known; a module that does not import, with the exception's first line; a missing
attribute; a method whose signature cannot take the arguments it will be called with), so a bad
plug-in is refused when it is loaded, not at the first round it is used.

Pure apart from the imports a spec asks for: nothing here is cached, logged or registered.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import TypeVar

from common.errors import PluginError

T = TypeVar("T")

# What a call into a plug-in may raise that is the plug-in's fault: any exception, and SystemExit
# (a plug-in that calls sys.exit() must cost its one answer, not stop the service that called it).
# Not KeyboardInterrupt: that is the operator's.
PLUGIN_FAULTS: tuple[type[BaseException], ...] = (Exception, SystemExit)

# The kinds of plug-in and the entry-point group each is looked up in.
KINDS: Mapping[str, str] = {
    "policy": "gavel.policies", "placement": "gavel.placement", "admission": "gavel.admission", "launch": "gavel.launch",
}


def resolve(kind: str, spec: str, builtins: Mapping[str, T]) -> T | object:
    """What ``spec`` names: the built-in, else the entry point's object, else ``module:Name``'s.

    Raises PluginError (unknown kind or name, import error, missing attribute)."""
    group = _group(kind)
    spec = spec.strip()
    if not spec:
        raise PluginError(kind, spec, "an empty name")
    if spec in builtins:
        return builtins[spec]
    points = installed(kind)
    if spec in points:
        return _load_entry_point(kind, spec, points[spec])
    if ":" in spec:
        return _load_reference(kind, spec)
    raise PluginError(
        kind, spec,
        f"unknown; built-in: {', '.join(sorted(builtins)) or 'none'}; "
        f"installed ({group}): {', '.join(sorted(points)) or 'none'}; or give package.module:Name",
    )


def installed(kind: str) -> dict[str, EntryPoint]:
    """The installed entry points of ``kind``'s group, by name (the first of a name wins, as
    importlib.metadata lists distributions in sys.path order)."""
    points: dict[str, EntryPoint] = {}
    for point in entry_points(group=_group(kind)):
        points.setdefault(point.name, point)
    return points


def is_builtin_or_installed(kind: str, spec: str, builtins: Mapping[str, object]) -> bool:
    """Whether ``spec`` is a name this process knows without importing a module by path."""
    return spec in builtins or spec in installed(kind)


def check_callable(kind: str, spec: str, function: object, *, args: Sequence[str] = (), what: str = "") -> None:
    """Refuse ``function`` unless it can be called with the positional arguments named in ``args``
    (their names only say what they are in the message). ``what`` names it in the message."""
    label = what or "it"
    if not callable(function):
        raise PluginError(kind, spec, f"{label} is not callable (a {type(function).__name__})")
    _check_binds(kind, spec, function, len(args), label, args)


def check_method(kind: str, spec: str, obj: object, method: str, *, args: Sequence[str]) -> None:
    """Refuse ``obj`` unless ``obj.method`` exists and can be called with ``args`` (names, for the
    message). ``obj`` may be an instance or a class (then a plain function takes ``self`` too)."""
    if not hasattr(obj, method):
        raise PluginError(kind, spec, f"has no method {method}({', '.join(args)})")
    bound = getattr(obj, method)
    if not callable(bound):
        raise PluginError(kind, spec, f"its {method} is not callable (a {type(bound).__name__})")
    extra = 0
    if inspect.isclass(obj) and inspect.isfunction(inspect.getattr_static(obj, method)):
        extra = 1  # a plain function looked up on the class: self comes first
    _check_binds(kind, spec, bound, len(args) + extra, f"{method}", ("self",) * extra + tuple(args))


def _check_binds(kind: str, spec: str, function: Callable[..., object], count: int, label: str, names: Sequence[str]) -> None:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return  # a builtin without a signature: nothing to check, the call will tell
    try:
        signature.bind(*([None] * count))
    except TypeError as error:
        if label.isidentifier():  # a method: allocate(problem, extra) cannot be called as allocate(problem)
            wrong = f"{label}{signature} cannot be called as {label}({', '.join(names)})"
        else:  # "its factory" takes (x), not ()
            wrong = f"{label} takes {signature}, not ({', '.join(names)})"
        raise PluginError(kind, spec, f"{wrong}: {error}") from None


def _group(kind: str) -> str:
    try:
        return KINDS[kind]
    except KeyError:
        raise PluginError(kind, "", f"no such kind of plug-in (kinds: {', '.join(KINDS)})") from None


def _load_entry_point(kind: str, spec: str, point: EntryPoint) -> object:
    try:
        return point.load()
    except AttributeError as error:
        raise PluginError(kind, spec, f"entry point {point.value!r}: {one_line(error)}") from None
    except Exception as error:  # noqa: BLE001 - any exception at import is the plug-in's fault, named
        raise PluginError(kind, spec, f"entry point {point.value!r} does not import: {one_line(error)}") from None


def _load_reference(kind: str, spec: str) -> object:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise PluginError(kind, spec, "not package.module:Name (both parts are needed)")
    try:
        target: object = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - a module's import may raise anything; say what
        raise PluginError(kind, spec, f"module {module_name!r} does not import: {one_line(error)}") from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise PluginError(kind, spec, f"module {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    return target


def one_line(error: BaseException) -> str:
    """An exception as one line: its type and the first line of its text."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
