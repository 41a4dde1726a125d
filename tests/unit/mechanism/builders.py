"""Builders for the mechanism core's tests: a tiny throughput table, fluent MechanismState
construction (jobs are admitted through the real reducer, ledgers and allocations then set by
hand), lease results, queue rows and expected JobState values.

The table is made for hand computation: job type ``a`` runs 1/2/4 steps/s on k80/p100/v100,
``b`` ten times that, ``c`` a hundred times; ``nok80`` cannot run on k80 (0 steps/s). A gang's
throughput is the 1-GPU value times its scale factor. A pair runs its lower-index member at half
its isolated rate and its higher-index member at a quarter, so the order of a pair's throughputs
is visible: pair(a, b) on k80 = (0.5, 2.5), pair(b, a) on k80 = (5.0, 0.25).
"""

from __future__ import annotations

from dataclasses import replace

from mechanism_service.core.model import Entry, JobState, MechanismState, Placement, new_state
from mechanism_service.core.planning.priority import QueueRow
from mechanism_service.core.rates import TableRates
from mechanism_service.core.reducers import LeaseResult, NewJob, admit, remove_job
from mechanism_service.core.settings import MechanismSettings, default_preset, gavel_preset

ISOLATED = {
    "a": {"k80": 1.0, "p100": 2.0, "v100": 4.0},
    "b": {"k80": 10.0, "p100": 20.0, "v100": 40.0},
    "c": {"k80": 100.0, "p100": 200.0, "v100": 400.0},
    "nok80": {"k80": 0.0, "p100": 2.0, "v100": 4.0},
}


def isolated(job_type: str, scale_factor: int, accelerator_type: str) -> float:
    return ISOLATED[job_type][accelerator_type] * scale_factor


def pair(lo_type: str, hi_type: str, scale_factor: int, accelerator_type: str) -> tuple[float, float]:
    return (
        isolated(lo_type, scale_factor, accelerator_type) / 2,
        isolated(hi_type, scale_factor, accelerator_type) / 4,
    )


RATES = TableRates(isolated, pair)

# Settings under test. max_min_fairness_perf: fixed type order, no packing, not FIFO.
GAVEL = gavel_preset("max_min_fairness_perf")
GAVEL_PACKED = gavel_preset("max_min_fairness_packed")
GAVEL_FIFO = gavel_preset("fifo_perf")
GAVEL_SHUFFLED = gavel_preset("max_min_fairness")
DEFAULT = default_preset("max_min_fairness_perf")


class StateBuilder:
    """``state(k80=4).packing().job("a").job("b", scale_factor=2).allocate((0,), k80=0.5).build()``"""

    def __init__(self, gpus: dict[str, int], gpus_per_server: int = 1) -> None:
        self._state = new_state(gpus, gpus_per_server)
        self._settings = GAVEL

    def with_settings(self, settings: MechanismSettings) -> StateBuilder:
        self._settings = settings
        return self

    def packing(self) -> StateBuilder:
        self._settings = replace(self._settings, packing=True)
        return self

    def job(
        self,
        job_type: str = "a",
        *,
        scale_factor: int = 1,
        steps: int = 1000,
        arrival_s: float = 0.0,
        weight: float = 1.0,
        slo_s: float | None = None,
        entity: str | None = None,
    ) -> StateBuilder:
        """Admit job ``j<index>`` through the real reducer."""
        job_id = f"j{self._state.next_index}"
        admit(
            self._state,
            NewJob(job_id, job_type, scale_factor, steps, arrival_s, weight, slo_s, entity),
            self._settings,
            RATES,
        )
        return self

    def jobs(self, count: int, job_type: str = "a", **options: object) -> StateBuilder:
        for _ in range(count):
            self.job(job_type, **options)  # type: ignore[arg-type]
        return self

    def done(self, index: int, steps: int, **fields: object) -> StateBuilder:
        """Job ``index`` has done ``steps`` steps (and any other JobState fields given)."""
        job = self._state.jobs[index]
        job.steps_done = steps
        for name, value in fields.items():
            setattr(job, name, value)
        return self

    def remove(self, index: int) -> StateBuilder:
        remove_job(self._state, index)
        return self

    def allocate(self, entry: Entry, **fractions: float) -> StateBuilder:
        self._state.allocation[entry] = dict(fractions)
        return self

    def received(self, entry: Entry, **by_type: float) -> StateBuilder:
        self._state.entries[entry].received_s.update(by_type)
        return self

    def deficit(self, entry: Entry, **by_type: float) -> StateBuilder:
        self._state.entries[entry].deficit_s.update(by_type)
        return self

    def type_time(self, **by_type: float) -> StateBuilder:
        self._state.type_time_s.update(by_type)
        return self

    def reset_at(self, last_reset_s: float, resets: int = 1) -> StateBuilder:
        self._state.last_reset_s = last_reset_s
        self._state.resets = resets
        return self

    def settled(self) -> StateBuilder:
        """No change since the last allocation."""
        self._state.needs_allocation = False
        return self

    def ran(self, entry: Entry, accelerator_type: str, *worker_ids: int) -> StateBuilder:
        """``entry`` held these workers in the previous round."""
        self._state.previous_assignment[entry] = Placement(accelerator_type, worker_ids)
        return self

    def build(self) -> MechanismState:
        return self._state


def no_shuffle(order: list[str]) -> None:
    """A shuffle a policy must never ask for (max_min_fairness_perf never reshuffles)."""
    raise AssertionError("max_min_fairness_perf never reshuffles")


def state(gpus_per_server: int = 1, **gpus: int) -> StateBuilder:
    return StateBuilder(gpus, gpus_per_server)


def lease(
    entry: Entry, accelerator_type: str, workers: tuple[int, ...], steps: tuple[int, ...], finish_s: float
) -> LeaseResult:
    return LeaseResult(entry, Placement(accelerator_type, workers), steps, finish_s)


def row(entry: Entry, priority: float, deficit_s: float = 0.0, allocation: float = 0.0) -> QueueRow:
    return QueueRow(entry, priority, deficit_s, allocation)


def queue(s: MechanismState, priority: dict[Entry, float], deficit: dict[Entry, float] | None = None) -> list[QueueRow]:
    """A row for every entry of ``s`` in admission order; priority (and deficit) 0 unless given."""
    deficit = deficit or {}
    return [row(e, priority.get(e, 0.0), deficit.get(e, 0.0)) for e in s.entries]


def job_state(
    index: int,
    job_type: str = "a",
    *,
    types: tuple[str, ...],
    scale_factor: int = 1,
    steps: int = 1000,
    arrival_s: float = 0.0,
    gpu_seconds: dict[str, float] | None = None,
    **fields: object,
) -> JobState:
    """The JobState a builder job would have, with the given fields changed."""
    seconds = dict.fromkeys(types, 0.0)
    seconds.update(gpu_seconds or {})
    return JobState(
        index=index,
        job_id=f"j{index}",
        job_type=job_type,
        scale_factor=scale_factor,
        priority_weight=1.0,
        total_steps=steps,
        arrival_s=arrival_s,
        gpu_seconds_by_type=seconds,
        **fields,  # type: ignore[arg-type]
    )
