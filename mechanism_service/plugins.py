"""The seams' choices resolved once at start (core/seams/): MechanismSettings names them as
strings, this builds them. A name is a built-in, an installed entry point (gavel.admission,
gavel.placement, gavel.launch) or ``package.module:Name`` (common/plugins.py). The named callable is called with the parameters as keyword
arguments (strings); a choice that cannot be built, or lacks its method, is a PluginError naming
it, so a bad plug-in is refused at start and never in a round.

The defaults (accept_all, consolidated, priority, without parameters) resolve to None: the
rounds then run their own code, to the bit and at no cost.
"""

from __future__ import annotations

from collections.abc import Mapping

from common.errors import PluginError
from common.plugins import check_method, resolve
from mechanism_service.core.seams.admission_builtins import (
    ADMISSION_BUILTINS,
    DEFAULT_ADMISSION,
)
from mechanism_service.core.seams.chosen import DEFAULTS, Chosen
from mechanism_service.core.seams.launch_builtins import DEFAULT_LAUNCH, LAUNCH_BUILTINS
from mechanism_service.core.seams.placement_builtins import (
    DEFAULT_PLACEMENT,
    PLACEMENT_BUILTINS,
)
from mechanism_service.core.settings import MechanismSettings


def choose(settings: MechanismSettings) -> Chosen:
    """The seams' choices ``settings`` names (raises PluginError)."""
    if (
        (settings.admission, settings.placement, settings.launch) == (DEFAULT_ADMISSION, DEFAULT_PLACEMENT, DEFAULT_LAUNCH)
        and not (settings.admission_params or settings.placement_params or settings.launch_params)
    ):
        return DEFAULTS
    return Chosen(
        admission=build("admission", settings.admission, settings.admission_params, ADMISSION_BUILTINS, DEFAULT_ADMISSION, "admit", "view"),
        placement=build("placement", settings.placement, settings.placement_params, PLACEMENT_BUILTINS, DEFAULT_PLACEMENT, "place", "request"),
        launch=build("launch", settings.launch, settings.launch_params, LAUNCH_BUILTINS, DEFAULT_LAUNCH, "launch", "view"),
        admission_name=settings.admission, placement_name=settings.placement, launch_name=settings.launch,
    )


def build(
    kind: str, spec: str, params: tuple[tuple[str, str], ...], builtins: Mapping[str, object], default: str,
    method: str, argument: str,
) -> object | None:
    """One seam's choice: None for the default without parameters, else the built object."""
    if spec == default and not params:
        return None
    factory = resolve(kind, spec, builtins)
    if not callable(factory):
        raise PluginError(kind, spec, f"is not callable (a {type(factory).__name__}): name a class or a factory")
    try:
        chosen = factory(**dict(params))
    except (TypeError, ValueError) as error:
        raise PluginError(kind, spec, f"its parameters: {error}") from None
    except Exception as error:  # noqa: BLE001 - a plug-in's constructor may raise anything: say what
        raise PluginError(kind, spec, f"raised at start: {type(error).__name__}: {error}") from None
    check_method(kind, spec, chosen, method, args=(argument,))
    return chosen
