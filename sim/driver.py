"""The simulator with the real services: mechanism, policy and a simulated fleet on the
in-memory bus, in virtual time, fed by a trace replayer. Same inputs and same result type as
the bus-free path (sim/fastpath.py), and the same schedule (tests/sim/test_equivalence.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from common.errors import ServiceError
from common.host import Service, ServiceHost
from common.journal import Journal
from common.messages import AllocationRequested, JobSubmitted
from common.throughputs import ThroughputTable
from common.transport.memory import InMemoryBroker, InMemoryBus
from estimator_service.service import EstimatorService
from mechanism_service.config import MechanismConfig
from mechanism_service.core.model import MechanismState
from mechanism_service.core.retention import Retention
from mechanism_service.core.settings import MechanismSettings
from mechanism_service.service import MechanismService
from policy_service.answer import SolveContext
from policy_service.service import PolicyService
from sim.archive import Archive
from sim.clock import SimulationStalled, VirtualClock
from sim.estimation import EstimationSample, sample
from sim.fastpath import Progress, RunConfig, check_inputs, measured_ids, outcomes, round_record, type_shuffler
from sim.faults import FaultReport, FaultSpec
from sim.fleet import SimulatedFleet
from sim.learning import spec_of
from sim.results import SimulationResult
from sim.traces import TraceJob

# A simulated mechanism forgets as a live one does, by count only (its time runs ~10^4 times a
# live cluster's), and keeps nothing that is over: a finished job and a round's report go at the
# next boundary, into the archive its results read (sim/archive.py). Its memory and snapshot
# then hold its active jobs alone, whatever the trace's length (keeping the newest 100 made the
# 100-job fault run of the README 45 s instead of 25: each snapshot pickles what is kept).
SIM_RETENTION = Retention(finished_s=None, finished_jobs=0, rounds=0, lost_workers=100)


class TraceReplayer:
    """Submits each trace job at its arrival time, as a user would (``gavel submit``)."""

    name = "replayer"

    def __init__(
        self, clock: VirtualClock, trace: Sequence[TraceJob], user_estimates: Mapping[str, Mapping[str, float]] | None = None
    ) -> None:
        self._clock = clock
        self._user_estimates = user_estimates or {}
        self._trace = sorted(trace, key=lambda j: j.arrival_time_s)  # stable: file order on ties
        self.submitted = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def done(self) -> bool:
        return self.submitted == len(self._trace)

    async def start(self, bus) -> None:  # noqa: ANN001 - a Bus
        async def replay() -> None:
            first = True
            for job in self._trace:
                # Jobs that arrive at the same instant go out in one burst: the mechanism's
                # barrier then sees all of them (a sleep per job would interleave with it).
                if first or job.arrival_time_s > self._clock.now_s():
                    await self._clock.sleep_until(job.arrival_time_s)
                    first = False
                await bus.publish(JobSubmitted(spec_of(job, self._user_estimates)))
                self.submitted += 1

        self._task = asyncio.get_running_loop().create_task(replay(), name="trace-replayer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


async def simulate_services(
    trace: Sequence[TraceJob],
    config: RunConfig,
    context: SolveContext,
    *,
    progress: Progress | None = None,
    observers: Sequence[Service] = (),
    journal: Journal | None = None,
    faults: FaultSpec | None = None,
    fault_seed: int | None = None,
) -> SimulationResult:
    """``observers``: more services on the same bus (a live dashboard, a test's listener); they
    start before the simulation does. ``journal``: the mechanism keeps one (as a service does),
    for the invariants to be checked over it (mechanism_service/core/invariants.py).

    ``faults``: inject them (sim/faults.py), seeded by ``fault_seed`` (default: the run's seed);
    the result's ``faults`` says what happened. None (or an empty spec): the run is the plain one,
    to the bit."""
    if faults is not None and not faults.empty:
        return await _simulate_with_faults(
            trace, config, context, faults, config.seed if fault_seed is None else fault_seed,
            progress=progress, observers=observers, journal=journal,
        )
    table = check_inputs(trace, context)
    started_wall = time.perf_counter()
    settings = config.settings
    broker = InMemoryBroker()
    clock = VirtualClock(broker, start_s=0.0)
    measured = measured_ids(trace, config.window)
    waiting_for = set(measured)
    replayer = TraceReplayer(clock, trace, config.estimation.user_estimates)

    archive = Archive()

    def stop_when(state: MechanismState) -> bool:
        waiting_for.difference_update(j.job_id for j in state.completed)
        waiting_for.difference_update(mechanism.rejected)
        waiting_for.difference_update(archive.take_ended())
        if config.window is not None:
            return not waiting_for
        return replayer.done and not state.jobs and not mechanism.has_submissions

    estimation = config.estimation
    mechanism = _mechanism(config, table, clock, settings, replayer, stop_when, journal, archive)

    fleet = SimulatedFleet(
        clock=clock, table=table, cluster=config.cluster, gpus_per_server=settings.gpus_per_server,
        measurement_noise=estimation.measurement_noise, seed=config.seed,
    )
    policy = PolicyService(clock=clock, context=context, solving="inline")
    learning: list[Service] = []
    watch = EstimationWatch(clock, table)
    if estimation.learned:
        learning = [EstimatorService(core=estimation.core(table, config.seed), mode=estimation.mode), watch]
    # The replayer's first submission waits on the clock (a barrier even at t = 0), so the
    # fleet's workers are registered before any job arrives.
    host = ServiceHost(
        InMemoryBus(broker, clock=clock, source="sim"), [*observers, *learning, policy, mechanism, fleet, replayer]
    )
    await host.start()

    def done() -> bool:
        if progress is not None and mechanism.state is not None:
            progress(clock.now_s(), len(archive.jobs) + len(mechanism.state.completed), len(trace))
        return mechanism.stopped.is_set()

    try:
        await clock.run_until(done)
    finally:
        await host.stop()
    if mechanism.crashed.is_set():
        raise ServiceError(mechanism.crash_reason or "the mechanism crashed during the simulation: see round_loop_crashed in the log")
    return _result(config, mechanism, archive, measured, watch, started_wall)


def _mechanism(
    config: RunConfig, table: ThroughputTable, clock: VirtualClock, settings: MechanismSettings,
    replayer: TraceReplayer, stop_when: Callable[[MechanismState], bool], journal: Journal | None, archive: Archive,
    **faults: Any,
) -> MechanismService:
    """The mechanism of a simulation (``faults``: the fault path's crash point and elastic types).
    It forgets what is over as a live one does (``SIM_RETENTION``), into ``archive``."""
    estimation = config.estimation
    mechanism_config = MechanismConfig(
        settings=settings,
        policy=config.policy,
        # learned: the mechanism knows what the estimator knows (the unknown types are not in it)
        table=estimation.reference_table(table) if estimation.learned else table,
        estimates=estimation.learned,
        shuffle=type_shuffler(config),
        seed=config.seed,
        solver=config.solver,
        stop_when=stop_when,
        more_arrivals=lambda: not replayer.done,
        retention=SIM_RETENTION,
        archive=archive,
        events=False,  # nobody watches a simulation: its results are its record
        **faults,
    )
    return MechanismService(mechanism_config, clock=clock, journal=journal)


def _result(
    config: RunConfig, mechanism: MechanismService, archive: Archive, measured: Sequence[str], watch: EstimationWatch,
    started_wall: float, faults: FaultReport | None = None,
) -> SimulationResult:
    state = mechanism.state
    assert state is not None
    rounds, solve_times_s, rejected = archive.with_mechanism(mechanism)
    obs = mechanism.cell.memory.observations  # degraded at the end: the last solve failed, and why
    policy_error = "" if obs.degraded_since_s is None else str((obs.last_solve or {}).get("error") or "the policy did not answer")
    return SimulationResult(
        policy=config.policy,
        preset=config.settings.preset,
        cluster=dict(config.cluster),
        round_s=config.settings.round_s,
        seed=config.seed,
        jobs=outcomes(state, archive.completed(state)),
        rounds=tuple(round_record(r) for r in rounds),
        makespan_s=mechanism.last_boundary_s,
        measured_job_ids=tuple(measured),
        resets=state.resets,
        solve_times_s=tuple(solve_times_s),
        wall_s=time.perf_counter() - started_wall,
        rejected_job_ids=tuple(rejected),
        estimation=tuple(watch.samples),
        estimator=config.estimation.mode,
        unknown_types=config.estimation.unknown_types,
        faults=faults,
        policy_error=policy_error,
    )


async def _simulate_with_faults(
    trace: Sequence[TraceJob],
    config: RunConfig,
    context: SolveContext,
    faults: FaultSpec,
    fault_seed: int,
    *,
    progress: Progress | None,
    observers: Sequence[Service],
    journal: Journal | None,
) -> SimulationResult:
    """The same composition with the fault injectors in it (sim/fault_driver.py builds them)."""
    from sim.fault_driver import FaultedRun

    table = check_inputs(trace, context)
    started_wall = time.perf_counter()
    run = FaultedRun(trace, config, table, faults, fault_seed, journal)
    broker = InMemoryBroker()
    clock = VirtualClock(broker, start_s=0.0)
    settings = run.settings
    measured = measured_ids(trace, config.window)
    waiting_for = set(measured)
    replayer = TraceReplayer(clock, trace, config.estimation.user_estimates)

    def mechanism() -> MechanismService:
        assert supervisor.current is not None
        return supervisor.current

    archive = Archive()

    def stop_when(state: MechanismState) -> bool:
        waiting_for.difference_update(j.job_id for j in state.completed)
        waiting_for.difference_update(mechanism().rejected)
        waiting_for.difference_update(archive.take_ended())
        if config.window is not None:
            return not waiting_for
        current = mechanism()
        return (
            replayer.done and not state.jobs and not current.has_submissions and not current.memory.held
            and not current.memory.queued
        )

    estimation = config.estimation

    def make_mechanism(journal_: Journal) -> MechanismService:
        return _mechanism(
            config, table, clock, settings, replayer, stop_when, journal_, archive,
            crash_point=run.crash_point(clock),
            # Workers come and go: a gang that does not fit while some are lost is held until they
            # are back (as on a live cluster), not refused as if the cluster had shrunk for good.
            elastic_types=tuple(sorted(config.cluster)),
        )

    supervisor = run.mechanism_supervisor(make_mechanism)
    fleet = run.fleet(clock, config.cluster, estimation.measurement_noise, config.seed)
    policy = run.policy(clock, context)
    learning: list[Service] = []
    watch = EstimationWatch(clock, table)
    if estimation.learned:
        learning = [EstimatorService(core=estimation.core(table, config.seed), mode=estimation.mode), watch]
    bus = run.bus(InMemoryBus(broker, clock=clock, source="sim"), clock)
    host = ServiceHost(bus, [*observers, *learning, policy, supervisor, fleet, replayer])
    await host.start()

    def done() -> bool:
        current = mechanism()
        if progress is not None and current.state is not None:
            progress(clock.now_s(), len(archive.jobs) + len(current.state.completed), len(trace))
        return current.stopped.is_set()

    try:
        while True:
            await clock.run_until(done, max_time_s=run.time_limit_s)
            if not done():
                raise SimulationStalled(
                    f"the run with faults {faults.text!r} (fault seed {fault_seed}) has not finished by "
                    f"t={clock.now_s():.0f} s, {run.time_limit_s / run.schedule.horizon_s:g} times its lower bound: "
                    "a lease or a job is stuck"
                )
            if not supervisor.crashed:
                break
            if supervisor.restarts >= run.injected_mechanism_crashes:
                raise ServiceError(
                    f"the mechanism crashed on its own at t={clock.now_s():.1f} s under faults {faults.text!r} "
                    f"(fault seed {fault_seed}): see round_loop_crashed in the log"
                )
            # time stands still while the new mechanism recovers (no sleeper is released)
            await supervisor.restart()
    finally:
        await host.stop()
    report = run.report(broker, supervisor.restarts, policy.restarts, policy.redelivered)
    return _result(config, mechanism(), archive, measured, watch, started_wall, report)


class EstimationWatch:
    """Measures every allocation request's estimates against the true table (sim/estimation.py)."""

    name = "estimation-watch"

    def __init__(self, clock: VirtualClock, table: ThroughputTable) -> None:
        self._clock = clock
        self._table = table
        self.samples: list[EstimationSample] = []

    async def start(self, bus) -> None:  # noqa: ANN001 - a Bus
        await bus.subscribe(self.name, [AllocationRequested.ROUTING_KEY], self._observe, durable=False)

    async def stop(self) -> None:
        return None

    async def _observe(self, d) -> None:  # noqa: ANN001 - a Delivery
        observed = sample(d.message, self._table, self._clock.now_s())
        if observed is not None:
            self.samples.append(observed)

