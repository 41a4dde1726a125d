"""The pieces of a simulation with faults, built from a spec and a seed (sim/driver.py composes
them): the schedule, the liveness settings faults need, the journal, the injectors, and the report.

What faults change in the composition, and why:
- the mechanism watches workers (``worker_grace_s`` from ``faults.timing_for``: three heartbeats)
  and the fleet heartbeats (sim/fault_fleet.py), so that a crashed or hung worker is declared lost;
  ``round_timeout_s`` stays None: it is a wall-clock wait (asyncio.wait), which would make a
  virtual-time run depend on the machine's speed; a silent lease ends when its worker is declared
  lost instead, on the virtual clock;
- a mechanism crash needs a journal to recover from: one is made in a temporary directory when
  the caller gave none (its path is in the report, kept for the invariant checker);
- the policy runs inline, as without faults, under a supervisor that replaces a crashed replica.
"""

from __future__ import annotations

import dataclasses
import pathlib
import random
import tempfile
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import structlog

from common.clock import Clock
from common.codec import DEFAULT_CODEC
from common.errors import DecodeError
from common.journal import Journal, read_events
from common.throughputs import ThroughputTable
from common.transport.memory import InMemoryBroker, InMemoryBus
from mechanism_service.service import MechanismService
from policy_service.answer import SolveContext
from sim.fastpath import RunConfig
from sim.fault_bus import FaultyBus
from sim.fault_fleet import FaultyFleet
from sim.fault_services import MechanismCrashes, MechanismSupervisor, PolicySupervisor
from sim.faults import DeadLetterRecord, FaultLog, FaultReport, FaultSchedule, FaultSpec, horizon_s, schedule, timing_for
from sim.traces import TraceJob

log = structlog.get_logger("gavel.sim.faults")

MAX_RUN_OVER_HORIZON = 50.0  # a run's virtual length at most this many times its lower bound
INJECTOR_SOURCES = frozenset({"poisoner", "faults"})  # publishers whose dead letters are poison on purpose


def worker_ids(cluster: Mapping[str, int], gpus_per_server: int) -> list[str]:
    """The fleet's worker ids, as SimulatedFleet and FaultyFleet name them."""
    return [f"{w}-{s}" for w in sorted(cluster) for s in range(cluster[w] // gpus_per_server)]


def trace_horizon_s(trace: Sequence[TraceJob], table: ThroughputTable, cluster: Mapping[str, int]) -> float:
    jobs = []
    for job in trace:
        rates = [table.isolated_steps_per_s.get((job.job_type, job.scale_factor, w), 0.0) for w in cluster]
        jobs.append((job.arrival_time_s, job.total_steps, job.scale_factor, max(rates, default=0.0)))
    return horizon_s(jobs, sum(cluster.values()))


class FaultedRun:
    def __init__(
        self, trace: Sequence[TraceJob], config: RunConfig, table: ThroughputTable, spec: FaultSpec, seed: int,
        journal: Journal | None,
    ) -> None:
        self.spec = spec
        self.seed = seed
        self.table = table
        timing = timing_for(config.settings.round_s)
        self.settings = dataclasses.replace(config.settings, worker_grace_s=timing.worker_grace_s)
        self.schedule: FaultSchedule = schedule(
            spec, np.random.default_rng(seed), seed=seed,
            horizon_s=trace_horizon_s(trace, table, config.cluster),
            worker_ids=worker_ids(config.cluster, config.settings.gpus_per_server), timing=timing,
        )
        self.log = FaultLog()
        self._crashes: MechanismCrashes | None = None
        self._gpus_per_server = config.settings.gpus_per_server
        if journal is None and spec.mechanism_crash:
            directory = pathlib.Path(tempfile.mkdtemp(prefix="gavel-faults-"))
            journal = Journal(directory / "mechanism.sqlite")
            log.info("fault_journal_created", journal=str(journal.path), reason="mechanism crashes need a journal to recover from")
        self.journal = journal
        self.journal_path = None if journal is None else str(journal.path)

    @property
    def injected_mechanism_crashes(self) -> int:
        return sum(1 for e in self.log.events if e.kind == "mechanism-crash")

    @property
    def time_limit_s(self) -> float:
        """A run with faults that has not finished by then never will (a lease nobody reports
        keeps the round open while the heartbeats keep time going): stop it and say so."""
        return MAX_RUN_OVER_HORIZON * self.schedule.horizon_s

    def crash_point(self, clock: Clock) -> Callable[[str], None] | None:
        """One for every incarnation: a crash that happened does not happen again after the restart."""
        if not self.schedule.mechanism_crashes:
            return None
        if self._crashes is None:
            self._crashes = MechanismCrashes(clock, self.schedule.mechanism_crashes, self.log)
        return self._crashes

    def mechanism_supervisor(self, make: Callable[[Journal | None], MechanismService]) -> MechanismSupervisor:
        return MechanismSupervisor(make, self.journal)

    def fleet(self, clock: Clock, cluster: Mapping[str, int], noise: float, seed: int) -> FaultyFleet:
        return FaultyFleet(
            clock=clock, table=self.table, cluster=dict(cluster), gpus_per_server=self._gpus_per_server,
            schedule=self.schedule, log=self.log, measurement_noise=noise, seed=seed,
        )

    def policy(self, clock: Clock, context: SolveContext) -> PolicySupervisor:
        return PolicySupervisor(clock=clock, context=context, crashes=self.schedule.policy_crashes, log_=self.log)

    def bus(self, inner: InMemoryBus, clock) -> InMemoryBus | FaultyBus:  # noqa: ANN001 - a VirtualClock
        if not self.spec.messages:
            return inner
        # its own stream, so that adding a message fault does not move the scheduled events
        rng = random.Random(f"gavel-faults-messages-{self.seed}")
        return FaultyBus(inner, clock=clock, spec=self.spec, rng=rng, log=self.log)

    def report(
        self, broker: InMemoryBroker, mechanism_restarts: int, policy_restarts: int, policy_redeliveries: int
    ) -> FaultReport:
        dead = tuple(_dead_letter(d) for d in broker.take_dead_letters(1_000_000))
        events = tuple(sorted(self.log.events, key=lambda e: e.at_s))
        occupancy = tuple(sorted(self.log.occupancy, key=lambda o: (o.worker_id, o.gpu_index, o.start_s, o.lease_id)))
        report = FaultReport(
            spec=self.spec.text, seed=self.seed, scheduled=self.schedule.scheduled,
            injected=self.log.counts(), events=events, dead_letters=dead, occupancy=occupancy,
            journal_path=self.journal_path, quiet_from_s=self.schedule.quiet_from_s,
            mechanism_restarts=mechanism_restarts, policy_restarts=policy_restarts,
            policy_redeliveries=policy_redeliveries,
        )
        return check_invariants(report) if self.journal_path is not None else report


def check_invariants(report: FaultReport) -> FaultReport:
    """``report`` with the invariants I1-I6 checked over the run's journal, the workers' GPU
    occupancy and the dead letters (mechanism_service/core/invariants.py; I5 needs a bound that
    depends on the policy, so it is left to the caller). Needs a journal: without one there is
    nothing to check I1, I3 and I4 against."""
    from mechanism_service.core import invariants

    assert report.journal_path is not None
    rows = list(read_events(report.journal_path))
    checked = invariants.check(
        rows,
        worker_leases=[invariants.WorkerLease(o.worker_id, o.gpu_index, o.lease_id, o.start_s, o.end_s) for o in report.occupancy],
        dead_letters=[invariants.DeadLetterFact(d.queue, d.reason, d.injected) for d in report.dead_letters],
        finished=True,
    )
    return dataclasses.replace(
        report,
        invariants_checked=tuple(sorted(checked.checked)),
        violations=tuple(f"{v.invariant} {v.subject}: {v.detail}" for v in checked.violations),
    )


def _dead_letter(d) -> DeadLetterRecord:  # noqa: ANN001 - a common.bus.DeadLetter
    try:
        source = DEFAULT_CODEC.decode(d.body).envelope.source
    except DecodeError:
        source = ""
    return DeadLetterRecord(d.queue, d.routing_key, d.reason, injected=source in INJECTOR_SOURCES)
