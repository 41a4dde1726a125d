"""The example package's placement and admission plug-ins in the simulator's rounds (the fast path,
observed after each round's plan), by entry point and by package.module:Name: fewest_servers
splits fewer gangs over servers than Gavel's consolidation on the same run, and per_entity_jobs
keeps at most max_jobs jobs scheduled at once where accept-all schedules more. The package is
pip-installed into a temporary directory once (about 1.5 s); the runs take about 3 s in all.
"""

from __future__ import annotations

from pathlib import Path

from policy_service.service import shipped_context
from sim.fastpath import simulate
from sim.scenario import Scenario, generated_trace

CONTEXT = shipped_context()
CLUSTER = {"v100": 8, "p100": 8, "k80": 8}
POLICY = "max_min_fairness_perf"


def _run(**mechanism: object) -> list[tuple[int, int, tuple[tuple[str, tuple[int, ...]], ...]]]:
    """Each round's (jobs scheduled, gangs split over servers, placements) of one run."""
    assert CONTEXT.table is not None
    trace = generated_trace(30, 6.0, True, 1, CONTEXT.table)
    scenario = Scenario(trace, CLUSTER, gpus_per_server=4, mechanism=tuple(mechanism.items()))
    seen = []

    def observe(state, now_s: float) -> None:
        server_of = {w: (t, k) for t, servers in state.servers.items() for k, server in enumerate(servers) for w in server}
        placements = tuple(sorted(
            (key, p.worker_ids)
            for key, p in state.previous_assignment.items()
        ))
        split = sum(len({server_of[w] for w in p.worker_ids}) > 1 for p in state.previous_assignment.values())
        seen.append((len(state.jobs), split, placements))

    result = simulate(trace, scenario.config(POLICY), CONTEXT, observe=observe)
    assert all(job.jct_s is not None for job in result.jobs)
    return seen


def test_fewest_servers_splits_fewer_gangs_than_consolidation(on_path: Path) -> None:
    consolidated = _run()
    by_name = _run(placement="fewest_servers")
    by_reference = _run(placement="gavel_example_plugins.placement:FewestServers")
    assert by_name == by_reference
    splits = sum(split for _, split, _ in by_name)
    assert sum(split for _, split, _ in consolidated) > splits
    assert [p for *_, p in by_name] != [p for *_, p in consolidated]


def test_per_entity_jobs_caps_the_scheduled_jobs(on_path: Path) -> None:
    everyone = _run()
    assert max(jobs for jobs, _, _ in everyone) > 2
    capped = _run(admission="per_entity_jobs", admission_params=(("max_jobs", "2"),))
    assert capped == _run(admission="gavel_example_plugins.admission:PerEntityJobs", admission_params=(("max_jobs", "2"),))
    assert max(jobs for jobs, _, _ in capped) == 2

