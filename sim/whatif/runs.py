"""The replays: each candidate policy run through the simulator (the bus-free engine, with the
real run's settings as a sim/scenario.py Scenario) on a journal's ReplaySetup, with the comparison's time zero at 0, its
rounds taking the real run's time between a round's end and the next boundary."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from policy_service.answer import SolveContext
from policy_service.plugins import is_builtin
from sim.fastpath import Progress, simulate
from sim.results import SimulationResult
from sim.scenario import Scenario
from sim.whatif.real import shifted
from sim.whatif.replay import ReplaySetup


def scenario_of(
    setup: ReplaySetup, boundary_lag_s: float | None = None, mechanism: tuple[tuple[str, object], ...] = ()
) -> Scenario:
    """The real run's settings as a Scenario: its fleet (and its changes), round length, preset and server size,
    the measured jobs as the window, the time its boundaries took (``boundary_lag_s``: another);
    ``mechanism``: MechanismSettings fields beyond the preset (the seams the operator names)."""
    lag_s = setup.boundary_lag_s if boundary_lag_s is None else boundary_lag_s
    return Scenario(
        trace=setup.trace, cluster=dict(setup.cluster), preset=setup.preset, round_s=setup.round_s,
        gpus_per_server=setup.gpus_per_server, window=setup.window, boundary_lag_s=lag_s or 0.0,
        fleet_changes=setup.fleet_changes, mechanism=mechanism,
    )


def replay(
    setup: ReplaySetup, policy: str, prices_per_hour: Mapping[str, float], progress: Progress | None = None,
    *, boundary_lag_s: float | None = None, mechanism: tuple[tuple[str, object], ...] = (),
) -> SimulationResult:
    """One policy on the real run's jobs and cluster, shifted to the comparison's time zero.
    ``prices_per_hour``: the policy service's, as they are (a cost-aware policy reads them; a type
    with none is the real run's case too). The run's own summary is not taken: its costs need a
    price for every type, and the comparison's figures are compare.py's."""
    context = SolveContext(setup.table, dict(prices_per_hour))
    if not is_builtin(policy):  # a plug-in, served by this run's policy (as sim/scenario.py's run_policy)
        context = dataclasses.replace(context, plugins=(policy,))
    result = simulate(setup.trace, scenario_of(setup, boundary_lag_s, mechanism).config(policy), context, progress=progress)
    return shifted(result, setup.origin_s)
