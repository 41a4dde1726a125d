"""Faults as a test harness (issue 13): what may go wrong in a simulation, and when.

Pure: a ``FaultSpec`` parsed from a compact text, and the seeded ``FaultSchedule`` it makes for one
run (``schedule(spec, rng, ...)``: the same spec, seed and trace give the same schedule, so a failing
seed replays). The effects live in sim/fault_bus.py (the messages), sim/fault_fleet.py (the workers)
and sim/fault_services.py (the mechanism and the policy crashing); they record what they did in a
``FaultLog``, which the run returns as a ``FaultReport`` (sim/results.py ``SimulationResult.faults``).

The grammar (docs/reliability.md, "Injecting faults in a simulation")::

    SPEC   := "none" | ITEM ("," ITEM)*
    ITEM   := "mix" | "all"                            every kind at a moderate dose (below)
            | COUNTED "=" N                            N >= 0 events of that kind in the run
            | RATE "=" P [":" X]                       each message hit with probability P in [0, 1]
    COUNTED:= worker-crash | hang | slow-gpu | job-crash | mechanism-crash | policy-crash
    RATE   := dup | loss | delay[:MAX_S] | reorder[:WINDOW]

Later items override earlier ones (``mix,dup=0`` is the mix without duplicates).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from common.errors import FaultSpecError, GavelError

COUNTED_KINDS = ("worker-crash", "hang", "slow-gpu", "job-crash", "mechanism-crash", "policy-crash")
RATE_KINDS = ("dup", "loss", "delay", "reorder")
KINDS = COUNTED_KINDS + RATE_KINDS
DEFAULT_REORDER_WINDOW = 4  # messages of other publishers that may overtake a held one
DEFAULT_MAX_DELAY_S = 30.0  # a tenth of a default grace: a delayed heartbeat rarely looks like a loss
MAX_COUNT = 1000
CRASH_POINTS = ("boundary.before_journal", "boundary.after_journal")  # MechanismService's crash points

# "mix": every kind at once, at doses that a 300-job trace survives in seconds (make test runs 40 seeds, make test-deep 100).
MIX = "worker-crash=2,hang=2,slow-gpu=2,job-crash=3,mechanism-crash=2,policy-crash=1,dup=0.02,reorder=0.02:4,delay=0.02,loss=0.02"


class InjectedCrash(GavelError):
    """A crash a fault schedule asked for (a service's process dying at this point)."""


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """What to inject: counts of discrete events, per-message probabilities. ``text`` is the spec
    as given (a replay command repeats it)."""

    worker_crash: int = 0
    hang: int = 0
    slow_gpu: int = 0
    job_crash: int = 0
    mechanism_crash: int = 0
    policy_crash: int = 0
    dup: float = 0.0
    loss: float = 0.0
    delay: float = 0.0
    max_delay_s: float = DEFAULT_MAX_DELAY_S
    reorder: float = 0.0
    reorder_window: int = DEFAULT_REORDER_WINDOW
    text: str = "none"

    @property
    def counts(self) -> dict[str, int]:
        return {kind: getattr(self, kind.replace("-", "_")) for kind in COUNTED_KINDS}

    @property
    def rates(self) -> dict[str, float]:
        return {kind: getattr(self, kind) for kind in RATE_KINDS}

    @property
    def messages(self) -> bool:
        """Whether the bus must be wrapped (any per-message fault)."""
        return any(self.rates.values())

    @property
    def empty(self) -> bool:
        return not any(self.counts.values()) and not self.messages


def parse_spec(text: str) -> FaultSpec:
    """``text`` -> FaultSpec, or FaultSpecError naming the bad token and the grammar's choices."""
    cleaned = text.strip()
    if not cleaned:
        raise FaultSpecError(text, "empty; give kind=value items (e.g. mix, or worker-crash=2,dup=0.05) or none")
    if cleaned == "none":
        return FaultSpec(text="none")
    values: dict[str, object] = {}
    for token in cleaned.split(","):
        token = token.strip()
        if token in ("mix", "all"):
            values.update(dataclasses.asdict(parse_spec(MIX)))
            continue
        kind, sep, value = token.partition("=")
        kind = kind.strip()
        if not sep or not value.strip():
            raise FaultSpecError(token, f"expected kind=value; kinds: {', '.join(KINDS)}; or mix")
        if kind in COUNTED_KINDS:
            values[kind.replace("-", "_")] = _count(token, value)
        elif kind in RATE_KINDS:
            probability, _, extra = value.partition(":")
            values[kind] = _probability(token, probability)
            if extra:
                if kind == "reorder":
                    values["reorder_window"] = _count(token, extra, least=1)
                elif kind == "delay":
                    values["max_delay_s"] = _seconds(token, extra)
                else:
                    raise FaultSpecError(token, f"{kind} takes a probability only (no ':')")
        else:
            raise FaultSpecError(token, f"unknown fault kind {kind!r}; kinds: {', '.join(KINDS)}; or mix")
    values.pop("text", None)
    return FaultSpec(**values, text=cleaned)  # type: ignore[arg-type]


def _count(token: str, text: str, least: int = 0) -> int:
    try:
        n = int(text.strip())
    except ValueError:
        raise FaultSpecError(token, f"{text.strip()!r} is not a whole number") from None
    if not least <= n <= MAX_COUNT:
        raise FaultSpecError(token, f"{n} is out of range {least}..{MAX_COUNT}")
    return n


def _probability(token: str, text: str) -> float:
    try:
        p = float(text.strip())
    except ValueError:
        raise FaultSpecError(token, f"{text.strip()!r} is not a probability") from None
    if not (math.isfinite(p) and 0.0 <= p <= 1.0):
        raise FaultSpecError(token, f"{p:g} is not a probability in [0, 1]")
    return p


def _seconds(token: str, text: str) -> float:
    try:
        s = float(text.strip())
    except ValueError:
        raise FaultSpecError(token, f"{text.strip()!r} is not a number of seconds") from None
    if not (math.isfinite(s) and s > 0):
        raise FaultSpecError(token, f"{s:g} s: a delay's bound must be positive")
    return s


# -- the schedule --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerCrash:
    """The worker process dies at ``at_s`` (no heartbeat, no report, its jobs gone) and a fresh
    one registers ``down_s`` later (longer than the mechanism's grace: it is declared lost first)."""

    at_s: float
    worker_id: str
    down_s: float


@dataclass(frozen=True, slots=True)
class WorkerHang:
    """The worker stops heartbeating, obeying and reporting for ``duration_s`` (its jobs keep
    running), then resumes: it obeys what waited in its queue (a fence, if it was declared lost)."""

    at_s: float
    worker_id: str
    duration_s: float


@dataclass(frozen=True, slots=True)
class SlowGpu:
    """The worker's leases run at ``factor`` x the table's rate from ``at_s`` for ``duration_s``."""

    at_s: float
    worker_id: str
    factor: float
    duration_s: float


@dataclass(frozen=True, slots=True)
class JobCrash:
    """The first lease the fleet starts at or after ``at_s`` crashes ``after_fraction`` into it:
    its first job's process exits with an error (outcome "crashed"), a packed partner is killed."""

    at_s: float
    after_fraction: float


@dataclass(frozen=True, slots=True)
class MechanismCrash:
    """The mechanism dies at its first ``point`` (CRASH_POINTS) at or after ``at_s``; a new one
    starts on the same journal."""

    at_s: float
    point: str


@dataclass(frozen=True, slots=True)
class PolicyCrash:
    """The policy service dies in the middle of the first request it solves at or after ``at_s``;
    the request is redelivered to a new replica (an unacknowledged delivery, as RabbitMQ does)."""

    at_s: float


@dataclass(frozen=True, slots=True)
class Timing:
    """The liveness timing faults need: the fleet's heartbeat period and the mechanism's grace."""

    heartbeat_s: float
    worker_grace_s: float


@dataclass(frozen=True, slots=True)
class FaultSchedule:
    spec: FaultSpec
    seed: int
    horizon_s: float  # faults fall in [5 %, 80 %] of this (a lower bound of the run's length)
    timing: Timing
    worker_crashes: tuple[WorkerCrash, ...] = ()
    hangs: tuple[WorkerHang, ...] = ()
    slow_gpus: tuple[SlowGpu, ...] = ()
    job_crashes: tuple[JobCrash, ...] = ()
    mechanism_crashes: tuple[MechanismCrash, ...] = ()
    policy_crashes: tuple[PolicyCrash, ...] = ()

    @property
    def quiet_from_s(self) -> float:
        """When the last counted fault is over (a crashed worker back, a hang or a slowdown ended);
        the per-message faults go on all run. The invariant checker's I5 counts from here."""
        ends = [c.at_s + c.down_s for c in self.worker_crashes] + [h.at_s + h.duration_s for h in self.hangs]
        ends += [g.at_s + g.duration_s for g in self.slow_gpus]
        ends += [e.at_s for e in (*self.job_crashes, *self.mechanism_crashes, *self.policy_crashes)]
        return max(ends, default=0.0)

    @property
    def scheduled(self) -> dict[str, int]:
        return {
            "worker-crash": len(self.worker_crashes), "hang": len(self.hangs), "slow-gpu": len(self.slow_gpus),
            "job-crash": len(self.job_crashes), "mechanism-crash": len(self.mechanism_crashes),
            "policy-crash": len(self.policy_crashes),
        }


def timing_for(round_s: float) -> Timing:
    """Heartbeats twice a round, a grace of three heartbeats (a lost heartbeat is no loss)."""
    heartbeat_s = round_s / 2
    return Timing(heartbeat_s=heartbeat_s, worker_grace_s=3 * heartbeat_s)


def schedule(
    spec: FaultSpec, rng: np.random.Generator, *, seed: int, horizon_s: float, worker_ids: Sequence[str], timing: Timing
) -> FaultSchedule:
    """The events of one run, drawn from ``rng`` in a fixed order (kind by kind), each list sorted
    by time. ``seed`` is recorded only (the caller seeded ``rng`` with it)."""
    horizon_s = max(horizon_s, 10 * timing.worker_grace_s)
    grace_s = timing.worker_grace_s

    def times(n: int) -> list[float]:
        return sorted(float(t) for t in rng.uniform(0.05 * horizon_s, 0.8 * horizon_s, n))

    def workers(n: int) -> list[str]:
        return [str(worker_ids[int(i)]) for i in rng.integers(0, len(worker_ids), n)] if worker_ids else []

    n = spec.worker_crash
    crashes = tuple(
        WorkerCrash(t, w, float(d)) for t, w, d in zip(times(n), workers(n), rng.uniform(2 * grace_s, 6 * grace_s, n))
    )
    n = spec.hang
    # some shorter than the grace (the worker is only late), most longer (it is declared lost)
    hangs = tuple(
        WorkerHang(t, w, float(d)) for t, w, d in zip(times(n), workers(n), rng.uniform(0.5 * grace_s, 3 * grace_s, n))
    )
    n = spec.slow_gpu
    slow = tuple(
        SlowGpu(t, w, float(f), float(d))
        for t, w, f, d in zip(times(n), workers(n), rng.uniform(0.2, 0.7, n), rng.uniform(0.05, 0.2, n) * horizon_s)
    )
    n = spec.job_crash
    job_crashes = tuple(JobCrash(t, float(f)) for t, f in zip(times(n), rng.uniform(0.1, 0.9, n)))
    n = spec.mechanism_crash
    mechanism = tuple(MechanismCrash(t, CRASH_POINTS[int(i)]) for t, i in zip(times(n), rng.integers(0, 2, n)))
    policy = tuple(PolicyCrash(t) for t in times(spec.policy_crash))
    if not worker_ids:
        crashes, hangs, slow = (), (), ()
    return FaultSchedule(spec, seed, horizon_s, timing, crashes, hangs, slow, job_crashes, mechanism, policy)


def horizon_s(
    jobs: Sequence[tuple[float, int, int, float]], gpus: int
) -> float:
    """A lower bound of a run's length, from (arrival s, total steps, scale factor, best steps/s)
    per job: the last arrival, or the work packed perfectly on every GPU, whichever is later. The
    faults fall within it, so each one happens while the run still goes on."""
    if not jobs:
        return 0.0
    last_arrival_s = max(a for a, _, _, _ in jobs)
    work_gpu_s = sum(steps / rate * scale for _, steps, scale, rate in jobs if rate > 0)
    return max(last_arrival_s, work_gpu_s / max(gpus, 1))


# -- what a run records ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InjectedFault:
    kind: str  # one of KINDS
    at_s: float
    detail: str  # what it hit (worker id, lease id, message type, crash point)


@dataclass(frozen=True, slots=True)
class GpuOccupancy:
    """A worker's own account of one lease on one of its GPUs, [start_s, end_s) in virtual time.
    ``ended``: reported (ran its length), crashed (an injected job crash), killed (KillJobs),
    fenced (WorkerFenced), worker-crash (the worker died), unfinished (the run stopped first)."""

    worker_id: str
    gpu_index: int
    lease_id: str
    round_id: int
    start_s: float
    end_s: float
    ended: str


@dataclass(frozen=True, slots=True)
class DeadLetterRecord:
    queue: str
    routing_key: str
    reason: str
    injected: bool  # poison a fault injector put there on purpose (none of ours publishes any)


@dataclass(frozen=True, slots=True)
class FaultReport:
    """What a run with faults did. ``injected`` counts by kind (KINDS) what really happened (a
    scheduled event past the run's end never does); ``events`` lists them in order."""

    spec: str
    seed: int
    scheduled: Mapping[str, int]
    injected: Mapping[str, int]
    events: tuple[InjectedFault, ...]
    dead_letters: tuple[DeadLetterRecord, ...]
    occupancy: tuple[GpuOccupancy, ...]
    journal_path: str | None
    quiet_from_s: float = 0.0  # the counted faults are over from then (FaultSchedule.quiet_from_s)
    mechanism_restarts: int = 0
    policy_restarts: int = 0
    policy_redeliveries: int = 0  # requests a new policy replica got back from a dead one
    # The invariants checked over the journal, the occupancy and the dead letters
    # (mechanism_service/core/invariants.py, by sim.fault_driver.check_invariants when the run kept
    # a journal), and the violations found. None: not checked (no journal).
    invariants_checked: tuple[str, ...] | None = None
    violations: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {
            "spec": self.spec, "seed": self.seed, "scheduled": dict(self.scheduled), "injected": dict(self.injected),
            "injected_total": sum(self.injected.values()), "mechanism_restarts": self.mechanism_restarts,
            "policy_restarts": self.policy_restarts, "policy_redeliveries": self.policy_redeliveries, "journal": self.journal_path, "quiet_from_s": self.quiet_from_s,
            "dead_letters": [dataclasses.asdict(d) for d in self.dead_letters],
            "gpu_occupancy_records": len(self.occupancy),
            "invariants_checked": None if self.invariants_checked is None else list(self.invariants_checked),
            "violations": list(self.violations),
        }


@dataclass
class FaultLog:
    """The injectors' shared notebook (mutable: the shells write it as faults happen)."""

    events: list[InjectedFault] = field(default_factory=list)
    occupancy: list[GpuOccupancy] = field(default_factory=list)

    def injected(self, kind: str, at_s: float, detail: str = "") -> None:
        self.events.append(InjectedFault(kind, at_s, detail))

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(KINDS, 0)
        for event in self.events:
            counts[event.kind] += 1
        return counts


def replay_command(spec: FaultSpec, seed: int, rest: str = "") -> str:
    """The command that replays a run's faults (``rest``: its other flags, trace and cluster)."""
    return f"gavel simulate --engine services --faults {spec.text} --fault-seed {seed}" + (f" {rest}" if rest else "")
