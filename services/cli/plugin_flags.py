"""The command line's side of plug-ins (docs/extending.md): a flag's policy spec loaded and
checked before anything starts, a bad one refused in one line naming the flag and the plug-in
(exit 2). Imports the policy library only when called (services/cli/__init__.py: --help stays
light)."""

from __future__ import annotations

from collections.abc import Iterable

from common.errors import CommandFailed, PluginError, UnknownPolicyError


def checked_policy(flag: str, spec: str) -> str:
    """``spec`` (a built-in, an installed plug-in's name or package.module:Name), loaded here so
    that an import error, a missing name or a wrong signature stops the command at once."""
    from policy_service.plugins import load_policy  # the policy library, on use

    try:
        load_policy(spec)
    except (PluginError, UnknownPolicyError) as e:
        raise CommandFailed(f"{flag}: {e}", exit_code=2) from None
    return spec


def served_plugins(flag: str, specs: Iterable[str]) -> tuple[str, ...]:
    """The plug-ins among ``specs`` (each checked), for ``SolveContext.plugins``: what a policy
    replica answers besides the built-ins and the installed entry points."""
    from policy_service.plugins import is_builtin

    return tuple(dict.fromkeys(checked_policy(flag, s) for s in specs if not is_builtin(s)))
