"""Journals of runs for the what-if tests: a run of the real services (mechanism, policy,
simulated fleet) on the in-memory bus in virtual time, its mechanism keeping its journal as a
live one does (arrivals stamped on its own clock, the audit trail of leases and ends)."""

from __future__ import annotations

import asyncio
import pathlib

from common.journal import Journal
from mechanism_service.core.settings import preset
from policy_service.service import shipped_context
from sim.driver import simulate_services
from sim.fastpath import RunConfig
from sim.faults import parse_spec
from sim.learning import EstimationConfig
from sim.results import SimulationResult
from sim.traces import TraceJob, TraceSpec, TraceStreams, generate_trace

CLUSTER = {"v100": 2, "p100": 2, "k80": 2}
POLICY = "max_min_fairness_perf"


def arriving_trace(num_jobs: int = 12, jobs_per_hour: float = 4.0, seed: int = 0) -> tuple[TraceJob, ...]:
    """Gavel's job mix arriving over time (seed 0: 12 jobs over ~3 h, the run ~130 h simulated)."""
    return generate_trace(TraceSpec(num_jobs=num_jobs, jobs_per_hour=jobs_per_hour), shipped_context().table, TraceStreams.gavel(seed))


def journal_of_run(
    path: pathlib.Path, trace: tuple[TraceJob, ...], *, policy: str = POLICY, preset_name: str = "default",
    cluster: dict[str, int] | None = None, estimation: EstimationConfig | None = None, faults: str | None = None,
) -> SimulationResult:
    """Run the services on ``trace`` with the mechanism journaling to ``path``; the run's result.
    ``faults``: a spec of sim/faults.py (``worker-crash=2``), injected with seed 3."""
    journal = Journal(path)
    config = RunConfig(
        policy, dict(cluster or CLUSTER), preset(preset_name, policy), seed=0, estimation=estimation or EstimationConfig()
    )
    try:
        spec = parse_spec(faults) if faults else None
        return asyncio.run(simulate_services(trace, config, shipped_context(), journal=journal, faults=spec, fault_seed=3))
    finally:
        journal.close()
