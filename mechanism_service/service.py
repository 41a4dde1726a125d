"""The mechanism service: realises the policy's allocation in rounds over the bus.

It changes its state only through the core (mechanism_service/core); this module turns messages
into core calls and core results into messages. The round loop, as numbered steps (the same as the
simulator's bus-free path):

1. wait until every lease of the running round has reported (or, when nothing runs, until work
   arrives), then for everything else due at this instant;
2. settle the round: credit steps and time, publish completions and the round's end;
3. admit the jobs whose arrival time has come;
4. if the allocation is due: reset the ledgers, ask the policy service, install its answer
   (degraded mode: keep the last allocation when no answer comes in time, and say so);
5. priorities, pick, place; journal the boundary; send run / extend commands; publish the round.

Time: the injected Clock (the simulator's virtual clock, or the wall clock for a live cluster),
or ``lockstep=True``: the mechanism moves time itself, to a round's end when every lease has
reported and to the next submitted job's arrival when idle, so that separate processes make the
same schedule as the in-process simulator.

Durability: with a journal, every accepted input is written before it is acknowledged, and the
whole memory at each boundary before its commands go out (common/journal.py); a
restarted mechanism resumes from it. The journal is also the audit trail (core/audit.py): what
each boundary leased, settled and charged, and every job's end, for the invariant checker. Each
start is a new incarnation (``memory.epoch``), which every command carries.

Real workers (docs/mechanism.md, "Workers that fail, jobs that crash"): with
``settings.worker_grace_s``, a worker that sent heartbeats and then falls silent for longer than
the grace is declared lost (a decision journaled as an input): its GPUs leave, its leases end at
once, it is fenced (WorkerFenced), and the allocation is solved again. A job whose process
crashes ``max_failed_attempts`` leases in a row fails.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import itertools
import json
from collections.abc import Callable

import structlog

from common.bus import Bus, Delivery
from common.clock import Clock
from common.codec import DEFAULT_CODEC
from common.errors import ServiceError, UnroutableError
from common.journal import Journal, wire_bytes
from common.messages import (
    AllocationComputed,
    AllocationFailed,
    Assignment,
    CancelJob,
    ExtendLease,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobProgress,
    JobRejected,
    JobSubmitted,
    KillJobs,
    RoundEnded,
    RoundStarted,
    RunJobs,
    SolveStatus,
    StatusReported,
    StatusRequested,
    SubmissionsSealed,
    ThroughputEstimated,
    WorkerFenced,
    WorkerHeartbeat,
    WorkerIdInUse,
    WorkerRefused,
    WorkerRegistered,
)
from common.messages.base import Message
from common.throughputs import ThroughputTable
from common.topics import POLICY_REQUEST_QUEUE
from common.topology import MECHANISM_SUBMISSIONS
from mechanism_service.clocks import LockstepClock, ScaledClock, describe_clock
from mechanism_service.core import attempts as attempts_core
from mechanism_service.core import audit, membership, ownership
from mechanism_service.core import retention as retention_core
from mechanism_service.core import status as status_core
from mechanism_service.core.estimates import EstimateBook
from mechanism_service.core.intake import Intake, Receipt, receive, replay_now_s
from mechanism_service.core.learning import take_estimate
from mechanism_service.core.liveness import next_check_s, silence_reason, silent_workers
from mechanism_service.core.migration import note_move_cost
from mechanism_service.core.model import Entry, JobState, MechanismState, Placement, new_state
from mechanism_service.core.policy_input import allocation_fractions, allocation_request
from mechanism_service.core.profiling import choose as choose_profiling
from mechanism_service.core.rates import EstimatedRates, Rates, TableRates
from mechanism_service.core.reducers import (
    LeaseResult,
    NewJob,
    add_server,
    admission,
    apply_allocation,
    remove_job,
    remove_server,
    withdraw_job,
)
from mechanism_service.core.retention import KEEP_ALL, Retention
from mechanism_service.core.rounds import (
    RoundClock,
    RoundPlan,
    RoundReport,
    Shuffle,
    admit_arrivals,
    begin_reset,
    close_round,
    force_reset_when_idle,
    open_round,
    round_report,
)
from mechanism_service.core.settings import MechanismSettings

log = structlog.get_logger("gavel.mechanism")

NO_DEADLINE_S = 1e18  # finite (the wire refuses infinities), and far beyond any clock
STATUS_PART_CHARS = 60_000  # under the codec's 64 KiB limit on one string
SNAPSHOT_EVERY_EVENTS = 20_000  # at most this many inputs replayed after a restart (~0.15 s), plus a round's
# Solves at one boundary: each one after the first sets aside at least one job the policy refused
# the problem because of, so this bounds a boundary's time, not the jobs that can be set aside
# (the rest go at the next boundary).
SOLVES_PER_BOUNDARY = 8
MAX_WORKER_GPUS = 1024
NO_LAUNCH = ("", "")  # a job's command and working directory when it gave neither: its type's catalog entry
NO_ANSWER_GRACE_S = 2.0  # a policy replica answers in milliseconds; after this, ask who listens


@dataclasses.dataclass(frozen=True, slots=True)
class Lease:
    lease_id: str
    entry: Entry
    placement: Placement
    dispatched_at_s: float


@dataclasses.dataclass(frozen=True, slots=True)
class Forgotten:
    """What one boundary forgot under the retention rule, handed to the ``archive`` (the
    simulator keeps it: its results are every job and round). After a restart the same items
    may be handed over again (forgotten after the last snapshot, then replayed): ``jobs`` by
    id, rounds by ``round_id`` and solve times from ``first_solve`` are what identify them."""

    jobs: tuple[JobState, ...]  # completed and failed, as the state held them
    rejected: tuple[str, ...]  # ids refused (on receipt, or set aside by the policy)
    rounds: tuple[RoundReport, ...]
    first_solve: int  # the index of solve_times_s[0] among every solve since the start
    solve_times_s: tuple[float, ...]


@dataclasses.dataclass
class Memory:
    """Everything the mechanism must remember across a restart (the journal's snapshot)."""

    state: MechanismState | None = None
    servers: dict[str, list[tuple[str, int]]] = dataclasses.field(default_factory=lambda: collections.defaultdict(list))
    submitted: list[NewJob] = dataclasses.field(default_factory=list)  # accepted, not yet admitted
    # arrived, but the cluster as it is cannot run them (a live cluster may grow): with why
    held: list[tuple[NewJob, str]] = dataclasses.field(default_factory=list)
    intake: Intake = dataclasses.field(default_factory=Intake)  # every id accepted, the batches
    cancelling: dict[str, str] = dataclasses.field(default_factory=dict)  # active job id -> why: leaves at the next boundary
    refused_workers: dict[str, str] = dataclasses.field(default_factory=dict)  # worker id -> why
    policy: str = ""  # the policy and preset this memory was made under: a restart under
    preset: str = ""  # others is said in the log
    expected: dict[str, Lease] = dataclasses.field(default_factory=dict)  # leases of the running round
    reports: dict[str, list[JobProgress]] = dataclasses.field(default_factory=dict)
    round_clock: RoundClock = dataclasses.field(default_factory=RoundClock)
    round_id: int = 0
    running: tuple[float, RoundPlan, bool] | None = None  # (start, plan, reset) of the running round
    round_reports: list[RoundReport] = dataclasses.field(default_factory=list)
    solve_times_s: list[float] = dataclasses.field(default_factory=list)
    last_boundary_s: float = 0.0
    now_s: float = 0.0  # lockstep time
    shuffle: Shuffle | None = None
    commands: list[bytes] = dataclasses.field(default_factory=list)  # the last boundary's, encoded
    worker_of: dict[int, tuple[str, int]] = dataclasses.field(default_factory=dict)  # GPU id -> (worker, index)
    # The estimator's latest word (estimated rates only): applied at the next boundary, in the
    # order it came, so the schedule does not depend on when a message lands within a round.
    book: EstimateBook = dataclasses.field(default_factory=EstimateBook)
    pending_estimates: list[ThroughputEstimated] = dataclasses.field(default_factory=list)
    user_estimates: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)  # job -> its submitter's estimate
    ended_jobs: set[str] = dataclasses.field(default_factory=set)  # left the cluster: late estimates are dropped
    observations: status_core.Observations = dataclasses.field(default_factory=status_core.Observations)
    allocations: dict[str, bytes] = dataclasses.field(default_factory=dict)  # replies replayed from the journal
    epoch: int = 0  # this mechanism's incarnation: one more at every start; every command carries it
    # job id -> (command, working directory) for the jobs that gave either (JobSpec); here, not in
    # NewJob or JobState, whose slotted pickles in older snapshots could not take a new field
    launch: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    # watched workers (they sent a heartbeat) -> when they were last heard, mechanism time
    last_heard_s: dict[str, float] = dataclasses.field(default_factory=dict)
    lost_workers: dict[str, dict[str, object]] = dataclasses.field(default_factory=dict)  # id -> type, gpus, lost_at_s, reason
    # joined worker id -> the process that holds it (WorkerRegistered.instance; core/membership.py)
    instances: dict[str, str] = dataclasses.field(default_factory=dict)
    owners: dict[str, ownership.Owner] = dataclasses.field(default_factory=dict)  # job id -> who submitted it
    ended_leases: dict[str, str] = dataclasses.field(default_factory=dict)  # running round's leases ended early -> why
    resolve_now: bool = False  # a worker was lost: solve again at the next boundary, whatever the interval
    # Retention (core/retention.py): every finished job id -> when it ended, in that order (what
    # is forgotten first), and how many round reports and solve times were forgotten already
    ended_at_s: dict[str, float] = dataclasses.field(default_factory=dict)
    rounds_forgotten: int = 0
    solves_forgotten: int = 0


def _upgraded(memory: Memory) -> Memory:
    """A snapshot written by an earlier version: the fields it lacks get their defaults (pickle
    restores the attributes an object had when it was written, and no others)."""
    for holder, cls in ((memory, Memory), (memory.observations, status_core.Observations)):
        for f in dataclasses.fields(cls):
            if f.name not in vars(holder):
                default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default  # type: ignore[misc]
                setattr(holder, f.name, default)
    vars(memory).pop("estimates", None)  # provenance only, before the estimate book
    if memory.state is not None:
        present = _slots_set(memory.state)
        for f in dataclasses.fields(MechanismState):
            if f.name not in present and f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                setattr(memory.state, f.name, f.default_factory())  # type: ignore[misc]
    legacy_known = vars(memory).pop("known_jobs", None)  # a set of ids, before specs were kept
    if legacy_known:
        memory.intake.known.update(dict.fromkeys(legacy_known))
    vars(memory).pop("sealed", None)
    if not memory.ended_at_s and memory.state is not None:  # written before retention: its ended jobs
        obs = memory.observations  # are forgotten under the rule as if they ended when the mechanism began
        memory.ended_at_s = dict.fromkeys([*(j.job_id for j in memory.state.completed), *obs.cancelled, *obs.rejected], 0.0)
    return memory


ANOTHER_PROCESS = " (another process, on "  # workers_refused: "<id> (another process, on <host>)"


def _slots_set(state: MechanismState) -> set[str]:
    """The slots of a (slotted) state object that hold a value."""
    return {name for name in type(state).__slots__ if hasattr(state, name)}


class MechanismService:
    name = "mechanism"

    def __init__(
        self,
        *,
        clock: Clock,
        settings: MechanismSettings,
        policy: str,
        table: ThroughputTable,
        shuffle: Shuffle,
        estimates: bool = False,
        seed: int = 0,
        solver: str | None = None,
        allocation_timeout_s: float = 60.0,
        stop_when: Callable[[MechanismState], bool] | None = None,
        more_arrivals: Callable[[], bool] | None = None,
        lockstep: bool = False,
        expected_gpus: int | None = None,
        journal: Journal | None = None,
        round_timeout_s: float | None = None,
        deadlines: bool = True,
        elastic_types: tuple[str, ...] = (),
        admission_batch_s: float = 0.0,
        crash_point: Callable[[str], None] | None = None,
        retention: Retention = KEEP_ALL,
        archive: Callable[[Forgotten], None] | None = None,
        owners: ownership.Ownership = ownership.Ownership(),
    ) -> None:
        self.crash_reason = ""  # why the round loop stopped, when it did (ServiceError: on purpose)
        self._clock: Clock = LockstepClock() if lockstep else clock
        self._ownership = owners  # who owns a job, who may cancel it (core/ownership.py)
        self._lockstep = lockstep
        self._settings = settings
        self._policy = policy
        # A table taken as the truth (rates looked up by job type), or the estimator's estimates
        # with the table as their prior (core/rates.py).
        self._table = table
        self._estimates = estimates
        self._seed = seed
        self._solver = solver
        self._allocation_timeout_s = allocation_timeout_s
        self._stop_when = stop_when
        # Whether more jobs are known to be on their way (a trace replay knows; a live cluster
        # does not, and then an idle boundary re-solves at once).
        self._more_arrivals = more_arrivals or (lambda: False)
        self._expected_gpus = expected_gpus
        self._journal = journal
        # A live round ends when its leases report, or this long after it began (a worker that
        # never reports must not stop the cluster); lockstep and virtual time wait for all.
        self._round_timeout_s = round_timeout_s
        self._deadlines = deadlines and not lockstep
        # A live cluster grows as workers join: a job waits for a type that can run it rather
        # than being refused because no such worker has joined yet.
        self._elastic_types = elastic_types
        # Live: wait this long (wall time) after a submission wakes an idle loop, so a burst is
        # admitted by one boundary. Virtual and lockstep time need none (nothing races them).
        self._admission_batch_s = admission_batch_s
        # Fault injection (sim/faults.py): called with the name of each point where a crash
        # matters to durability ("boundary.before_journal": the boundary's commands are not
        # written yet; "boundary.after_journal": written, none published); raising there is a
        # crash of the round loop, as a SIGKILL would be.
        self._crash_point = crash_point or (lambda point: None)
        # What is over is forgotten under this rule at each boundary (core/retention.py), and
        # handed to ``archive`` first when one is given
        self._retention = retention
        self._archive = archive
        self._pool_changed = True  # workers joined or left since the last audit record (and at a start)
        self.memory = Memory(shuffle=shuffle, policy=policy, preset=settings.preset)
        self._rates: Rates = self._make_rates()
        # Workers must time their leases as we time rounds (issue 9: a scaled mechanism and a
        # wall-clock fleet stalled without a word); "" (virtual time in one process): not checked.
        self._clock_name = describe_clock(self._clock, lockstep=lockstep)
        self._cluster_grew = False  # a worker joined since the last boundary (held jobs may fit)
        self._job_types_here: tuple[str, ...] | None = None
        self._bus: Bus | None = None
        self._wake = asyncio.Event()  # something arrived: a submission, a report, a seal
        self._pending_request: tuple[str, asyncio.Future[Message]] | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self.stopped = asyncio.Event()
        self.crashed = asyncio.Event()  # the round loop died: the host stops (a supervisor restarts us)
        self._log = log.bind(policy=policy, preset=settings.preset)
        self._commit_waiter: asyncio.Future[None] | None = None
        self._idle_boundaries = 0  # boundaries in a row that ran nothing while jobs waited
        self._watch_task: asyncio.Task[None] | None = None
        self._refenced_at_s: dict[str, float] = {}  # lost worker -> when it was last told again

    def _make_rates(self) -> Rates:
        """Bound to the memory's book and users' estimates (remade when a journal replaces the memory)."""
        if self._estimates:
            return EstimatedRates(self.memory.book, self._table, self.memory.user_estimates)
        return TableRates.of(self._table)

    # -- views for drivers and tests --------------------------------------------------------------

    @property
    def state(self) -> MechanismState | None:
        return self.memory.state

    @property
    def reports(self) -> list[RoundReport]:
        return self.memory.round_reports

    @property
    def solve_times_s(self) -> list[float]:
        return self.memory.solve_times_s

    @property
    def last_boundary_s(self) -> float:
        return self.memory.last_boundary_s

    @property
    def rejected(self) -> list[str]:
        return list(self.memory.observations.rejected)

    @property
    def has_submissions(self) -> bool:
        return bool(self.memory.submitted)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        if self._journal is not None:
            await self._recover(self._journal)
        self._begin_epoch()
        # Registrations and heartbeats on one queue: a worker's heartbeat follows its registration.
        await bus.subscribe(
            "mechanism.workers", [WorkerRegistered.ROUTING_KEY, WorkerHeartbeat.ROUTING_KEY, WorkerIdInUse.ROUTING_KEY],
            self.on_worker,
        )
        # Several handlers at a time so that their journal writes share a commit; each records
        # and applies its message before its first await, so arrival order is kept.
        await bus.subscribe(
            MECHANISM_SUBMISSIONS.name, list(MECHANISM_SUBMISSIONS.bindings),
            self.on_submitted,
            prefetch=512, concurrency=128,
        )
        await bus.subscribe("mechanism.progress", [JobProgress.ROUTING_KEY], self.on_progress, prefetch=512, concurrency=128)
        await bus.subscribe(
            "mechanism.allocations", [AllocationComputed.ROUTING_KEY, AllocationFailed.ROUTING_KEY], self.on_allocation
        )
        await bus.subscribe("mechanism.throughputs", [ThroughputEstimated.ROUTING_KEY], self.on_estimate)
        await bus.subscribe("mechanism.status", [StatusRequested.ROUTING_KEY], self.on_status)
        if self.memory.commands:
            await self._republish()
        loop = asyncio.get_running_loop()
        self._loop_task = loop.create_task(self._round_loop(), name="mechanism-rounds")
        if self._settings.worker_grace_s is not None:
            self._watch_task = loop.create_task(self._watch_workers(self._settings.worker_grace_s), name="mechanism-workers")

    async def stop(self) -> None:
        for task in (self._loop_task, self._watch_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._journal is not None:
            # a round loop that crashed part way through a boundary leaves nothing of it, as a
            # killed process would not (a restart re-does the boundary from the journal)
            if self.crashed.is_set():
                self._journal.abandon()
            else:
                self._journal.close()

    def _begin_epoch(self) -> None:
        """A new incarnation: its epoch is journaled at once (a second restart before the next
        snapshot must not reuse it), and every watched worker gets a fresh grace (nothing could be
        heard while the mechanism was down)."""
        memory = self.memory
        memory.epoch += 1
        now_s = self._clock.now_s()
        memory.last_heard_s = dict.fromkeys(memory.last_heard_s, now_s)
        if self._journal is not None:
            self._journal.append("epoch", str(memory.epoch).encode(), now_s)
            self._journal.commit()
        self._log = self._log.bind(epoch=memory.epoch)

    # -- handlers: journal what arrived, wake the loop --------------------------------------------

    def _record(self, kind: str, d: Delivery, at_s: float | None = None, message: Message | None = None) -> None:
        """Journal an accepted input as it came (``message``: as the mechanism completed it)."""
        if self._journal is not None:
            body = wire_bytes(d) if message is None else DEFAULT_CODEC.encode(
                message, source=d.envelope.source, sent_at_s=d.envelope.sent_at_s, message_id=d.envelope.message_id,
            )
            self._journal.append(kind, body, at_s)

    def _audit_end(self, job_id: str, outcome: str, reason: str, now_s: float) -> None:
        """A job's end (or a submission refused on receipt) in the audit trail, committed with
        the next commit (a boundary's, or its handler's); and when, for the retention rule."""
        ended = self.memory.ended_at_s
        ended.pop(job_id, None)  # (a refused id submitted again and ended again: its latest end)
        ended[job_id] = now_s
        if self._journal is not None:
            record = audit.EndRecord(job_id, outcome, reason, now_s, self.memory.epoch)
            self._journal.append(audit.ENDED, audit.encode_end(record), now_s)

    async def _durable(self) -> None:
        """Return once what was recorded is committed (one commit for every handler waiting)."""
        if self._journal is None or not self._journal_pending():
            return
        if self._commit_waiter is None:
            loop = asyncio.get_running_loop()
            self._commit_waiter = loop.create_future()
            loop.call_soon(self._commit)
        await asyncio.shield(self._commit_waiter)

    def _journal_pending(self) -> bool:
        return self._journal is not None and self._journal.pending

    def _commit(self) -> None:
        waiter, self._commit_waiter = self._commit_waiter, None
        assert waiter is not None and self._journal is not None
        try:
            self._journal.commit()
        except Exception as e:  # noqa: BLE001 - every waiting handler fails, so nothing is acked
            waiter.set_exception(e)
        else:
            waiter.set_result(None)


    async def on_worker(self, d: Delivery) -> None:
        w = d.message
        if isinstance(w, WorkerHeartbeat):
            await self._on_heartbeat(w)
            return
        if isinstance(w, WorkerIdInUse):
            self._note_id_in_use(w)
            return
        assert isinstance(w, WorkerRegistered)
        held = self._held(w.worker_id)
        verdict = membership.verdict(held, w.accelerator_type, w.gpu_count, w.instance)
        if verdict is membership.Verdict.REPEAT:
            return  # registered already (a periodic re-announcement, or a redelivery)
        problem = self._worker_problem(w)
        if verdict is membership.Verdict.REFUSE and held is not None:
            problem = membership.refusal(w.worker_id, held, w.accelerator_type, w.gpu_count)
        if problem:
            # One worker must not stop the cluster: it stays out, and says why once (it keeps
            # re-announcing itself; `gavel cluster` lists it under workers_refused).
            if self.memory.refused_workers.get(w.worker_id) != problem:
                self.memory.refused_workers[w.worker_id] = problem
                self._log.error("worker_refused", worker_id=w.worker_id, reason=problem)
                # and to the worker, whose own log would otherwise say nothing (not mandatory:
                # a worker from before this message has no queue for it, and needs none)
                await self._publish(WorkerRefused(w.worker_id, self.memory.epoch, problem))
            return
        self.memory.refused_workers.pop(w.worker_id, None)
        if verdict is membership.Verdict.REPLACE and held is not None:
            # the old process's leases end now, as a lost worker's do; its fence names the process
            # that replaced it, so that it stops for good if it is somehow still there
            reason = membership.replacement(held, w.accelerator_type, w.gpu_count, w.instance)
            await self._declare_lost(w.worker_id, reason, self._clock.now_s(), replaced_by=w.instance)
        self._record("worker", d)
        self._apply_worker(w)
        self._wake.set()
        await self._durable()

    def _held(self, worker_id: str) -> membership.Held | None:
        """The worker joined under this id (None: none, or it was declared lost)."""
        for accelerator_type, servers in self.memory.servers.items():
            for known, gpus in servers:
                if known == worker_id:
                    return membership.Held(accelerator_type, gpus, self.memory.instances.get(worker_id, ""))
        return None

    def _note_id_in_use(self, w: WorkerIdInUse) -> None:
        """A second process tried to start as a live worker and was refused at the broker: say so
        where an operator looks (`gavel cluster`, workers_refused), once per host and shape."""
        key = f"{w.worker_id}{ANOTHER_PROCESS}{w.host or 'an unknown host'})"
        why = f"{w.accelerator_type} with {w.gpu_count} GPU(s): {w.reason}"
        if self.memory.refused_workers.get(key) != why:
            self.memory.refused_workers[key] = why
            self._log.error("worker_refused", worker_id=w.worker_id, host=w.host, reason=w.reason)

    def _worker_problem(self, w: WorkerRegistered) -> str:
        """Why this worker cannot join ("" when it can)."""
        if not w.worker_id or not w.accelerator_type:
            return "a worker needs an id and an accelerator type"
        per_server = self._settings.gpus_per_server
        if not 1 <= w.gpu_count <= MAX_WORKER_GPUS or w.gpu_count % per_server:
            return (
                f"worker {w.worker_id!r} has {w.gpu_count} GPUs; this mechanism places gangs on servers of "
                f"{per_server} GPU(s) (--gpus-per-server), so a worker needs a positive multiple of that"
            )
        if w.clock and self._clock_name and w.clock != self._clock_name:
            return (
                f"worker {w.worker_id!r} runs on the {w.clock} clock and this mechanism on the {self._clock_name} "
                "clock, so its leases would never end when rounds do: start both with the same --time-scale "
                "(or both with --lockstep, or neither)"
            )
        return ""

    def _forget_id_conflicts(self, worker_id: str) -> None:
        """A second process's attempt on an id is moot once the id's holder is another process
        (a restart) or gone: `gavel workers` stops listing it."""
        refused = self.memory.refused_workers
        for key in [k for k in refused if k.startswith(f"{worker_id}{ANOTHER_PROCESS}")]:
            del refused[key]

    def _apply_worker(self, w: WorkerRegistered) -> None:
        memory = self.memory
        memory.servers[w.accelerator_type].append((w.worker_id, w.gpu_count))
        memory.instances[w.worker_id] = w.instance
        self._forget_id_conflicts(w.worker_id)
        self._cluster_grew = True
        self._pool_changed = True
        self._job_types_here = None
        rejoined = memory.lost_workers.pop(w.worker_id, None) is not None  # a lost worker comes back as a new server
        if memory.state is not None:  # joined a running cluster
            ids = add_server(memory.state, w.accelerator_type, w.gpu_count, self._settings, self._rates)
            memory.worker_of.update({gpu: (w.worker_id, k) for k, gpu in enumerate(ids)})
            self._log.info(
                "worker_rejoined" if rejoined else "worker_joined", worker_id=w.worker_id,
                accelerator_type=w.accelerator_type, gpus=w.gpu_count,
            )

    async def _on_heartbeat(self, beat: WorkerHeartbeat) -> None:
        """A registered worker is watched from its first heartbeat on (not journaled: liveness is
        observed, and a restart gives every watched worker a fresh grace). A lost worker that
        still beats missed its fence, or was cut off and is back: it is told again (at most once a
        grace), since it must stop its jobs and register anew."""
        memory = self.memory
        now_s = self._clock.now_s()
        lost = memory.lost_workers.get(beat.worker_id)
        if lost is not None:
            grace_s = self._settings.worker_grace_s or 0.0
            if now_s - self._refenced_at_s.get(beat.worker_id, -NO_DEADLINE_S) >= grace_s:
                self._refenced_at_s[beat.worker_id] = now_s
                await self._publish(WorkerFenced(beat.worker_id, memory.epoch, str(lost["reason"]), instance=beat.instance))
            return
        if membership.beats_for(self._held(beat.worker_id), beat.instance):
            memory.last_heard_s[beat.worker_id] = now_s

    # -- workers that fall silent -------------------------------------------------------------------

    async def _watch_workers(self, grace_s: float) -> None:
        """Declare lost the watched workers silent for longer than the grace (on the mechanism's
        clock), each at most a margin after its deadline."""
        memory = self.memory
        try:
            while True:
                for worker_id in silent_workers(memory.last_heard_s, grace_s, self._clock.now_s()):
                    now_s = self._clock.now_s()
                    heard_s = memory.last_heard_s.get(worker_id)
                    if heard_s is not None and now_s - heard_s > grace_s:  # not heard meanwhile
                        await self._declare_lost(worker_id, silence_reason(heard_s, grace_s, now_s), now_s)
                await self._clock.sleep(next_check_s(memory.last_heard_s, grace_s, self._clock.now_s()))
        except asyncio.CancelledError:
            raise
        except Exception:
            self._log.exception("worker_watch_crashed")
            self.crashed.set()
            raise

    async def _declare_lost(self, worker_id: str, reason: str, now_s: float, replaced_by: str = "") -> None:
        """Journal the decision (it depends on time: a replay applies it, never decides again),
        apply it, then tell the worker and the rest of its gangs."""
        instance = self.memory.instances.get(worker_id, "")
        fence = WorkerFenced(worker_id, self.memory.epoch, reason, instance=instance, replaced_by=replaced_by)
        if self._journal is not None:
            self._journal.append("lost", DEFAULT_CODEC.encode(fence, source=self.name, sent_at_s=now_s), now_s)
        gpus, ended, kills = self._apply_loss(worker_id, reason, now_s)
        await self._durable()
        self._log.warning(
            "worker_restarted" if replaced_by else "worker_lost", worker_id=worker_id, reason=reason, gpus=gpus,
            leases_ended=ended, action="its jobs run again from their last credited steps"
            + ("" if replaced_by else "; its GPUs leave the cluster"),
        )
        self._refenced_at_s[worker_id] = now_s
        await self._publish(fence)  # not mandatory: a dead worker's queue may be gone
        for kill in kills:
            await self._publish(kill)

    def _apply_loss(self, worker_id: str, reason: str, now_s: float) -> tuple[int, list[str], list[KillJobs]]:
        """The worker's GPUs leave (core.reducers.remove_server); its leases in the running round
        end now, with what they reported so far; the allocation is solved again at the next
        boundary. Returns its GPU count, the leases ended, and the kills for the other workers of
        its gangs."""
        memory = self.memory
        found = next(((w, count) for w, servers in memory.servers.items() for known, count in servers if known == worker_id), None)
        if found is None:
            return 0, [], []  # not registered (lost already)
        accelerator_type, gpus = found
        memory.servers[accelerator_type].remove((worker_id, gpus))
        memory.last_heard_s.pop(worker_id, None)
        memory.instances.pop(worker_id, None)
        self._forget_id_conflicts(worker_id)
        self._pool_changed = True
        memory.lost_workers[worker_id] = {"accelerator_type": accelerator_type, "gpus": gpus, "lost_at_s": now_s, "reason": reason}
        self._job_types_here = None
        gone = sorted(g for g, (known, _) in memory.worker_of.items() if known == worker_id)
        ended, kills = [], []
        for lease_id, lease in memory.expected.items():
            if lease_id in memory.ended_leases or not set(gone).intersection(lease.placement.worker_ids):
                continue
            if len(memory.reports.get(lease_id, [])) >= len(lease.entry):
                continue  # reported in full before the loss: settled as it is
            memory.ended_leases[lease_id] = f"worker {worker_id} lost: {reason}"
            ended.append(lease_id)
            kills += [
                KillJobs(other, memory.round_id - 1, lease_id, memory.epoch, f"worker {worker_id} of this gang was lost")
                for other, _ in self._workers_of(lease.placement)
                if other != worker_id
            ]
        if memory.state is not None and gone:
            remove_server(memory.state, accelerator_type, gone)
            memory.resolve_now = True
        for gpu in gone:
            del memory.worker_of[gpu]
        if memory.expected and self._round_complete():
            self._wake.set()  # the round waited only for this worker: it ends now, not at its timeout
        return gpus, ended, kills

    async def on_submitted(self, d: Delivery) -> None:
        """The submissions queue: jobs, the seal that ends a batch, and cancels (in the order they
        were sent, so a cancel follows the job it names)."""
        message = d.message
        if isinstance(message, SubmissionsSealed):
            await self._on_sealed(d, message)
        elif isinstance(message, CancelJob):
            await self._on_cancel(d, message)
        else:
            assert isinstance(message, JobSubmitted)
            await self._on_job(d, message)

    async def _on_job(self, d: Delivery, message: JobSubmitted) -> None:
        forged = ownership.unverified(message.broker_user, d.user_id)
        if forged:  # nothing of it is accepted, so nothing is journaled (a replay could not check it)
            self.memory.observations.rejected.setdefault(message.spec.job_id, f"not accepted: {forged}")
            await self._publish_rejection(message.spec.job_id, f"not accepted: {forged}")
            return
        completed = None
        if d.user_id and not message.broker_user:  # a client that did not say: the broker's word, kept
            message = completed = dataclasses.replace(message, broker_user=d.user_id)
        now_s = self._clock.now_s()
        receipt = self._receive(message, now_s)
        if receipt.outcome in ("new", "refused"):
            # journaled with the arrival it was given (a replay's arrivals are in the trace); an
            # absorbed duplicate or a conflict changes nothing worth replaying
            stamp = receipt.job.arrival_s if receipt.job is not None and not self._lockstep else None
            self._record("submitted", d, stamp, completed)
        if receipt.outcome == "refused":
            self._audit_end(message.spec.job_id, audit.REFUSED, receipt.reason, now_s)
        if receipt.outcome == "new":
            self._wake.set()
        await self._durable()
        if receipt.outcome in ("refused", "conflict"):
            await self._publish_rejection(message.spec.job_id, receipt.reason)

    def _receive(self, message: JobSubmitted, now_s: float) -> Receipt:
        memory = self.memory
        if self._job_types_here is None:  # the types a job may run on: those here, and any that may join
            servers = (w for w, registered in memory.servers.items() if registered)
            self._job_types_here = tuple(dict.fromkeys([*servers, *self._elastic_types]))
        receipt = receive(
            memory.intake, message, now_s, lockstep=self._lockstep, rates=self._rates, types=self._job_types_here
        )
        job_id = message.spec.job_id
        if receipt.outcome == "new":
            assert receipt.job is not None
            memory.observations.rejected.pop(job_id, None)  # refused before, right this time
            memory.ended_jobs.discard(job_id)  # a refused id is free again
            memory.ended_at_s.pop(job_id, None)
            memory.submitted.append(receipt.job)
            spec = message.spec
            if spec.command or spec.working_dir:  # most jobs run their type's catalog entry: nothing to keep
                memory.launch[job_id] = (spec.command, spec.working_dir)
            if spec.throughput_estimate_steps_per_s:  # the prior until the estimator says more
                memory.user_estimates[job_id] = dict(spec.throughput_estimate_steps_per_s)
            owner = ownership.owner(message.submitted_by, message.broker_user, self._ownership)
            if owner.name:
                memory.owners[job_id] = owner
        elif receipt.outcome == "refused":
            memory.observations.rejected[job_id] = receipt.reason
            self._forget(job_id)
        elif receipt.outcome == "conflict":
            self._log.warning("submission_conflict", job_id=job_id, reason=receipt.reason)
        return receipt

    async def _publish_rejection(self, job_id: str, reason: str) -> None:
        """JobRejected, with an id derived from what it says: the same refusal published again (a
        redelivered submission) is recognisably the same, a different one for the same id is not."""
        digest = hashlib.blake2b(reason.encode(), digest_size=6).hexdigest()
        self._log.info("job_rejected", job_id=job_id, reason=reason)
        await self._publish(JobRejected(job_id, reason), f"job-rejected:{job_id}:{digest}")

    async def _on_sealed(self, d: Delivery, message: SubmissionsSealed) -> None:
        self._record("sealed", d)
        # every submission of the batch was handled before this (one queue, applied in order)
        batch = self.memory.intake.batches.get(message.batch_id)
        waits = self._waits_for_workers(batch.received if batch is not None else set())
        summary = self.memory.intake.seal(message.batch_id, message.count)
        if waits:
            summary["waits_for_workers"] = waits
        if int(summary["received"]) < message.count:  # type: ignore[call-overload]
            # some of its messages never came (dead-lettered as undecodable): a lockstep replay
            # waits for the whole trace, so this one would wait for ever; say so
            self._log.warning("batch_incomplete", batch_id=message.batch_id, announced=message.count, received=summary["received"])
        self._wake.set()
        await self._durable()
        for job_id in message.not_accepted:
            if job_id not in self.memory.intake.known:
                # the broker refused it to this queue, not to the estimator's (only ours is
                # bounded): a job is known to all or to none
                await self._publish_rejection(job_id, "not accepted: the submissions queue was full")
        if message.reply_to:
            await self._reply(message.request_id, message.reply_to, summary, d)

    def _waits_for_workers(self, job_ids: set[str]) -> dict[str, str]:
        """The jobs of a batch (at most 20) that the cluster as it is cannot run, with why: a gang
        larger than any type has here is held until workers join, and the submitter hears so at
        once instead of finding it held for ever (issue 23)."""
        gpus = {w: sum(g for _, g in servers) for w, servers in self.memory.servers.items()}
        if not job_ids or not any(gpus.values()):  # no worker yet: every job waits, and that says nothing
            return {}
        waits: dict[str, str] = {}
        for job in self.memory.submitted:
            if job.job_id in job_ids and len(waits) < 20:
                verdict = admission(gpus, job, self._rates, elastic_types=self._elastic_types)
                if verdict.verdict == "hold":
                    waits[job.job_id] = verdict.reason
        return waits

    async def _on_cancel(self, d: Delivery, message: CancelJob) -> None:
        refused = self._cancel_refused(d, message)
        if refused:  # nothing changes, so nothing is journaled
            self._log.warning("cancel_refused", job_id=message.job_id, reason=refused)
            if message.reply_to:
                await self._reply(message.request_id, message.reply_to, {"error": refused}, d)
            return
        now_s = self._clock.now_s()
        changed, answer, event = self._cancel(message.job_id, message.reason, now_s)
        if changed:
            self._record("cancel", d, now_s)
        await self._durable()
        if changed:
            for kill in self._kills_for_cancel(message.job_id, message.reason):
                self._log.info("lease_killed", job_id=message.job_id, worker_id=kill.worker_id, lease_id=kill.lease_id)
                await self._publish(kill)  # not mandatory: a worker that is gone runs nothing
        if changed and event is not None:  # a job not admitted yet: cancelled at once
            self._audit_end(event.job_id, "cancelled", event.reason, now_s)
            await self._durable()
        if event is not None:
            await self._publish(event, f"job-end:{event.job_id}")  # again if it was before: deduplicated
        if message.reply_to:
            await self._reply(message.request_id, message.reply_to, answer, d)

    def _cancel_refused(self, d: Delivery, message: CancelJob) -> str:
        """Why this cancel is not allowed ("": it is): a broker user the broker did not validate,
        or a requester who is neither the job's owner nor an operator."""
        forged = ownership.unverified(message.broker_user, d.user_id)
        if forged:
            return f"cancel of {message.job_id!r} not accepted: {forged}"
        requester = ownership.owner(message.requested_by, message.broker_user or d.user_id, self._ownership)
        job_owner = self.memory.owners.get(message.job_id)
        if job_owner is None or ownership.may_cancel(job_owner, requester, self._ownership):
            return ""
        return ownership.refusal(message.job_id, job_owner, requester)

    def _kills_for_cancel(self, job_id: str, reason: str) -> list[KillJobs]:
        """A cancelled job that runs now is stopped now (a real worker would run it to its lease's
        end otherwise; its steps so far still count). Only a lease it runs alone: a packed
        partner keeps its round."""
        memory = self.memory
        state = memory.state
        if state is None or job_id not in memory.cancelling:
            return []
        for lease_id, lease in memory.expected.items():
            job = state.jobs.get(lease.entry[0])
            if len(lease.entry) != 1 or job is None or job.job_id != job_id:
                continue
            if lease_id in memory.ended_leases or memory.reports.get(lease_id):
                return []  # over already
            return [
                KillJobs(worker_id, memory.round_id - 1, lease_id, memory.epoch, f"cancelled: {reason}")
                for worker_id, _ in self._workers_of(lease.placement)
            ]
        return []

    def _cancel(self, job_id: str, reason: str, now_s: float) -> tuple[bool, dict[str, object], JobCancelled | None]:
        """(whether anything changed, the answer for the asker, the terminal event to publish).
        A job not admitted yet is cancelled at once; an admitted one leaves at the next boundary,
        after its running lease is settled (its steps so far count)."""
        memory, obs = self.memory, self.memory.observations
        if job_id in obs.cancelled:
            row = obs.cancelled[job_id]
            event = JobCancelled(job_id, str(row["reason"]), float(row["cancelled_at_s"]), int(row.get("steps_done", 0)))  # type: ignore[call-overload]
            return False, {"job_id": job_id, "state": "cancelled", "reason": row["reason"]}, event
        waiting = [j for j in memory.submitted if j.job_id == job_id] + [j for j, _ in memory.held if j.job_id == job_id]
        if waiting:
            memory.submitted = [j for j in memory.submitted if j.job_id != job_id]
            memory.held = [(j, why) for j, why in memory.held if j.job_id != job_id]
            memory.launch.pop(job_id, None)
            self._forget(job_id)
            obs.cancelled[job_id] = {**status_core.pending_row(waiting[0], "cancelled", reason), "cancelled_at_s": now_s}
            self._log.info("job_cancelled", job_id=job_id, reason=reason, admitted=False)
            return True, {"job_id": job_id, "state": "cancelled", "reason": reason}, JobCancelled(job_id, reason, now_s, 0)
        state = memory.state
        if state is not None and any(j.job_id == job_id for j in state.jobs.values()):
            if job_id in memory.cancelling:
                return False, {"job_id": job_id, "state": "cancelling", "reason": memory.cancelling[job_id]}, None
            memory.cancelling[job_id] = reason
            self._wake.set()
            return True, {
                "job_id": job_id, "state": "cancelling", "reason": reason,
                "note": "it is not scheduled again; it leaves when its current round ends",
            }, None
        ended = next((j for j in state.completed if j.job_id == job_id), None) if state is not None else None
        if ended is not None:
            how = "completed" if ended.steps_remaining <= 0 else "failed"
            return False, {"error": f"job {job_id!r} has already {how}: nothing to cancel"}, None
        if job_id in obs.rejected:
            return False, {"error": f"job {job_id!r} was rejected ({obs.rejected[job_id]}): nothing to cancel"}, None
        return False, {"error": f"no job {job_id!r}"}, None

    async def on_progress(self, d: Delivery) -> None:
        report = d.message
        assert isinstance(report, JobProgress)
        if not self._accepts(report):
            if self._fenced(report):
                self._log.info(
                    "report_refused", job_id=report.job_id, worker_id=report.worker_id, lease_id=report.lease_id,
                    reason="fenced: its worker was declared lost and its lease ended",
                )
            return  # a stale or duplicate report (at-least-once delivery): already counted
        self._record("progress", d)
        self._apply_progress(report)
        await self._durable()

    def _accepts(self, report: JobProgress) -> bool:
        memory = self.memory
        if report.lease_id not in memory.expected or self._fenced(report):
            return False
        return not any(r.job_id == report.job_id for r in memory.reports.get(report.lease_id, []))

    def _fenced(self, report: JobProgress) -> bool:
        """From a worker declared lost, or for a lease that ended with it: its steps are not
        counted (the lease was settled without them, and the job may run elsewhere already)."""
        return report.worker_id in self.memory.lost_workers or report.lease_id in self.memory.ended_leases

    def _apply_progress(self, report: JobProgress) -> None:
        memory = self.memory
        memory.reports.setdefault(report.lease_id, []).append(report)
        measured = attempts_core.measured(report)
        if measured is not None:
            memory.observations.measured[report.job_id] = measured
        if self._round_complete():
            self._wake.set()

    def _round_complete(self) -> bool:
        memory = self.memory
        return all(
            len(memory.reports.get(lid, [])) == len(lease.entry) or lid in memory.ended_leases
            for lid, lease in memory.expected.items()
        )

    async def on_allocation(self, d: Delivery) -> None:
        reply = d.message
        pending = self._pending_request
        if pending is None or getattr(reply, "request_id", None) != pending[0] or pending[1].done():
            return  # an answer to a request we gave up on
        self._record("allocation", d)
        await self._durable()
        if not pending[1].done():
            pending[1].set_result(reply)

    async def on_estimate(self, d: Delivery) -> None:
        """Kept (journaled) and applied at the next boundary (``_take_estimates``). A mechanism on a
        table's rates has no use for them."""
        estimate = d.message
        assert isinstance(estimate, ThroughputEstimated)
        if not self._estimates:
            return
        self._record("estimate", d)
        self.memory.pending_estimates.append(estimate)
        await self._durable()

    def _hear_estimates(self) -> list[ThroughputEstimated]:
        """The estimates that came before this boundary began (taken at its step 3): one that lands
        while the boundary runs waits for the next, so when a message lands within a round never
        changes the schedule."""
        pending, self.memory.pending_estimates = self.memory.pending_estimates, []
        return pending

    def _take_estimates(self, state: MechanismState, pending: list[ThroughputEstimated]) -> None:
        """Step 3 of a boundary: the estimates heard before it, in order."""
        memory = self.memory
        solve_again = False
        for estimate in pending:
            solve_again |= take_estimate(state, memory.book, estimate, self._rates, memory.ended_jobs)  # type: ignore[arg-type]
        if solve_again:
            self._log.info("estimates_changed", messages=len(pending), action="solving again at this boundary")

    def _throughput_report(self, job_id: str) -> list[dict[str, object]]:
        """What `gavel job` shows of a job's speed: per type the steps/s the mechanism schedules
        on, where it came from, and the estimator's confidence (a prior of its own has none)."""
        memory = self.memory
        job = next((j for j in memory.state.jobs.values() if j.job_id == job_id), None) if memory.state else None
        if job is None:
            return []
        book = memory.book
        out: list[dict[str, object]] = []
        for w in memory.state.gpus:  # type: ignore[union-attr]
            if not self._estimates:
                provenance, confidence = "oracle", 1.0
            elif w in book.rows.get(job_id, {}):
                provenance, confidence = book.provenance[job_id].get(w), book.confidence[job_id].get(w)
            else:  # the mechanism's own prior (core/rates.py)
                provenance, confidence = ("user" if w in memory.user_estimates.get(job_id, {}) else "prior"), None
            out.append({
                "type": w, "steps_per_s": round(self._rates.isolated(job, w), 6), "provenance": provenance,
                "confidence": confidence,
            })
        return out

    def _forget(self, job_id: str) -> None:
        """A job left the cluster (whichever way): its estimates and prior go with it."""
        memory = self.memory
        memory.book.forget(job_id)
        memory.user_estimates.pop(job_id, None)
        memory.ended_jobs.add(job_id)
        if memory.state is not None:
            memory.state.profiling.served.pop(job_id, None)
            memory.state.profiling.packed_served.pop(job_id, None)

    async def on_status(self, d: Delivery) -> None:
        request = d.message
        assert isinstance(request, StatusRequested) and self._bus is not None
        memory = self.memory
        obs = dataclasses.replace(
            memory.observations,
            waiting=[status_core.pending_row(j, "submitted") for j in memory.submitted],
            held=[status_core.pending_row(j, "held", why) for j, why in memory.held],
            cancelling=dict(memory.cancelling),
            workers_refused=dict(memory.refused_workers),
            workers_lost=dict(memory.lost_workers),
            owners={job_id: o.name for job_id, o in memory.owners.items()},
        )
        now_s = self._clock.now_s()
        body: object
        if request.query == "jobs":
            body = status_core.jobs_report(memory.state, now_s, obs)
        elif request.query == "job":
            body = status_core.job_report(memory.state, request.job_id, now_s, obs)
            if isinstance(body, dict) and "error" not in body:
                body["throughputs"] = self._throughput_report(request.job_id)
        elif request.query == "workers":
            body = status_core.workers_report(
                memory.state, memory.servers, memory.lost_workers, memory.last_heard_s, now_s, memory.book.stragglers,
                memory.refused_workers,
            )
        elif request.query == "cluster":
            body = status_core.cluster_report(memory.state, memory.servers, self._policy, now_s, obs, memory.round_id)
        else:
            body = {"error": f"unknown query {request.query!r} (jobs, job, workers, cluster)"}
        await self._reply(request.request_id, request.reply_to, body, d)

    async def _reply(self, request_id: str, reply_to: str, body: object, d: Delivery) -> None:
        """An answer to a command-line asker, on its own key, in parts of at most
        STATUS_PART_CHARS characters (the codec's limit on one string)."""
        assert self._bus is not None
        text = json.dumps(body)  # ASCII: characters are bytes
        parts = [text[i : i + STATUS_PART_CHARS] for i in range(0, len(text), STATUS_PART_CHARS)] or [""]
        for k, part in enumerate(parts):  # not mandatory: an asker that gave up has no queue any more
            reply = StatusReported(request_id, reply_to, part, k, len(parts))
            await self._bus.publish(reply, correlation_id=d.envelope.message_id, mandatory=False)

    # -- recovery ---------------------------------------------------------------------------------

    async def _recover(self, journal: Journal) -> None:
        """Rebuild the memory from the last snapshot and the inputs accepted after it."""
        memory, last_seq = journal.load_snapshot()
        if memory is not None:
            self.memory = _upgraded(memory)
            self._rates = self._make_rates()
            self._say_if_policy_changed()
        latest_s = self.memory.now_s
        replayed = 0
        for _, kind, body, at_s in journal.events(after_seq=last_seq):
            replayed += 1
            if kind == "epoch":  # a start since the snapshot: the next one is after it
                self.memory.epoch = max(self.memory.epoch, int(body))
                continue
            if kind in audit.AUDIT_KINDS:  # outputs, for the checker: never replayed
                continue
            message = DEFAULT_CODEC.decode(body).message
            if kind == "worker" and isinstance(message, WorkerRegistered):
                self._apply_worker(message)
            elif kind == "lost" and isinstance(message, WorkerFenced) and at_s is not None:
                # the decision as it was made (it depended on time): applied, not made again
                self._apply_loss(message.worker_id, message.reason, at_s)
                latest_s = max(latest_s, at_s)
            elif kind == "submitted" and isinstance(message, JobSubmitted):
                received_s = self._clock.now_s() if at_s is None else replay_now_s(message, at_s)
                self._receive(message, received_s)
                latest_s = max(latest_s, received_s)
            elif kind == "sealed" and isinstance(message, SubmissionsSealed):
                self.memory.intake.seal(message.batch_id, message.count)
            elif kind == "cancel" and isinstance(message, CancelJob) and at_s is not None:
                self._cancel(message.job_id, message.reason, at_s)
                latest_s = max(latest_s, at_s)
            elif kind == "progress" and isinstance(message, JobProgress) and self._accepts(message):
                self._apply_progress(message)
            elif kind == "estimate" and isinstance(message, ThroughputEstimated):
                self.memory.pending_estimates.append(message)
            elif kind == "allocation":
                self.memory.allocations[getattr(message, "request_id", "")] = body
        if isinstance(self._clock, (LockstepClock, ScaledClock)):
            # these clocks start at 0 in every process: carry on from the journal's time (a
            # scaled cluster loses the time it was down; the wall clock needs nothing)
            self._clock.advance_to(latest_s)
        if memory is not None or replayed:
            self._log.info(
                "mechanism_recovered", journal=str(journal.path), snapshot=memory is not None, events_replayed=replayed,
                round_id=self.memory.round_id, jobs_active=len(self.memory.state.jobs) if self.memory.state else 0,
            )

    def _say_if_policy_changed(self) -> None:
        """A journal made under another policy (or preset) resumes under this one: say so, and
        solve afresh (the allocation and a stateful policy's continuation are the old policy's)."""
        memory = self.memory
        before = (memory.policy, memory.preset)
        if memory.policy and before != (self._policy, self._settings.preset):
            self._log.warning(
                "policy_changed", journal_policy=memory.policy, journal_preset=memory.preset, policy=self._policy,
                preset=self._settings.preset, action="solving afresh under the new policy",
            )
            if memory.state is not None:
                memory.state.needs_allocation = True
                memory.state.policy_state = ""
        memory.policy, memory.preset = self._policy, self._settings.preset

    async def _republish(self) -> None:
        """The last boundary's commands again, same lease ids, under this incarnation's epoch: a
        worker that already has them repeats its report, and duplicate reports are absorbed. Not
        to a worker lost since, nor for a lease that ended with it."""
        assert self._bus is not None
        memory = self.memory
        count = 0
        for body in memory.commands:
            command = DEFAULT_CODEC.decode(body).message
            if getattr(command, "worker_id", "") in memory.lost_workers or getattr(command, "lease_id", "") in memory.ended_leases:
                continue
            if isinstance(command, (RunJobs, ExtendLease)):
                command = dataclasses.replace(command, epoch=memory.epoch)
            await self._bus.publish(command, mandatory=False)
            count += 1
        self._log.info("commands_republished", count=count)

    # -- the round loop ---------------------------------------------------------------------------

    async def _round_loop(self) -> None:
        settings = self._settings
        memory = self.memory
        try:
            if self._lockstep:
                await self._until(self._ready_for_lockstep)
            while True:
                # 0. stop (checked where Gavel checks it: before the next boundary is handled);
                # the round already dispatched still runs and is reported, not settled
                if memory.state is not None and self._stop_when is not None and self._stop_when(memory.state):
                    if memory.expected:
                        await self._until(self._round_complete)
                        self._collect_results()
                    break
                # 1. wait for the running round to end, or for work
                results: list[LeaseResult] = []
                failing: list[tuple[str, str]] = []
                lease_ids: list[str] = []
                if memory.expected:
                    await self._wait_for_round()
                    crashed = self._crashed_to_retry()
                    lease_ids = list(memory.expected)  # in the order of the results
                    results, failing = self._collect_results()
                    await self._wait_out_a_crash(crashed)  # the attempts say "crashed" meanwhile
                    if self._lockstep and results:
                        self._clock.advance_to(max(r.finish_s for r in results))  # type: ignore[attr-defined]
                else:
                    await self._wait_when_idle()
                    if self._admission_batch_s and memory.submitted:
                        # a burst of submissions (a trace) is admitted by one boundary, not one each
                        await asyncio.sleep(self._admission_batch_s)
                await self._clock.sleep(0)  # everything else due at this instant first
                heard = self._hear_estimates()  # later ones wait for the next boundary
                now_s = self._clock.now_s()
                memory.last_boundary_s = memory.now_s = now_s
                state = self._ensure_state()
                # 2. settle
                round_start_s = memory.round_clock.close(max(r.finish_s for r in results), settings) if results else now_s
                charging = audit.settling(lease_ids, results, state.jobs.get) if self._journal is not None else None
                finished = close_round(state, results, round_start_s, settings)
                settled = audit.settled_leases(charging) if charging is not None else []
                for job in finished:
                    await self._publish_end(job)
                finished += await self._fail_attempts(state, failing, now_s)
                if results:
                    ended = RoundEnded(memory.round_id - 1, now_s, tuple(j.job_id for j in finished))
                    await self._publish(ended, f"round-ended:{ended.round_id}")
                await self._withdraw_cancelled(state, now_s)
                # 3. admit the jobs whose arrival has come (and those held until the cluster fits)
                self._take_estimates(state, heard)
                await self._admit(state, now_s)
                # 4. allocation (not for an empty cluster: there is nothing to allocate yet); at once
                # after a worker was lost, whatever the interval (its GPUs are in the allocation)
                reset = sum(state.gpus.values()) > 0 and begin_reset(
                    state, now_s, settings, force=memory.resolve_now, rates=self._rates
                )
                if reset:
                    memory.resolve_now = False
                    await self._reallocate(state, now_s)
                self._retire(state, now_s)
                # 5. plan, journal, dispatch
                assert memory.shuffle is not None
                plan = open_round(state, now_s, settings, memory.shuffle, self._profiling(state))
                memory.round_clock.dispatched_at_s = now_s
                await self._dispatch(state, plan, now_s, bool(reset), settled=settled, any_settled=bool(results))
                if plan.assignment:
                    self._idle_boundaries = 0
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._log.exception("round_loop_crashed")
            # a stop on purpose says why in its words (a simulation's jobs that can never run)
            self.crash_reason = str(e) if isinstance(e, ServiceError) else ""
            self.crashed.set()
            raise
        finally:
            self.stopped.set()

    def _retire(self, state: MechanismState, now_s: float) -> None:
        """Forget what is over under the retention rule (core/retention.py): finished jobs with
        everything kept about them, the oldest round reports and solve times, the oldest lost
        workers. Deterministic from the memory and the time, so a replay forgets the same."""
        if self._retention.keeps_all:
            return
        memory, obs, rule = self.memory, self.memory.observations, self._retention
        expired = retention_core.expired_jobs(memory.ended_at_s, now_s, rule)
        jobs: list[JobState] = []
        rejected: list[str] = []
        if expired:
            gone = set(expired)
            kept = []
            for job in state.completed:
                (jobs if job.job_id in gone else kept).append(job)
            state.completed = kept
            rejected = [job_id for job_id in expired if job_id in obs.rejected]
            for job_id in expired:
                del memory.ended_at_s[job_id]
                for held in (
                    obs.history, obs.history_dropped, obs.attempts, obs.measured, obs.failed, obs.cancelled, obs.rejected,
                    memory.launch, memory.owners,
                ):
                    held.pop(job_id, None)
                memory.intake.known.pop(job_id, None)  # the id is free again (module docstring)
                memory.ended_jobs.discard(job_id)
            obs.forgotten_jobs += len(expired)
        rounds = retention_core.excess(len(memory.round_reports), rule.rounds)
        solves = retention_core.excess(len(memory.solve_times_s), rule.rounds)
        if self._archive is not None and (jobs or rejected or rounds or solves):
            self._archive(Forgotten(
                tuple(jobs), tuple(rejected), tuple(memory.round_reports[:rounds]), memory.solves_forgotten,
                tuple(memory.solve_times_s[:solves]),
            ))
        if rounds:
            del memory.round_reports[:rounds]
            memory.rounds_forgotten += rounds
        if solves:
            del memory.solve_times_s[:solves]
            memory.solves_forgotten += solves
        for forgotten in (memory.lost_workers, memory.refused_workers):
            for worker_id in list(itertools.islice(forgotten, retention_core.excess(len(forgotten), rule.lost_workers))):
                del forgotten[worker_id]
                self._refenced_at_s.pop(worker_id, None)

    def _profiling(self, state: MechanismState) -> list:
        """The profiling runs of this round: what the estimator asked for, within its share."""
        book = self.memory.book
        if not self._estimates or not book.profiling:
            return []
        return choose_profiling(state, book.profiling, book.profiling_share, packing=self._settings.packing)

    async def _withdraw_cancelled(self, state: MechanismState, now_s: float) -> None:
        """Cancelled jobs leave, after their last round was settled (a job that completed in it
        completed: one terminal state each)."""
        memory = self.memory
        for job_id, reason in memory.cancelling.items():
            index = next((i for i, j in state.jobs.items() if j.job_id == job_id), None)
            if index is None:
                continue
            job = withdraw_job(state, index)
            memory.launch.pop(job_id, None)
            self._forget(job_id)
            memory.observations.cancelled[job_id] = status_core.cancelled_row(job, reason, now_s)
            self._log.info("job_cancelled", job_id=job_id, reason=reason, admitted=True, steps_done=job.steps_done)
            self._audit_end(job_id, "cancelled", reason, now_s)
            await self._publish(JobCancelled(job_id, reason, now_s, job.steps_done), f"job-end:{job_id}")
        memory.cancelling.clear()

    async def _admit(self, state: MechanismState, now_s: float) -> None:
        memory = self.memory
        arrived = [j for j in memory.submitted if j.arrival_s <= now_s]
        if arrived:
            memory.submitted = [j for j in memory.submitted if j.arrival_s > now_s]
        due = arrived
        if self._cluster_grew:
            # Only new workers can change a held job's verdict: look at them again only then (every
            # boundary would make a trace that arrives before its fleet quadratic to take in).
            due = [job for job, _ in memory.held] + arrived
            memory.held = []
            self._cluster_grew = False
        arrived_ids = {j.job_id for j in arrived}
        newly_held: list[tuple[NewJob, str]] = []
        for job, verdict in admit_arrivals(state, due, self._settings, self._rates, self._elastic_types):
            if verdict.verdict == "hold":
                memory.held.append((job, verdict.reason))
                if job.job_id in arrived_ids:
                    newly_held.append((job, verdict.reason))
                continue
            memory.observations.rejected[job.job_id] = verdict.reason
            memory.intake.known.pop(job.job_id, None)  # nothing of it was accepted: the id is free again
            self._forget(job.job_id)
            memory.launch.pop(job.job_id, None)
            self._audit_end(job.job_id, "rejected", verdict.reason, now_s)
            await self._publish_rejection(job.job_id, verdict.reason)
        if newly_held:  # once per boundary, not once per job: a trace can arrive before its fleet
            by_reason: dict[str, list[str]] = {}
            for job, why in newly_held:
                by_reason.setdefault(why, []).append(job.job_id)
            self._log.warning(  # each reason with its own jobs (the first five reasons, five ids each)
                "jobs_held", count=len(newly_held), held_in_all=len(memory.held),
                reasons=[{"reason": why, "count": len(ids), "job_ids": ids[:5]} for why, ids in list(by_reason.items())[:5]],
            )

    async def _until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            self._wake.clear()
            await self._wake.wait()

    def _ready_for_lockstep(self) -> bool:
        """A lockstep replay starts when the whole trace is in and the whole fleet registered."""
        memory = self.memory
        gpus = sum(g for servers in memory.servers.values() for _, g in servers)
        enough_gpus = self._expected_gpus is None or gpus >= self._expected_gpus
        return memory.state is not None or (memory.intake.all_sealed_in() and enough_gpus)

    async def _wait_for_round(self) -> None:
        if self._round_timeout_s is None:
            await self._until(self._round_complete)
            return
        waiting = asyncio.ensure_future(self._until(self._round_complete))
        try:
            # asyncio.wait: wait_for would swallow a stop that comes as the round completes
            done, _ = await asyncio.wait({waiting}, timeout=self._round_timeout_s)
        finally:
            waiting.cancel()
        if not done:
            missing = [lid for lid, lease in self.memory.expected.items() if len(self.memory.reports.get(lid, [])) < len(lease.entry)]
            self._log.warning("leases_unreported", leases=missing[:10], count=len(missing), action="count as no progress")

    def _crashed_to_retry(self) -> list[str]:
        """The jobs whose process crashed in the round that just ended and that will be tried
        again (not a usage error, which fails the job at once)."""
        memory = self.memory
        return [
            r.job_id for lease_id in memory.expected for r in memory.reports.get(lease_id, [])
            if r.outcome == "crashed" and not attempts_core.usage_error(r)
        ]

    async def _wait_out_a_crash(self, crashed: list[str]) -> None:
        """A live round that ends early because a job's process crashed runs its full length all
        the same: the job's next attempt comes a round later (a command that fails at once was
        otherwise tried --max-failed-attempts times within a second, and failed before anyone
        could look). The simulator's rounds are left as they are."""
        memory = self.memory
        if self._round_timeout_s is None or self._lockstep:
            return
        left_s = memory.round_clock.dispatched_at_s + self._settings.round_s - self._clock.now_s()
        if crashed and left_s > 0:
            self._log.info("round_runs_out_after_crash", jobs=crashed[:10], wait_s=round(left_s, 3))
            await self._clock.sleep(left_s)

    async def _wait_when_idle(self) -> None:
        memory = self.memory
        future = [j.arrival_s for j in memory.submitted if j.arrival_s > self._clock.now_s()]
        if self._lockstep and future:
            self._clock.advance_to(min(future))  # type: ignore[attr-defined]
            return
        if len(future) < len(memory.submitted):
            return  # jobs due now
        if memory.held and self._cluster_grew:
            return  # a worker joined: held jobs may fit now
        if future:
            # Submitted with an arrival still ahead (a replayed trace, a skewed client clock):
            # wait for it, or for anything else that comes meanwhile.
            await self._sleep_or_wake(min(future) - self._clock.now_s())
            return
        more = self._more_arrivals() or (self._lockstep and bool(future))
        if memory.state is not None and memory.state.jobs and not more:
            self._idle_boundaries += 1
            if self._idle_boundaries == 1:
                force_reset_when_idle(memory.state)  # re-solve once, at once
                return
            if self._round_timeout_s is not None:
                # A live cluster: still nothing can run (no worker fits, no allocation yet). Wait
                # for something to change, or a round, rather than spin.
                await self._sleep_or_wake(self._settings.round_s)
                force_reset_when_idle(memory.state)
                return
            if self._idle_boundaries > 3:
                stuck = ", ".join(j.job_id for j in list(memory.state.jobs.values())[:5])
                failed = (memory.observations.last_solve or {}).get("error")
                if failed:  # not the cluster's fault: say what the policy said (a solver not installed)
                    raise ServiceError(f"t={self._clock.now_s():.1f} s: jobs {stuck} were never scheduled: the policy failed: {failed}")
                raise ServiceError(f"t={self._clock.now_s():.1f} s: jobs {stuck} can never be scheduled on this cluster")
            force_reset_when_idle(memory.state)
            return
        await self._until(lambda: bool(memory.submitted) or (bool(memory.held) and self._cluster_grew))

    async def _sleep_or_wake(self, duration_s: float) -> None:
        """Wait ``duration_s`` on the clock, or less if an input arrives meanwhile."""
        self._wake.clear()
        sleeper = asyncio.ensure_future(self._clock.sleep(duration_s))
        waker = asyncio.ensure_future(self._wake.wait())
        await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        for task in (sleeper, waker):
            task.cancel()

    def _ensure_state(self) -> MechanismState:
        memory = self.memory
        if memory.state is None:
            gpus = {w: sum(g for _, g in servers) for w, servers in memory.servers.items() if servers}
            memory.state = new_state(gpus, self._settings.gpus_per_server)
            self._pool_changed = True
            # GPU ids as new_state numbers them: types in sorted order, servers as registered
            for w in memory.state.gpus:
                gpu_ids = (i for server in memory.state.servers[w] for i in server)
                for worker_id, count in memory.servers[w]:
                    for k in range(count):
                        memory.worker_of[next(gpu_ids)] = (worker_id, k)
        return memory.state

    def _collect_results(self) -> tuple[list[LeaseResult], list[tuple[str, str]]]:
        """The running round's leases as results to settle, each job's attempt noted with how its
        lease ended; and the jobs whose attempts failed too many times in a row (with why)."""
        memory = self.memory
        assert memory.state is not None
        results = []
        failing = []
        attempts = memory.observations.attempts
        kept = memory.running[1].kept if memory.running is not None else frozenset()
        for lease_id, lease in memory.expected.items():
            by_job = {r.job_id: r for r in memory.reports.pop(lease_id, [])}
            members = [memory.state.jobs.get(i) for i in lease.entry]
            steps = tuple(by_job[m.job_id].steps_done if m is not None and m.job_id in by_job else 0 for m in members)
            lost = lease_id in memory.ended_leases
            # A lease counts the time its reports account for, and none beyond (invariant I4,
            # docs/reliability.md): one that lost its worker, or whose reports never came, got its
            # job nothing credited after that, and must not cost it priority.
            elapsed = max((r.elapsed_s for r in by_job.values()), default=0.0)
            ended = "lost" if lost else ("crashed" if any(r.outcome == "crashed" for r in by_job.values()) else "")
            if not ended and any(m is not None and m.job_id not in by_job for m in members):
                # No report by the round's timeout: the job may still be running on its worker,
                # past the steps credited. Launching it afresh (never extending it) makes the worker
                # restart it from the credited checkpoint, so its steps and its model agree.
                ended = "unreported"
            results.append(LeaseResult(lease.entry, lease.placement, steps, lease.dispatched_at_s + elapsed, ended))
            for member, done in zip(members, steps, strict=True):
                if member is None:
                    continue
                report = by_job.get(member.job_id)
                if report is not None and lease.entry not in kept:  # a fresh start: what it cost
                    note_move_cost(memory.state, member.job_type, report.startup_s + report.restore_s)
                label = attempts_core.ended_label(report, worker_lost=lost)
                in_a_row = attempts_core.end_lease(attempts, member.job_id, label, done, report)
                if in_a_row >= self._settings.max_failed_attempts or attempts_core.usage_error(report):
                    failing.append((member.job_id, attempts_core.failure_reason(in_a_row, report)))
        memory.expected = {}
        memory.ended_leases = {}
        if memory.running is not None:
            start_s, plan, reset = memory.running
            round_id = memory.rounds_forgotten + len(memory.round_reports)
            memory.round_reports.append(round_report(memory.state, round_id, start_s, plan, results, reset))
            memory.running = None
        return results, failing

    async def _fail_attempts(self, state: MechanismState, failing: list[tuple[str, str]], now_s: float) -> list[JobState]:
        """Jobs whose process crashed ``max_failed_attempts`` leases in a row end as failed (after
        their round was settled: one that completed in it completed)."""
        ended = []
        for job_id, reason in failing:
            index = next((i for i, j in state.jobs.items() if j.job_id == job_id), None)
            if index is None:
                continue
            ended.append(remove_job(state, index, dropped=True))
            self.memory.observations.failed[job_id] = reason
            self.memory.launch.pop(job_id, None)
            self._forget(job_id)
            self._log.warning("job_failed", job_id=job_id, reason=reason)
            self._audit_end(job_id, "failed", reason, now_s)
            await self._publish(JobFailed(job_id, reason, now_s), f"job-end:{job_id}")
        return ended

    async def _publish(self, message: Message, message_id: str | None = None) -> None:
        """Events carry ids derived from what they say, so that the same event published again by
        a restarted mechanism is recognisably the same (consumers dedupe by message id)."""
        assert self._bus is not None
        await self._bus.publish(message, mandatory=False, message_id=message_id)

    async def _publish_end(self, job: JobState) -> None:
        self.memory.launch.pop(job.job_id, None)
        self._forget(job.job_id)
        now_s = self._clock.now_s()
        if job.steps_remaining <= 0 and job.last_finish_s is not None:
            message: Message = JobCompleted(job.job_id, job.last_finish_s, job.last_finish_s - job.arrival_s, job.steps_done)
            self._audit_end(job.job_id, "completed", "", now_s)
        else:
            reason = "a gang got fewer steps than GPUs too many times"
            self.memory.observations.failed[job.job_id] = reason
            message = JobFailed(job.job_id, reason, now_s)
            self._audit_end(job.job_id, "failed", reason, now_s)
        await self._publish(message, f"job-end:{job.job_id}")

    async def _reallocate(self, state: MechanismState, now_s: float) -> None:
        """Ask the policy for a new allocation and install it. No single job can stop this (issue
        9): when the policy refuses the problem because of particular jobs, they are set aside
        with its reason and the rest is solved again at once. Any other failure keeps the last
        allocation for this round (degraded) and asks again at the next boundary."""
        for attempt in range(SOLVES_PER_BOUNDARY):
            request_id = f"{self._seed}-{state.resets}" + (f".{attempt}" if attempt else "")
            reply = await self._ask_policy(state, now_s, request_id)
            self._note_solve(reply, request_id, now_s)
            if isinstance(reply, AllocationComputed) and reply.status in (SolveStatus.OPTIMAL, SolveStatus.OPTIMAL_INACCURATE):
                apply_allocation(
                    state, allocation_fractions(reply), reply.isolated_throughputs_steps_per_s or {}, self._settings,
                    reply.policy_state,
                )
                self.memory.solve_times_s.append(reply.solve_time_s)
                self.memory.observations.last_solve_s = reply.solve_time_s
                return
            reason = getattr(reply, "reason", "") or ""
            if reply is not None:
                self._log.warning("allocation_failed", request_id=request_id, reason=reason)
            refused = [j for j in getattr(reply, "refused_job_ids", ()) if any(x.job_id == j for x in state.jobs.values())]
            if not refused:
                break
            await self._set_aside(state, refused, f"the policy cannot allocate with this job: {reason}", now_s)
            if not state.jobs:
                state.needs_allocation = False
                return
        # Degraded: keep the last allocation this round, and ask again at the next boundary.
        state.needs_allocation = True

    async def _ask_policy(self, state: MechanismState, now_s: float, request_id: str) -> Message | None:
        """The policy's answer to this state, or None when none came (said in the log)."""
        request = allocation_request(
            state,
            now_s,
            request_id=request_id,
            policy=self._policy,
            # A deadline compares the policy service's clock with ours: only wall time is shared.
            deadline_s=now_s + self._allocation_timeout_s if self._deadlines else NO_DEADLINE_S,
            preset=self._settings.preset,
            seed=self._seed if self._settings.preset == "gavel" else self._seed + state.resets,
            solver=self._solver,
            packing=self._settings.packing,
            rates=self._rates,
        )
        replayed = self.memory.allocations.pop(request_id, None)
        if replayed is not None:
            return DEFAULT_CODEC.decode(replayed).message  # answered before a restart
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending_request = (request_id, future)
        try:
            await self._send_request(request)
            return await self._await_reply(future, request_id)
        except asyncio.TimeoutError:
            self._log.warning(
                "allocation_unavailable", request_id=request_id, action="keep last allocation",
                error=f"no answer from a policy service within {self._allocation_timeout_s:g} s",
            )
        except Exception as e:  # noqa: BLE001 - degraded mode, said once
            self._log.warning("allocation_unavailable", request_id=request_id, error=repr(e), action="keep last allocation")
        finally:
            self._pending_request = None
        return None

    def _note_solve(self, reply: Message | None, request_id: str, now_s: float) -> None:
        """What `gavel cluster` shows as the last solve, and whether the allocation in force is
        kept past its time (degraded: said once when it begins and once when it ends)."""
        obs = self.memory.observations
        if isinstance(reply, AllocationComputed):
            status, error = str(reply.status), reply.reason
        elif isinstance(reply, AllocationFailed):
            status, error = ("expired" if reply.expired else "failed"), reply.reason
        else:
            status, error = "unavailable", "no answer from a policy service"
        if status in (SolveStatus.OPTIMAL, SolveStatus.OPTIMAL_INACCURATE):
            if obs.degraded_since_s is not None:
                self._log.info("allocation_restored", degraded_s=now_s - obs.degraded_since_s, request_id=request_id)
            obs.degraded_since_s = None
            obs.allocation_solved_at_s = now_s
        elif obs.degraded_since_s is None and not getattr(reply, "refused_job_ids", ()):
            # (a refusal because of particular jobs sets them aside and solves again at once)
            obs.degraded_since_s = now_s
            self._log.warning(
                "allocation_degraded", request_id=request_id, status=status, error=error,
                allocation_solved_at_s=obs.allocation_solved_at_s,
                action="keeping the last allocation; jobs it does not include run on the GPUs it leaves idle",
            )
        self.memory.observations.last_solve = {
            "request_id": request_id, "at_s": now_s, "status": status, "error": error,
            "solve_time_s": getattr(reply, "solve_time_s", None),
            "refused_job_ids": list(getattr(reply, "refused_job_ids", ())),
        }

    async def _set_aside(self, state: MechanismState, job_ids: list[str], reason: str, now_s: float) -> None:
        """Jobs the policy will not solve with leave the cluster: rejected if they never ran
        (nothing of them was used: the id is free again), failed if they did."""
        memory = self.memory
        for job_id in job_ids:
            index = next(i for i, j in state.jobs.items() if j.job_id == job_id)
            self._log.warning("job_set_aside", job_id=job_id, reason=reason)
            memory.launch.pop(job_id, None)
            self._forget(job_id)
            if state.jobs[index].first_run_s is None:
                withdraw_job(state, index)
                memory.observations.rejected[job_id] = reason
                memory.intake.known.pop(job_id, None)
                self._audit_end(job_id, "rejected", reason, now_s)
                await self._publish_rejection(job_id, reason)
            else:
                remove_job(state, index, dropped=True)
                memory.observations.failed[job_id] = reason
                self._audit_end(job_id, "failed", reason, now_s)
                await self._publish(JobFailed(job_id, reason, now_s), f"job-end:{job_id}")

    async def _send_request(self, request: Message) -> None:
        """Publish an allocation request; while no policy service has ever attached (nothing
        is bound to receive it), say so and keep trying."""
        assert self._bus is not None
        waited_s = 0.0
        while True:
            try:
                await self._bus.publish(request)
                if waited_s:
                    self._log.info("policy_service_found", waited_s=waited_s)
                return
            except UnroutableError:
                if waited_s == 0.0 or waited_s % 30.0 < 1.0:
                    self._log.warning("policy_service_missing", waited_s=waited_s, action="waiting for a policy replica")
                if not self._lockstep and waited_s >= self._allocation_timeout_s:
                    raise
                await asyncio.sleep(1.0)  # real time: a process has to start
                waited_s += 1.0

    async def _await_reply(self, future: asyncio.Future[Message], request_id: str) -> Message:
        """Wait for the policy service. In lockstep and virtual time a round never passes without
        an answer; on a live cluster the round goes on with the last allocation. A request to a
        queue that exists but that nobody consumes (every replica stopped) waits there silently:
        when no answer came within a grace, ask the broker, and say so at once if so (asking
        on every request would cost a broker round trip on the common, prompt path)."""
        # asyncio.wait, not wait_for: Python 3.11's wait_for swallows a cancellation that comes as
        # the answer does (a mechanism stopped then kept running, and its stop() never returned).
        grace_s = NO_ANSWER_GRACE_S if self._lockstep else min(NO_ANSWER_GRACE_S, self._allocation_timeout_s)
        if (await asyncio.wait({future}, timeout=grace_s))[0]:
            return future.result()
        await self._say_if_nobody_listens()
        if self._lockstep:
            waiting_s = grace_s
            while not (await asyncio.wait({future}, timeout=10.0))[0]:
                waiting_s += 10.0
                self._log.warning("waiting_for_policy_service", request_id=request_id, waited_s=waiting_s)
            return future.result()
        if (await asyncio.wait({future}, timeout=self._allocation_timeout_s - grace_s))[0]:
            return future.result()
        future.cancel()
        raise asyncio.TimeoutError

    async def _say_if_nobody_listens(self) -> None:
        assert self._bus is not None
        if await self._bus.consumer_count(POLICY_REQUEST_QUEUE) == 0:
            self._log.warning(
                "policy_service_missing", queue=POLICY_REQUEST_QUEUE,
                reason="the policy queue has no consumer: is `gavel serve policy` running?",
                action=f"the request waits there; keeping the last allocation after {self._allocation_timeout_s:g} s",
            )

    async def _dispatch(
        self, state: MechanismState, plan: RoundPlan, now_s: float, reset: bool, *,
        settled: list[list[object]], any_settled: bool,
    ) -> None:
        memory = self.memory
        assignment = plan.assignment
        commands: list[Message] = []
        assignments = []
        round_id = memory.round_id
        if assignment:
            memory.round_id += 1
            memory.running = (now_s, plan, reset)
        for entry, placement in assignment.items():
            lease_id = f"{round_id}:{'+'.join(str(i) for i in entry)}"
            memory.expected[lease_id] = Lease(lease_id, entry, placement, now_s)
            jobs = [state.jobs[i] for i in entry]
            extended = entry in plan.kept
            launch = [memory.launch.get(j.job_id, NO_LAUNCH) for j in jobs]
            job_fields = dict(
                job_ids=tuple(j.job_id for j in jobs),
                max_steps=tuple(j.steps_remaining for j in jobs),
                job_types=tuple(j.job_type for j in jobs),
                scale_factor=jobs[0].scale_factor,
                # () when no job gave one (the catalog runs; a simulated fleet never needs them):
                # every field is validated at every publish, and the simulator sends ~60,000 commands
                commands=tuple(command for command, _ in launch) if any(c for c, _ in launch) else (),
                working_dirs=tuple(working_dir for _, working_dir in launch) if any(d for _, d in launch) else (),
                # the steps credited so far: the job resumes from its newest checkpoint at or below
                resume_steps=tuple(j.steps_done for j in jobs),
                # the submitters' steps/s (() when no job gave any): a simulated fleet runs a job
                # its table lacks from them (sim/derived_rates.py)
                throughput_estimates_steps_per_s=(
                    tuple(memory.user_estimates.get(j.job_id, {}) for j in jobs)
                    if any(j.job_id in memory.user_estimates for j in jobs) else ()
                ),
            )
            placed = self._workers_of(placement)
            workers = [worker_id for worker_id, _ in placed]  # in rank order, as `gavel workers` names them
            first_rank = 0  # the gang's GPUs on the workers before this one
            for worker_id, gpu_ids in placed:
                common = dict(
                    worker_id=worker_id, round_id=round_id, lease_id=lease_id, epoch=memory.epoch,
                    # a lease on one worker needs no gang list (its worker is the gang's first)
                    lease_duration_s=self._settings.round_s, gpu_ids=gpu_ids, gang_workers=tuple(workers) if len(workers) > 1 else (),
                    first_rank=first_rank,
                )
                if extended:
                    commands.append(ExtendLease(**common, **job_fields))  # gpu_ids too: a restarted worker starts it anew
                else:
                    commands.append(RunJobs(**common, restore_s=self._settings.restore_s, **job_fields))
                assignments.append(
                    Assignment(tuple(j.job_id for j in jobs), worker_id, placement.accelerator_type, gpu_ids, lease_id, extended)
                )
                first_rank += len(gpu_ids)
            for job in jobs:
                status_core.record_placement(
                    memory.observations, job.job_id, round_id, now_s, placement.accelerator_type, workers,
                    extended=extended, packed_with=[j.job_id for j in jobs if j is not job],
                )
                attempt = attempts_core.continue_attempt if extended else attempts_core.start_attempt
                attempt(
                    memory.observations.attempts, job.job_id, round_id=round_id, now_s=now_s,
                    accelerator_type=placement.accelerator_type, workers=workers,
                )
        # Write ahead: the boundary's whole memory, commands included, before any goes out.
        self._crash_point("boundary.before_journal")
        if self._journal is not None:
            # Encoded only for the journal (a restart republishes them): without one, this was a
            # fifth of the in-process simulator's time.
            had_commands = bool(memory.commands)
            memory.commands = [DEFAULT_CODEC.encode(c, source=self.name, sent_at_s=now_s) for c in commands]
            if any_settled or reset or commands or had_commands or self._replay_too_long():
                record = self._boundary_record(state, round_id if assignment else -1, now_s)
                self._journal.append(audit.BOUNDARY, audit.encode_boundary_columns(record, assignments, settled), now_s)
                self._journal.save_snapshot(memory)  # commits the record with it
        self._crash_point("boundary.after_journal")
        for command in commands:
            if command.worker_id in memory.lost_workers:  # type: ignore[attr-defined]
                continue  # lost while this boundary was going out: its lease ended with it
            await self._publish_command(command)
        if assignment:
            started = RoundStarted(round_id, now_s, self._settings.round_s, tuple(assignments))
            await self._publish(started, f"round-started:{round_id}")

    def _boundary_record(self, state: MechanismState, round_id: int, now_s: float) -> audit.BoundaryRecord:
        """The audit record of this boundary, its leases and settled leases aside (written as
        columns); the workers and the pool only when they changed since the last one."""
        memory = self.memory
        workers = pool = None
        if self._pool_changed:
            self._pool_changed = False
            workers = tuple((w, t, g) for t, servers in memory.servers.items() for w, g in servers)
            # A GPU the state has and no worker owns would be a leak: named, not a crash, so the
            # checker says it
            pool = tuple(
                memory.worker_of.get(gpu, ("?", gpu)) for servers in state.servers.values() for server in servers for gpu in server
            )
        return audit.BoundaryRecord(
            epoch=memory.epoch, at_s=now_s, round_id=round_id, leases=(), settled=(), workers=workers, pool=pool,
            charges_from_previous_end=self._settings.round_start_from_previous_end,
            round_s=self._settings.round_s, worker_grace_s=self._settings.worker_grace_s or 0.0,
        )

    def _replay_too_long(self) -> bool:
        """A boundary that only admitted jobs may skip its snapshot (replaying the submissions
        admits them again, in order: pickling the whole memory per arrival would make ingest
        quadratic), but not so often that a restart replays without end."""
        assert self._journal is not None
        return self._journal.last_seq() - self._journal.snapshot_seq >= SNAPSHOT_EVERY_EVENTS

    async def _publish_command(self, command: Message) -> None:
        """Mandatory: a command nobody can receive (its worker's queue is gone) is said loudly,
        but it must not stop the cluster (a crash would repeat at every restart, since the
        journal republishes the same commands): its lease reports nothing, and a live round
        ends at its timeout without it."""
        assert self._bus is not None
        try:
            await self._bus.publish(command)
        except UnroutableError as e:
            self._log.error(
                "worker_unreachable", worker_id=getattr(command, "worker_id", ""), lease_id=getattr(command, "lease_id", ""),
                error=str(e), action="its lease counts as no progress",
            )

    def _workers_of(self, placement: Placement) -> list[tuple[str, tuple[int, ...]]]:
        """GPU ids -> (worker id, GPU indices on that worker), in placement order."""
        by_server: dict[str, list[int]] = {}
        for gpu in placement.worker_ids:
            worker_id, index = self.memory.worker_of[gpu]
            by_server.setdefault(worker_id, []).append(index)
        return [(worker_id, tuple(gpus)) for worker_id, gpus in by_server.items()]
