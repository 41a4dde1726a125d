"""One round boundary at cluster scale, and the mechanism's snapshot at that size.

Builds a cluster of N GPUs (a third of each of v100, p100, k80; 4 GPUs a server) with 2N active
jobs of Gavel's table (single-GPU and gangs of 2, 4 and 8 as its multi-GPU traces draw them,
every job with an allocation on every type), runs rounds until the schedule is in steady state,
then times each step of one boundary as the mechanism runs it (mechanism_service/core/rounds.py):

    settle   close_round: credit the ended round's leases
    admit    admit_arrivals: 1% of the jobs arrive (as many finished)
    plan     the ledgers' reset, the answer installed, the migration holds, the priorities and
             the greedy pick; "re-lay" is the part of it the default preset's steady allocation
             takes (core/stability.py: the answer re-laid over the types, one LP at a reset)
    place    placement (workers for every picked entry)

and the snapshot the service writes at such a boundary: the memory pickled as the journal
pickles it (common/journal.py), its size and time, the whole write through a journal (the
pickle, SQLite's row and its commit, in a temporary file), and how long loading it takes.

Prints medians of --repeat boundaries (each from the same state, copied) and the ratio against
the goal (50 ms a boundary at 10,000 GPUs): wall time and the process's CPU time (on a shared
machine the wall time includes waiting for a core), and the cyclic collector's share of the wall
time. Each copy is frozen (gc.freeze) before its boundary: a running service's state is old, and
a fresh copy's young objects would otherwise be walked by the collector during the boundary,
which is the copy's cost, not the boundary's (--no-freeze shows it).

Usage: python bench/round_plan.py [--gpus 1000,10000] [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import json
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.messages import Assignment, JobSpec  # noqa: E402
from common.throughputs import ThroughputTable  # noqa: E402
from mechanism_service.core import attempts as attempts_core  # noqa: E402
from mechanism_service.core import audit  # noqa: E402
from mechanism_service.core import reducers as reducers_core  # noqa: E402
from mechanism_service.core import status as status_core  # noqa: E402
from mechanism_service.core.intake import fingerprint  # noqa: E402
from mechanism_service.core.migration import next_stretches  # noqa: E402
from mechanism_service.core.model import MechanismState, new_state  # noqa: E402
from mechanism_service.core.planning.holds import fit_held_columns, held_columns  # noqa: E402
from mechanism_service.core.planning.picking import pick_columns, type_order  # noqa: E402
from mechanism_service.core.planning.placement import count_extensions, kept_entries, place  # noqa: E402
from mechanism_service.core.planning.priority import charge_move_columns, priority_columns  # noqa: E402
from mechanism_service.core.rates import TableRates  # noqa: E402
from mechanism_service.core.reducers import LeaseResult, NewJob, apply_allocation, record_first_runs  # noqa: E402
from mechanism_service.core.rounds import RoundPlan, admit_arrivals, begin_reset, close_round, open_round  # noqa: E402
from mechanism_service.core.settings import MechanismSettings, preset  # noqa: E402
from mechanism_service.core.memory import Memory  # noqa: E402
from policy_service.service import shipped_context  # noqa: E402
from common.journal import Journal  # noqa: E402

GOAL_S = 0.050  # one boundary at 10,000 GPUs
GPUS_PER_SERVER = 4
TYPES = ("v100", "p100", "k80")
SIZES = (1, 2, 4, 8)
SIZE_SHARES = (0.70, 0.10, 0.15, 0.05)  # Gavel's multi-GPU traces
WARM_ROUNDS = 3


def job_catalog(table: ThroughputTable) -> list[tuple[str, int]]:
    """(job type, scale factor) pairs the table runs on every type."""
    return sorted(
        (job_type, sf)
        for (job_type, sf, w) in table.isolated_steps_per_s
        if w == "v100" and all(table.isolated_steps_per_s.get((job_type, sf, t), 0.0) > 0 for t in TYPES)
    )


def new_jobs(count: int, first: int, arrival_s: float, catalog: list[tuple[str, int]], rng: np.random.Generator) -> list[NewJob]:
    jobs = []
    for k in range(count):
        size = int(rng.choice(SIZES, p=SIZE_SHARES))
        kinds = [c for c in catalog if c[1] == size] or [c for c in catalog if c[1] == 1]
        job_type, sf = kinds[int(rng.integers(len(kinds)))]
        jobs.append(NewJob(f"job-{first + k}", job_type, sf, int(rng.integers(10**5, 10**7)), arrival_s))
    return jobs


def even_allocation(state: MechanismState) -> dict[tuple[str, ...], dict[str, float]]:
    """Every job the same share of each type's GPU time (what LAS gives interchangeable jobs):
    the shape of a real answer, without a solve (the policy is not part of a boundary's time)."""
    gpu_demand = sum(j.scale_factor for j in state.jobs.values())
    return {
        (j.job_id,): {w: min(1.0, state.gpus[w] / gpu_demand) for w in state.gpus} for j in state.jobs.values()
    }


def results_of(state: MechanismState, plan: RoundPlan, now_s: float, settings: MechanismSettings) -> list[LeaseResult]:
    """Each lease runs its round at its believed rate."""
    out = []
    for entry, placement in plan.assignment.items():
        w = placement.accelerator_type
        rates = state.entries[entry].throughputs[w]
        steps = tuple(min(int(r * settings.round_s), state.jobs[i].steps_remaining) for i, r in zip(entry, rates, strict=True))
        out.append(LeaseResult(entry, placement, steps, now_s + settings.round_s))
    return out


def observe(memory: Memory, state: MechanismState, plan: RoundPlan, round_id: int, now_s: float) -> None:
    """What the service's dispatch notes for status (its history spans and attempts)."""
    for entry, placement in plan.assignment.items():
        workers = [f"w{g // GPUS_PER_SERVER}" for g in placement.worker_ids[::GPUS_PER_SERVER] or placement.worker_ids[:1]]
        extended = entry in plan.kept
        for i in entry:
            job_id = state.jobs[i].job_id
            status_core.record_placement(
                memory.observations, job_id, round_id, now_s, placement.accelerator_type, workers,
                extended=extended, packed_with=[],
            )
            attempt = attempts_core.continue_attempt if extended else attempts_core.start_attempt
            attempt(memory.observations.attempts, job_id, round_id=round_id, now_s=now_s,
                    accelerator_type=placement.accelerator_type, workers=workers)


def build(gpus: int, seed: int, steady: bool = True) -> tuple[Memory, MechanismSettings, TableRates, list[LeaseResult], float, list[tuple[str, int]]]:
    """A memory in steady state: 2 x gpus jobs admitted, allocated, WARM_ROUNDS rounds run."""
    context = shipped_context()
    assert context.table is not None
    rates = TableRates.of(context.table)
    settings = preset("default", "max_min_fairness_perf", gpus_per_server=GPUS_PER_SERVER)
    if not steady:
        settings = dataclasses.replace(settings, steady_types_tolerance=None)
    per_type = gpus // len(TYPES) // GPUS_PER_SERVER * GPUS_PER_SERVER
    state = new_state(dict.fromkeys(TYPES, per_type), GPUS_PER_SERVER)
    catalog = job_catalog(context.table)
    rng = np.random.default_rng(seed)
    memory = Memory(state=state, policy="max_min_fairness_perf", preset="default")
    jobs = new_jobs(2 * gpus, 0, 0.0, catalog, rng)
    for job in jobs:
        memory.intake.known[job.job_id] = fingerprint(JobSpec(job.job_id, job.job_type, total_steps=job.total_steps, scale_factor=job.scale_factor))
    admit_arrivals(state, jobs, settings, rates)
    now_s = 0.0
    results: list[LeaseResult] = []
    for round_id in range(WARM_ROUNDS):
        close_round(state, results, now_s - settings.round_s, settings)
        if begin_reset(state, now_s, settings, force=True):
            apply_allocation(state, even_allocation(state), {}, settings)
        plan = open_round(state, now_s, settings, lambda order: None)
        observe(memory, state, plan, round_id, now_s)
        results = results_of(state, plan, now_s, settings)
        now_s += settings.round_s
    return memory, settings, rates, results, now_s, catalog


class _Collector:
    """Seconds the cyclic garbage collector ran while installed."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started


class _Timed:
    """A function of a core module, wrapped to sum the seconds it runs (the bench's own probe)."""

    def __init__(self, module: object, name: str) -> None:
        self.module, self.name, self.inner, self.seconds = module, name, getattr(module, name), 0.0
        setattr(module, name, self)

    def __call__(self, *args: object, **kwargs: object) -> object:
        t0 = time.perf_counter()
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0


RELAY = _Timed(reducers_core, "steady_allocation")


def one_boundary(memory: Memory, settings: MechanismSettings, rates: TableRates, results: list[LeaseResult], now_s: float,
                 arrivals: list[NewJob]) -> dict[str, float]:
    state = memory.state
    assert state is not None
    times: dict[str, float] = {}
    answer = {**even_allocation(state), **{(j.job_id,): {w: 0.01 for w in state.gpus} for j in arrivals}}  # the policy's
    collector = _Collector()
    gc.callbacks.append(collector)
    RELAY.seconds = 0.0
    # The audit record a journaling mechanism writes (mechanism_service/core/audit.py): the
    # settled leases' members before the settle, outside the core's timed boundary
    a0 = time.perf_counter()
    charging = audit.settling([f"0:{r.entry}" for r in results], results, state.jobs.get)
    a1 = time.perf_counter()
    c0 = time.process_time()
    t0 = time.perf_counter()
    close_round(state, results, now_s - settings.round_s, settings)
    t1 = time.perf_counter()
    admit_arrivals(state, arrivals, settings, rates)
    t2 = time.perf_counter()
    # The reset folds the ledgers (a solve would follow: the policy's time is not the boundary's)
    begin_reset(state, now_s, settings, force=True)
    apply_allocation(state, answer, {}, settings)
    order = type_order(state, settings)
    # open_round's steps (mechanism_service/core/rounds.py), timed apart
    reserved = fit_held_columns(state, held_columns(state, now_s, settings), [])
    queues = priority_columns(state)
    if settings.charge_moves:
        queues = charge_move_columns(state, queues, settings)
    picked = pick_columns(state, queues, order, settings, reserved=reserved)
    t3 = time.perf_counter()
    assignment = place(state, picked, order, settings)
    kept = kept_entries(state, assignment)
    extended, opportunities = count_extensions(state, assignment, kept)
    state.stretch_rounds = next_stretches(state.stretch_rounds, assignment, kept)
    state.previous_assignment = assignment
    record_first_runs(state, assignment, now_s)
    t4 = time.perf_counter()
    c4 = time.process_time()
    assignments = [
        Assignment(tuple(state.jobs[i].job_id for i in entry), f"w{p.worker_ids[0] // GPUS_PER_SERVER}", p.accelerator_type,
                   p.worker_ids, "1:0", entry in kept)
        for entry, p in assignment.items()
    ]
    a2 = time.perf_counter()
    record = audit.BoundaryRecord(1, now_s, 1, (), (), None, None)
    audit.encode_boundary_columns(record, assignments, audit.settled_leases(charging))
    a3 = time.perf_counter()
    gc.callbacks.remove(collector)
    times.update(
        settle_s=t1 - t0, admit_s=t2 - t1, plan_s=t3 - t2, place_s=t4 - t3, boundary_s=t4 - t0, boundary_cpu_s=c4 - c0,
        gc_s=collector.seconds, relay_s=RELAY.seconds, audit_s=(a1 - a0) + (a3 - a2),
    )
    times["leases"] = len(assignment)
    return times


def measure(gpus: int, repeat: int, seed: int, freeze: bool = True, steady: bool = True) -> dict[str, float]:
    memory, settings, rates, results, now_s, catalog = build(gpus, seed, steady)
    state = memory.state
    assert state is not None
    rng = np.random.default_rng(seed + 1)
    arrivals = new_jobs(max(1, gpus // 50), 10 * gpus, now_s, catalog, rng)
    runs = []
    for _ in range(repeat):
        copied = copy.deepcopy(memory)
        if freeze:
            gc.collect()
            gc.freeze()
        runs.append(one_boundary(copied, settings, rates, results, now_s, arrivals))
        gc.unfreeze()
        del copied
    row = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    gc.collect()
    gc.freeze()  # the memory is old, as a service's is when it writes a snapshot
    dumps, dumps_cpu, loads = [], [], []
    body = b""
    for _ in range(repeat):
        c0 = time.process_time()
        t0 = time.perf_counter()
        body = pickle.dumps(memory, protocol=pickle.HIGHEST_PROTOCOL)
        t1 = time.perf_counter()
        c1 = time.process_time()
        gc.disable()  # as Journal.load_snapshot loads
        pickle.loads(body)  # noqa: S301 - written just above
        gc.enable()
        t2 = time.perf_counter()
        dumps.append(t1 - t0)
        dumps_cpu.append(c1 - c0)
        loads.append(t2 - t1)
    writes = []
    with tempfile.TemporaryDirectory() as scratch:
        journal = Journal(Path(scratch) / "mechanism.sqlite")
        for _ in range(repeat):
            t0 = time.perf_counter()
            journal.save_snapshot(memory)
            writes.append(time.perf_counter() - t0)
        journal.close()
    gc.unfreeze()
    row.update(
        gpus=sum(state.gpus.values()), jobs=len(state.jobs), entries=len(state.entries),
        snapshot_s=statistics.median(dumps), snapshot_cpu_s=statistics.median(dumps_cpu),
        snapshot_load_s=statistics.median(loads), snapshot_bytes=len(body), journal_write_s=statistics.median(writes),
    )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", default="1000,10000", help="cluster sizes, comma-separated")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-freeze", action="store_true", help="leave each fresh copy to the collector")
    parser.add_argument("--no-steady", action="store_true", help="the default preset without its steady allocation")
    args = parser.parse_args()
    rows = [measure(int(g), args.repeat, args.seed, not args.no_freeze, not args.no_steady) for g in args.gpus.split(",")]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    steady = "without its steady allocation" if args.no_steady else "with its steady allocation"
    print(f"one boundary, medians of {args.repeat} (default preset {steady}, max_min_fairness_perf shapes,"
          f" {GPUS_PER_SERVER} GPUs a server)")
    print(f"{'GPUs':>7} {'jobs':>7} {'leases':>7} {'settle':>8} {'admit':>8} {'plan':>8} {'place':>8} {'boundary':>9} {'cpu':>8}"
          f" {'gc':>7} {'re-lay':>8} {'vs goal':>8} {'snapshot':>9} {'cpu':>8} {'size':>8} {'journal':>9} {'audit':>8} {'load':>8}")
    for r in rows:
        print(
            f"{r['gpus']:7.0f} {r['jobs']:7.0f} {r['leases']:7.0f} {1e3 * r['settle_s']:6.1f}ms {1e3 * r['admit_s']:6.1f}ms"
            f" {1e3 * r['plan_s']:6.1f}ms {1e3 * r['place_s']:6.1f}ms {1e3 * r['boundary_s']:7.1f}ms"
            f" {1e3 * r['boundary_cpu_s']:6.1f}ms {1e3 * r['gc_s']:5.1f}ms {1e3 * r['relay_s']:6.1f}ms {r['boundary_s'] / GOAL_S:7.2f}x"
            f" {1e3 * r['snapshot_s']:7.1f}ms {1e3 * r['snapshot_cpu_s']:6.1f}ms {r['snapshot_bytes'] / 1e6:6.2f}MB"
            f" {1e3 * r['journal_write_s']:7.1f}ms {1e3 * r['audit_s']:6.1f}ms"
            f" {1e3 * r['snapshot_load_s']:6.1f}ms"
        )
    print(f"goal: a boundary <= {1e3 * GOAL_S:.0f} ms at 10,000 GPUs (vs goal = boundary's wall time / goal);"
          " cpu: the process's CPU time; gc: the cyclic collector's wall time within the boundary;"
          " journal: the snapshot written through common/journal.py (pickle, SQLite row, commit);"
          " audit: the boundary's audit record (core/audit.py: settled leases before and after, encoded), written with it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
