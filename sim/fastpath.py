"""The bus-free path: the mechanism's cores, the policy and the simulated hardware called in one
loop, for sweeps and speed. It makes exactly the decisions the services make over the bus
(tests/sim/test_equivalence.py checks the schedules are identical).

The loop is Gavel's (docs/gavel-semantics.md section 2), one iteration per round boundary:

1. stop when every measured job is done;
2. advance the clock to the end of the running round (or to the next arrival when idle);
3. settle the round: credit steps and time, retire finished jobs;
4. admit the jobs that arrived meanwhile;
5. recompute the allocation if it is due; compute priorities, pick and place this round;
6. dispatch: each lease's steps and finish time come from the throughputs.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from common.messages import AllocationComputed
from common.throughputs import ThroughputTable
from mechanism_service.core.model import MechanismState, new_state
from mechanism_service.core.policy_input import (
    admitted_snapshot,
    allocation_fractions,
    allocation_request,
)
from mechanism_service.core.profiling import choose as choose_profiling
from mechanism_service.core.rates import EstimatedRates, Rates, TableRates
from mechanism_service.core.reducers import LeaseResult, NewJob, apply_allocation
from mechanism_service.core.rounds import (
    RoundClock,
    admit_arrivals,
    admit_through,
    begin_reset,
    close_round,
    force_reset_when_idle,
    open_round,
)
from mechanism_service.core.rounds import type_shuffler as rounds_type_shuffler
from mechanism_service.core.seams.chosen import FailureTally
from mechanism_service.core.settings import MechanismSettings
from mechanism_service.plugins import choose
from policy_service.answer import (
    AdmittedAnswer,
    AdmittedRequest,
    SolveContext,
    answer,
    answer_admitted,
    reads_previous,
    reads_service,
)
from policy_service.core.admitted import AdmittedJobs
from sim.carry import Carry, CheckpointPlan
from sim.clock import SimulationStalled
from sim.dispatch import FullLeases, dispatch_round, full_lease_of
from sim.fleet_changes import follow_fleet
from sim.learning import EstimationConfig, InLoopEstimator
from sim.quiet import QuietRounds
from sim.quiet_advance import advance
from sim.quiet_drawn import advance_drawn
from sim.records import outcomes, record_round, round_record  # noqa: F401 - re-exported (driver, tests)
from sim.results import RoundRecord, SimulationResult
from sim.traces import TraceJob

Progress = Callable[[float, int, int], None]  # (simulated time s, jobs done, jobs total)
log = structlog.get_logger("gavel.sim")


@dataclass(frozen=True, slots=True)
class RunConfig:
    policy: str
    cluster: dict[str, int]
    settings: MechanismSettings
    seed: int = 0
    window: tuple[int, int] | None = None  # measured jobs: trace positions [start, end)
    solver: str | None = None
    estimation: EstimationConfig = field(default_factory=EstimationConfig)
    # A live mechanism's time from a round's last lease end (or, idle, from an arrival) to its next
    # boundary (hearing every report, deciding): a what-if replay of a live cluster sets the one it
    # measured (sim/whatif); 0, at once, as the services in virtual time, which the fast path then
    # matches exactly.
    boundary_lag_s: float = 0.0
    # The fleet over time, after ``cluster`` at the start: (from s, ((accelerator type, GPUs), ...)),
    # in time order; servers join and leave at the first boundary at or after each (as a live
    # mechanism's workers do: mechanism_service/core/servers.py). gavel whatif replays a live
    # cluster's; empty: the cluster throughout.
    fleet_changes: tuple[tuple[float, tuple[tuple[str, int], ...]], ...] = ()
    # Advance quiet rounds without planning them (sim/quiet.py): the same results, byte for byte;
    # False plans every round (--no-skip-quiet-rounds), the check that they are the same.
    skip_quiet_rounds: bool = True


def type_shuffler(config: RunConfig) -> Callable[[list[str]], None]:
    return rounds_type_shuffler(config.settings.preset, config.seed)


def measured_ids(trace: Sequence[TraceJob], window: tuple[int, int] | None) -> list[str]:
    """The jobs whose completion times count: trace positions [start, end), or all of them."""
    return [j.job_id for j in (trace[slice(*window)] if window else trace)]


def check_inputs(trace: Sequence[TraceJob], context: SolveContext) -> ThroughputTable:
    if not trace:
        raise ValueError("the trace has no jobs")
    if context.table is None:
        raise ValueError("the simulator needs a throughput table")
    return context.table


def simulate(
    trace: Sequence[TraceJob],
    config: RunConfig,
    context: SolveContext,
    *,
    progress: Progress | None = None,
    observe: Callable[[MechanismState, float], None] | None = None,
    checkpoint: CheckpointPlan | None = None,
    resume: Carry | None = None,
) -> SimulationResult:
    """``observe``: called with the state and the time after each round is planned (a bench that
    reads what the mechanism would answer then, bench/eta_accuracy.py); it must change nothing.
    ``checkpoint``: hands the loop's state to its ``save`` once, at a boundary, and goes on;
    ``resume``: such a state, taken up where it was handed out (sim/checkpoint.py)."""
    table = check_inputs(trace, context)
    started_wall = time.perf_counter()
    settings = config.settings
    state = new_state(config.cluster, settings.gpus_per_server)
    arrivals = collections.deque(sorted(trace, key=lambda j: j.arrival_time_s))  # stable: file order on ties
    measured = measured_ids(trace, config.window)
    waiting_for = set(measured)
    shuffle = type_shuffler(config)
    chosen = choose(settings)  # the seams' plug-ins (core/seams/): None where the default runs
    failures = FailureTally()  # which of their failures the log says
    queued: list[NewJob] = []  # the admission queue (only with an admission policy)
    learning = InLoopEstimator(config.estimation, table, config.seed) if config.estimation.learned else None
    rates: Rates = (
        EstimatedRates(learning.book, config.estimation.reference_table(table), config.estimation.user_estimates)
        if learning is not None
        else TableRates.of(table)
    )

    now_s = arrivals[0].arrival_time_s
    clock = RoundClock()
    running: list[LeaseResult] = []
    full_leases: FullLeases = {}
    rounds: list[RoundRecord] = []
    solve_times: list[float] = []
    rejected: list[str] = []
    idle_passes = 0
    solve_failed = ""  # the policy's reason when the last solve failed: a stall names it
    if resume is not None:  # every variable the loop carries, as a checkpoint kept them
        (state, arrivals, waiting_for, shuffle, chosen, queued, learning, rates, now_s, clock, running, full_leases,
         rounds, solve_times, rejected, idle_passes, solve_failed) = resume.values()
    # Quiet rounds (sim/quiet.py) start afresh after a resume: the next boundary is planned, which
    # makes the plan a skip would have run (they are the same, to the bit)
    quiet = QuietRounds(settings, chosen, enabled=config.skip_quiet_rounds)
    lease_of = full_lease_of(table, full_leases, settings)
    while True:
        if checkpoint is not None and checkpoint.due(now_s, len(trace) - len(arrivals)):
            checkpoint.done = True
            checkpoint.save(Carry(
                state, arrivals, waiting_for, shuffle, chosen, queued, learning, rates, now_s, clock, running,
                full_leases, rounds, solve_times, rejected, idle_passes, solve_failed,
            ))
        # 1. stop
        if config.window is not None:
            if not waiting_for:
                break
        elif not arrivals and not state.jobs and not queued:
            break
        if not arrivals and not running:
            force_reset_when_idle(state)
        # 2. advance the clock
        if running:
            end_s = max(r.finish_s for r in running)
            round_start_s = clock.close(end_s, settings)
            now_s = end_s + config.boundary_lag_s
        elif arrivals:  # an idle mechanism woken by an arrival decides as long
            now_s = max(now_s, arrivals[0].arrival_time_s + config.boundary_lag_s)
        arrived_jobs = []
        while arrivals and arrivals[0].arrival_time_s <= now_s:
            arrived_jobs.append(arrivals.popleft())
        heard = []
        if learning is not None:  # what the estimator heard during the round, in order
            learning.hear(arrived_jobs, running, clock.dispatched_at_s, state)
            heard = learning.captured()
        # whether this boundary can be quiet (sim/quiet.py): nothing but time changes here
        clean = (
            quiet.armed and running and not arrived_jobs and learning is None and not queued and not config.fleet_changes
            and quiet.settled_cleanly(state, running, round_start_s)
        )
        # 3. settle
        finished = close_round(state, running, round_start_s if running else now_s, settings)
        for job in finished:
            waiting_for.discard(job.job_id)
        running = []
        if learning is not None:
            learning.ended(j.job_id for j in finished)
            learning.take(state, heard, rates)
        if config.fleet_changes:
            follow_fleet(state, config.cluster, config.fleet_changes, config.settings, now_s, rates)
        # 4. admit
        if chosen.admission is None:
            refused = admit_arrivals(state, [new_job(j) for j in arrived_jobs], settings, rates)
        else:
            through = admit_through(state, chosen.admission, queued, map(new_job, arrived_jobs), settings, rates, now_s)
            refused, queued = through.others, [job for job, _ in through.queued]
            if through.error and (fields := failures.said(chosen, "admission", through.error)) is not None:
                log.error("plugin_failed", **fields, t_s=now_s)
        for job, _ in refused:
            rejected.append(job.job_id)
            waiting_for.discard(job.job_id)
            if learning is not None:
                learning.ended([job.job_id])
        # 5. allocation, priorities, pick, place
        reset = begin_reset(state, now_s, settings, rates=rates)
        if reset:
            failed_before = solve_failed
            solve_s, solve_failed = _reallocate(state, now_s, config, context, rates, learning)
            solve_times.append(solve_s)
            if solve_failed and not failed_before:  # said once, as the services' mechanism says it
                log.warning("allocation_degraded", error=solve_failed, t_s=now_s, action="keeping the last allocation")
            elif failed_before and not solve_failed:
                log.info("allocation_restored", t_s=now_s)
        profiling = choose_profiling(state, learning.book.profiling, learning.book.profiling_share, packing=settings.packing) if learning and learning.book.profiling else []
        quiet_here = clean and not finished and not refused and not reset
        plan = skipped = quiet.plan_for(state, now_s, quiet_here, arrivals, config.boundary_lag_s, lease_of, shuffle)
        if plan is None:
            plan = open_round(state, now_s, settings, shuffle, profiling, chosen)
            quiet.planned(state, plan)
            for seam, error in plan.seam_errors:
                if (fields := failures.said(chosen, seam, error)) is not None:
                    log.error("plugin_failed", **fields, t_s=now_s)
        if observe is not None:
            observe(state, now_s)
        # 6. dispatch
        clock.dispatched_at_s = now_s
        running = dispatch_round(state, table, plan, now_s, settings, full_leases)
        if running:
            idle_passes = 0
            rounds.append(record_round(state, len(rounds), now_s, plan, running, reset))
            if skipped is not None and observe is None and (checkpoint is None or checkpoint.done):
                # the quiet boundaries after this one, in one step (sim/quiet_advance.py, sim/quiet_drawn.py)
                step = advance if skipped is quiet.steady else advance_drawn
                stretch = step(quiet, state, plan, running, clock, rounds, now_s, arrivals, config.boundary_lag_s, lease_of, shuffle)
                if stretch is not None:
                    running, now_s = stretch
        elif not arrivals:
            idle_passes += 1
            if idle_passes > 2:
                if queued and not state.jobs:  # the admission policy admits none of them
                    raise SimulationStalled(
                        f"t={now_s:.1f} s: {len(queued)} jobs wait in the admission queue of {chosen.admission_name} "
                        f"with nothing scheduled (first: {queued[0].job_id})"
                    )
                stuck = ", ".join(j.job_id for j in list(state.jobs.values())[:5])
                if solve_failed:  # not the cluster's fault: say what the policy said
                    raise SimulationStalled(f"t={now_s:.1f} s: jobs {stuck} were never scheduled: the policy failed: {solve_failed}")
                raise SimulationStalled(f"t={now_s:.1f} s: jobs {stuck} can never be scheduled on this cluster")
        if progress is not None:
            progress(now_s, len(state.completed), len(trace))

    return SimulationResult(
        policy=config.policy,
        preset=settings.preset,
        cluster=dict(config.cluster),
        round_s=settings.round_s,
        seed=config.seed,
        jobs=outcomes(state),
        rounds=tuple(rounds),
        makespan_s=now_s,
        measured_job_ids=tuple(measured),
        resets=state.resets,
        solve_times_s=tuple(solve_times),
        wall_s=time.perf_counter() - started_wall,
        rejected_job_ids=tuple(rejected),
        estimation=tuple(learning.samples) if learning is not None else (),
        estimator=config.estimation.mode,
        unknown_types=config.estimation.unknown_types,
        policy_error=solve_failed,
    )


def new_job(job: TraceJob) -> NewJob:
    return NewJob(
        job.job_id, job.job_type, job.scale_factor, job.total_steps, job.arrival_time_s, job.priority_weight, job.slo_s,
        job.entity,
    )


def _reallocate(
    state: MechanismState, now_s: float, config: RunConfig, context: SolveContext, rates: Rates,
    learning: InLoopEstimator | None,
) -> tuple[float, str]:
    """Ask the policy (the ledgers were just reset) and install its answer: (the solve's time,
    the policy's reason if it failed, else "")."""
    settings = config.settings
    # Gavel's stateful random policies seed one stream per run (the continuation carries it);
    # ours draw afresh at each solve.
    seed = config.seed if settings.preset == "gavel" else config.seed + state.resets
    snapshot = (
        admitted_snapshot(
            state, now_s, rates=rates, with_previous=reads_previous(config.policy, settings.preset, config.solver),
            with_service=reads_service(config.policy, settings.preset, config.solver),
        )
        if learning is None else None
    )
    if snapshot is not None:
        # The request's content column by column, answered as the mechanism installs it: the
        # same problem and allocation as answer(admitted=True) below, without a message per job
        # built only to be read back (the estimator, when learning, observes the message).
        worker_types, columns, previous = snapshot
        admitted = answer_admitted(
            AdmittedRequest(
                request_id=f"r{state.resets}", policy=config.policy, worker_types=worker_types,
                jobs=AdmittedJobs(*columns), previous=previous, packing=settings.packing,  # type: ignore[arg-type]
                preset=settings.preset, seed=seed, solver=config.solver, policy_state=state.policy_state,
            ),
            context,
        )
        if not isinstance(admitted, AdmittedAnswer):
            state.needs_allocation = False
            return 0.0, admitted.reason
        apply_allocation(  # the answer's arrays, installed as the reply's entries would be
            state, admitted.columns, admitted.isolated_throughputs_steps_per_s, settings, admitted.policy_state,
            admitted.valid_for_s,
        )
        return admitted.solve_time_s, ""
    request = allocation_request(
        state,
        now_s,
        request_id=f"r{state.resets}",
        policy=config.policy,
        deadline_s=float("inf"),
        preset=settings.preset,
        seed=seed,
        solver=config.solver,
        packing=settings.packing,
        rates=rates,
    )
    if learning is not None:
        learning.observe(request, now_s)
    # admitted: the jobs' own fields were checked when this loop's mechanism admitted them, with
    # the check the policy makes; the services engine's policy service validates in full.
    reply = answer(request, context, admitted=True)
    if not isinstance(reply, AllocationComputed):
        # Degraded mode, as the service does: keep the last allocation and say why later.
        state.needs_allocation = False
        return 0.0, reply.reason
    apply_allocation(
        state, allocation_fractions(reply), reply.isolated_throughputs_steps_per_s or {}, settings, reply.policy_state,
        reply.valid_for_s,
    )
    return reply.solve_time_s, ""
