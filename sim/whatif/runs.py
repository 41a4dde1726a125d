"""The replays: each candidate policy run through the simulator (sim/scenario.py's one policy
run, the bus-free engine) on a journal's ReplaySetup, with the comparison's time zero at 0, its
rounds taking the real run's time between a round's end and the next boundary."""

from __future__ import annotations

from collections.abc import Mapping

from policy_service.answer import SolveContext
from sim.fastpath import Progress
from sim.results import SimulationResult
from sim.scenario import Scenario, run_policy
from sim.whatif.real import shifted
from sim.whatif.replay import ReplaySetup


def scenario_of(setup: ReplaySetup, boundary_lag_s: float | None = None) -> Scenario:
    """The real run's settings as a Scenario: its fleet (and its changes), round length, preset and server size,
    the measured jobs as the window, the time its boundaries took (``boundary_lag_s``: another)."""
    lag_s = setup.boundary_lag_s if boundary_lag_s is None else boundary_lag_s
    return Scenario(
        trace=setup.trace, cluster=dict(setup.cluster), preset=setup.preset, round_s=setup.round_s,
        gpus_per_server=setup.gpus_per_server, window=setup.window, boundary_lag_s=lag_s or 0.0,
        fleet_changes=setup.fleet_changes,
    )


def replay(
    setup: ReplaySetup, policy: str, prices_per_hour: Mapping[str, float], progress: Progress | None = None,
    *, boundary_lag_s: float | None = None,
) -> SimulationResult:
    """One policy on the real run's jobs and cluster, shifted to the comparison's time zero."""
    prices = {**dict.fromkeys(setup.cluster, 0.0), **prices_per_hour}  # costs are not compared here
    scenario = scenario_of(setup, boundary_lag_s)
    result, _ = run_policy(policy, scenario, SolveContext(setup.table, prices), progress)
    return shifted(result, setup.origin_s)
