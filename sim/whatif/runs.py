"""The replays: each candidate policy run through the simulator (sim/scenario.py's one policy
run, the bus-free engine) on a journal's ReplaySetup, with the comparison's time zero at 0."""

from __future__ import annotations

from collections.abc import Mapping

from policy_service.answer import SolveContext
from sim.fastpath import Progress
from sim.results import SimulationResult
from sim.scenario import Scenario, run_policy
from sim.whatif.replay import ReplaySetup, shifted


def scenario_of(setup: ReplaySetup) -> Scenario:
    """The real run's settings as a Scenario: its fleet, round length, preset and server size,
    the measured jobs as the window."""
    return Scenario(
        trace=setup.trace, cluster=dict(setup.cluster), preset=setup.preset, round_s=setup.round_s,
        gpus_per_server=setup.gpus_per_server, window=setup.window,
    )


def replay(
    setup: ReplaySetup, policy: str, prices_per_hour: Mapping[str, float], progress: Progress | None = None
) -> SimulationResult:
    """One policy on the real run's jobs and cluster, shifted to the comparison's time zero."""
    prices = {**dict.fromkeys(setup.cluster, 0.0), **prices_per_hour}  # costs are not compared here
    result, _ = run_policy(policy, scenario_of(setup), SolveContext(setup.table, prices), progress)
    return shifted(result, setup.origin_s)
