"""The bus-free run's fleet over time (RunConfig.fleet_changes: what ``gavel whatif`` replays of
a live cluster whose workers came and went): servers join or leave at a boundary through the
mechanism's own reducers (core/servers.py), as registrations and losses do in the services."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mechanism_service.core.model import MechanismState
from mechanism_service.core.rates import Rates
from mechanism_service.core.servers import add_server, remove_server
from mechanism_service.core.settings import MechanismSettings


def follow_fleet(
    state: MechanismState,
    cluster: Mapping[str, int],
    fleet_changes: Sequence[tuple[float, Sequence[tuple[str, int]]]],  # (from s, (type, GPUs) pairs)
    settings: MechanismSettings,
    now_s: float,
    rates: Rates,
) -> None:
    """Servers join or leave until the state has the fleet in force at ``now_s`` (the last of
    ``fleet_changes`` from then or before, else ``cluster``): stateless, so a run resumed from a
    checkpoint follows it too."""
    target = dict(cluster)
    for at_s, fleet in fleet_changes:
        if at_s > now_s:
            break
        target = dict(fleet)
    size = settings.gpus_per_server
    for accelerator_type in sorted(set(target) | set(state.gpus)):
        wanted = target.get(accelerator_type, 0)
        while state.gpus.get(accelerator_type, 0) + size <= wanted:
            add_server(state, accelerator_type, size, settings, rates)
        while state.gpus.get(accelerator_type, 0) > wanted and state.servers.get(accelerator_type):
            remove_server(state, accelerator_type, state.servers[accelerator_type][-1])
