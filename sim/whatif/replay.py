"""A live cluster's history (sim/whatif/history.py) as the simulator's input, with what really
happened beside it (sim/whatif/real.py: a ``SimulationResult``, measured by the same code as the
replays). Pure: values in, values out.

The replay is the real run's by construction where the journal says how it ran: the same jobs
(arrival on the mechanism's clock, size, steps, priority, SLO, entity), the same fleet (the last
one the boundaries recorded), the same round length and preset, boundaries as late as the real
ones were on average, and each job's own steps/s on each type:

- measured: over its leases alone on that type, the rate at which a replayed lease does what the
  real ones did (``measured_steps_per_s``: their steps over their time less the preset's restore);
- otherwise assumed, as the mechanism would have: the estimator's latest word in the journal, the
  submitter's ``--throughput``, the reference table's row for its job type, or the typical job of
  its size (mechanism_service/core/rates.py's order).

Jobs whose rows are equal share a job type in the replay's table (the reference's own name when
the row is the reference's, so the table's packed pairs still apply); a job with a row of its own
gets a type of its own, named after its job type.

``--from T`` (``from_s``): the jobs that arrived T seconds or more after the first arrival are
measured; the jobs still in the cluster then are replayed from T with the steps they had left, as
load, unmeasured. The real run's figures are over the same measured jobs. Only the jobs that
completed in the real run are measured, in every run, so averages compare like with like; the
others (cancelled or failed: the steps they got; still running: all their steps) are load.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from common.errors import ReplayError
from common.throughputs import ThroughputTable
from mechanism_service.core.settings import PRESETS, preset
from sim.results import SimulationResult
from sim.traces import TraceJob
from sim.whatif.history import History, JobRecord, LeaseRun
from sim.whatif.real import boundary_lag_s, real_result

SOURCES = ("measured", "estimated", "submitter", "table", "typical")


@dataclass(frozen=True, slots=True)
class Cells:
    """How many (job, accelerator type) steps/s of the replayed jobs came from each source."""

    by_source: Mapping[str, int]

    @property
    def measured(self) -> int:
        return self.by_source.get("measured", 0)

    @property
    def assumed(self) -> int:
        return sum(self.by_source.values()) - self.measured


@dataclass(frozen=True, slots=True)
class ReplaySetup:
    trace: tuple[TraceJob, ...]  # the unmeasured load first, then the measured jobs (the window)
    table: ThroughputTable  # the replay's steps/s: a row per distinct job row
    cluster: Mapping[str, int]  # accelerator type -> GPUs at the comparison's start
    gpus_per_server: int
    round_s: float
    preset: str
    policy: str | None  # the policy the real run ran (None: the journal names none)
    window: tuple[int, int]  # trace positions of the measured jobs
    origin_s: float  # the comparison's time zero on the mechanism's clock
    real: SimulationResult  # what happened, on the mechanism's clock
    cells: Cells
    notes: tuple[str, ...]  # what the replay cannot reproduce of this run
    # the real run's mean time from a round's last lease end to the next boundary, which the
    # replays' rounds take too (None: no round was closed by the next boundary)
    boundary_lag_s: float | None = None
    fleets: tuple[tuple[float, Mapping[str, int]], ...] = ()  # the real fleet at each change (mechanism's clock)
    # the fleet's changes after the start, which the replays follow (RunConfig.fleet_changes)
    fleet_changes: tuple[tuple[float, tuple[tuple[str, int], ...]], ...] = ()
    clocks: tuple[str, ...] = ()  # what the real workers' leases ran on ("scaled x100", ...)


def setup(
    history: History, reference: ThroughputTable, *, from_s: float | None = None, round_s: float | None = None,
    preset_name: str | None = None,
) -> ReplaySetup:
    """``reference``: the table the mechanism was started with (its fallback for cells never
    measured). ``round_s``, ``preset_name``: for a journal that does not record them."""
    ends = history.ends
    jobs = list(history.jobs)
    completed = [j for j in jobs if j.job_id in ends and ends[j.job_id].completion_s is not None]
    if not completed:
        raise ReplayError("no job finished in this journal: there is no real run to compare with")
    first_s = min(j.arrival_s for j in jobs)
    origin_s = first_s + (from_s or 0.0)
    last_s = max(j.arrival_s for j in jobs)
    if from_s is not None and origin_s > last_s:
        raise ReplayError(
            f"--from {from_s:g}: after the last arrival ({last_s - first_s:g} s after the first); nothing arrived then"
        )
    measured = [j for j in completed if j.arrival_s >= origin_s]
    if not measured:
        raise ReplayError(f"--from {from_s:g}: no job that arrived after it finished in this journal")
    cluster, changes, gpus_per_server, notes = _cluster(history, origin_s)
    types = tuple(sorted({*cluster, *(w for _, fleet in changes for w, _ in fleet)}))
    round_s = _round_s(history, round_s)
    preset_name = _preset(history, preset_name, notes)
    load = _load(history, origin_s, {j.job_id for j in measured})

    replayed = [*load, *((j, j.total_steps, j.arrival_s) for j in measured)]
    restore_s = preset(preset_name, history.last_policy or "max_min_fairness").restore_s
    rows, cells = _rows(history, reference, [j for j, _, _ in replayed], types, restore_s)
    names, table = _table(reference, [(j, rows[j.job_id]) for j, _, _ in replayed], types)
    trace = tuple(
        TraceJob(j.job_id, names[j.job_id], steps, j.scale_factor, arrival_s, j.priority_weight, j.slo_s, entity=j.entity)
        for j, steps, arrival_s in replayed
    )
    window = (len(load), len(replayed))
    real = real_result(history, replayed, window, names, cluster, round_s, preset_name, origin_s)
    notes.extend(_differences(history, round_s, origin_s))
    return ReplaySetup(
        trace, table, cluster, gpus_per_server, round_s, preset_name, history.last_policy, window, origin_s, real,
        cells, tuple(notes), _lag_s(history, origin_s), history.fleets, changes, history.clocks,
    )


# --- the cluster and the settings -------------------------------------------------------------


def fleet_gpus(setup: ReplaySetup) -> tuple[tuple[float, int], ...]:
    """The cluster's GPUs from each time on, from the comparison's time zero (compare.run_figures'
    ``fleet_gpus``); empty when the fleet did not change after the start."""
    if not setup.fleet_changes:
        return ()
    return ((0.0, sum(setup.cluster.values())),) + tuple(
        (at_s - setup.origin_s, sum(gpus for _, gpus in fleet)) for at_s, fleet in setup.fleet_changes
    )


def _cluster(
    history: History, origin_s: float
) -> tuple[dict[str, int], tuple[tuple[float, tuple[tuple[str, int], ...]], ...], int, list[str]]:
    """The fleet at the comparison's start (the last recorded by then, else the first), its
    changes after (each fleet as (type, GPUs) pairs), the GPUs per server, and notes."""
    if not history.fleets:
        raise ReplayError("the journal records no worker: the cluster it ran on is unknown")
    notes = []
    before = [fleet for at_s, fleet in history.fleets if at_s <= origin_s]
    start = before[-1] if before else history.fleets[0][1]
    cluster = {w: gpus for w, gpus in start.items() if gpus > 0}
    changes = tuple(
        (at_s, tuple((w, gpus) for w, gpus in fleet.items() if gpus > 0)) for at_s, fleet in history.fleets if at_s > origin_s
    )
    if not cluster and not any(fleet for _, fleet in changes):
        raise ReplayError("the journal's fleet has no GPU")
    if changes:
        notes.append(
            f"the fleet changed {len(changes)} time(s) after the start; the replays follow it at their next boundary "
            "(servers join and leave between rounds, not during a lease)"
        )
    sizes = set(history.gpus_per_worker) or {1}
    gpus_per_server = math.gcd(*sizes)
    if len(sizes) > 1:
        notes.append(f"its workers have {', '.join(map(str, sorted(sizes)))} GPUs; the replay's servers have {gpus_per_server}")
    return cluster, changes, gpus_per_server, notes


def _round_s(history: History, given: float | None) -> float:
    if given is not None:
        return given
    if history.round_s is None:
        raise ReplayError("the journal does not record the round length (a journal from before it did): give --round-s")
    return history.round_s


def _preset(history: History, given: str | None, notes: list[str]) -> str:
    """The preset whose accounting the boundary records say (each preset's
    ``round_start_from_previous_end``), unless given."""
    if given is not None:
        return given
    if history.charges_from_previous_end is None:
        notes.append("the journal does not say the preset: the replay assumes default (--preset to choose)")
        return "default"
    policy = history.last_policy or "max_min_fairness"
    return next(
        name for name, make in PRESETS.items()
        if make(policy).round_start_from_previous_end == history.charges_from_previous_end
    )


def _differences(history: History, round_s: float, origin_s: float) -> list[str]:
    """What the journal shows of this run that a replay does not reproduce."""
    notes = []
    if len(history.policies) > 1:
        shown = ", ".join(f"{p} ({n} allocations)" for p, n in history.policies.items())
        notes.append(f"the run changed policy ({shown}); the real run is compared as {history.last_policy}")
    if history.starts > 1:
        notes.append(f"the mechanism restarted {history.starts - 1} time(s); the replay runs without interruption")
    if history.workers_lost:
        notes.append(
            f"{history.workers_lost} worker(s) were lost during the run: the replays lose their GPUs at the next "
            "boundary (the fleet's changes), and no lease's work with them"
        )
    if any(lease.crashed for lease in history.leases):
        notes.append("some leases crashed in the real run; the replay's leases never do")
    lag_s = _lag_s(history, origin_s)
    if lag_s is not None and lag_s > 0.001 * round_s:
        clock = f" (its workers' clock: {', '.join(history.clocks)})" if history.clocks else ""
        notes.append(
            f"its boundaries came {lag_s:.3g} s after their round's leases ended (or an arrival woke it), on average "
            f"({lag_s / round_s:.1%} of a round: the time to hear every report and decide, times the clock's scale{clock}); "
            "the replays' boundaries take as long unless --boundary-lag-s says otherwise"
        )
    return notes


def _lag_s(history: History, origin_s: float) -> float | None:
    return boundary_lag_s(history.leases, {j.job_id: j.arrival_s for j in history.jobs}, origin_s)


# --- the jobs --------------------------------------------------------------------------------


def _load(history: History, origin_s: float, measured: set[str]) -> list[tuple[JobRecord, int, float]]:
    """The unmeasured jobs as (job, steps to replay, arrival): those in the cluster at the origin
    with the steps they had left then, and those that arrived later and did not complete (the
    steps they got when they ended early; all of them when still running at the journal's end)."""
    credited_total: collections.Counter[str] = collections.Counter()
    credited_before: collections.Counter[str] = collections.Counter()
    for at_s, job_id, steps in history.credited:
        credited_total[job_id] += steps
        if at_s <= origin_s:
            credited_before[job_id] += steps
    out = []
    for job in history.jobs:
        if job.job_id in measured:
            continue
        end = history.ends.get(job.job_id)
        ended_s = None if end is None else (end.completion_s if end.completion_s is not None else end.at_s)
        if ended_s is not None and ended_s <= origin_s:
            continue  # over before the replay starts
        work = job.total_steps if end is None or end.outcome == "completed" else credited_total[job.job_id]
        steps = work - credited_before[job.job_id] if job.arrival_s < origin_s else work
        if steps > 0:
            out.append((job, steps, max(job.arrival_s, origin_s)))
    return out


def _rows(
    history: History, reference: ThroughputTable, jobs: Sequence[JobRecord], types: tuple[str, ...], restore_s: float,
) -> tuple[dict[str, tuple[float, ...]], Cells]:
    """Each job's steps/s per type (``types`` order), and where each came from."""
    measured = measured_steps_per_s(history.leases, restore_s)
    sources: collections.Counter[str] = collections.Counter()
    rows = {}
    typical: dict[int, dict[str, float]] = {}
    for job in jobs:
        row = []
        for w in types:
            if (job.job_id, w) in measured:
                value, source = measured[(job.job_id, w)], "measured"
            elif w in history.estimates.get(job.job_id, {}):
                value, source = history.estimates[job.job_id][w], "estimated"
            elif job.user_estimate_steps_per_s and w in job.user_estimate_steps_per_s:
                value, source = float(job.user_estimate_steps_per_s[w]), "submitter"
            elif reference.has_job(job.job_type, job.scale_factor):
                # the reference knows the job, and not on this type: it cannot run there
                value, source = reference.isolated_steps_per_s.get((job.job_type, job.scale_factor, w), 0.0), "table"
            else:
                if job.scale_factor not in typical:
                    typical[job.scale_factor] = reference.typical_isolated(job.scale_factor)
                value, source = typical[job.scale_factor].get(w, 0.0), "typical"
            row.append(float(value))
            sources[source] += 1
        rows[job.job_id] = tuple(row)
    return rows, Cells(dict(sources))


def measured_steps_per_s(leases: Sequence[LeaseRun], restore_s: float) -> dict[tuple[str, str], float]:
    """(job id, accelerator type) -> the steps/s a replayed lease must run at to do what the job's
    real leases alone on that type did: their steps over their time less what the simulator
    charges apart (``restore_s`` for a lease that is not an extension). So a real worker's
    start-up and checkpoints, which the simulator does not model, slow the rate as they slowed
    the leases. Where the reported steps/s while stepping explains every lease's time to the
    microsecond (a simulated fleet's, one figure), that figure is kept exactly."""
    done: dict[tuple[str, str], int] = collections.defaultdict(int)
    run_s: dict[tuple[str, str], float] = collections.defaultdict(float)
    reported: dict[tuple[str, str], set[float]] = collections.defaultdict(set)
    explained: dict[tuple[str, str], bool] = collections.defaultdict(lambda: True)
    for lease in leases:
        if len(lease.job_ids) != 1 or lease.crashed or not lease.reported:
            continue  # a packed lease measures the pair, not the job alone
        steps, rate = lease.steps[0], lease.steps_per_s[0]
        ran_s = lease.elapsed_s - (0.0 if lease.extended else restore_s)
        if steps <= 0 or ran_s <= 0:
            continue
        key = (lease.job_ids[0], lease.accelerator_type)
        done[key] += steps
        run_s[key] += ran_s
        reported[key].add(rate)
        explained[key] &= rate > 0 and abs(steps / rate - ran_s) <= 1e-6 * max(ran_s, 1.0)
    return {
        key: next(iter(reported[key])) if explained[key] and len(reported[key]) == 1 else done[key] / run_s[key]
        for key in done
    }


def _table(
    reference: ThroughputTable, rows: Sequence[tuple[JobRecord, tuple[float, ...]]], types: tuple[str, ...]
) -> tuple[dict[str, str], ThroughputTable]:
    """job id -> its job type in the replay's table, and that table: one type per distinct row,
    the reference's name for the reference's own row (its pairs kept as they are), a name of its
    own for any other (its pairs derived: ``_derived_pairs``)."""
    names: dict[str, str] = {}
    kind_of: dict[tuple[str, int, tuple[float, ...]], str] = {}
    per_type: collections.Counter[str] = collections.Counter()
    isolated: dict[tuple[str, int, str], float] = {}
    own_rows: dict[str, tuple[str, int, tuple[float, ...]]] = {}  # a renamed kind -> (job type, size, row)
    for job, row in rows:
        key = (job.job_type, job.scale_factor, row)
        name = kind_of.get(key)
        if name is None:
            own = tuple(reference.isolated_steps_per_s.get((job.job_type, job.scale_factor, w)) for w in types)
            if own == row:
                name = job.job_type
            else:
                per_type[job.job_type] += 1
                name = f"{job.job_type} [row {per_type[job.job_type]}]"
                own_rows[name] = key
            kind_of[key] = name
            isolated.update({(name, job.scale_factor, w): value for w, value in zip(types, row)})
        names[job.job_id] = name
    kept = {name for name in kind_of.values() if name not in own_rows}
    pairs = {
        k: v for k, v in reference.pair_steps_per_s.items() if k[0] in kept and k[1] in kept and k[3] in types
    }
    if len(kind_of) <= MAX_PAIRED_KINDS:
        pairs.update(_derived_pairs(reference, {n: k for k, n in kind_of.items()}, own_rows, types))
    return names, ThroughputTable(types, MappingProxyType(isolated), MappingProxyType(pairs))


# A renamed kind is paired with every kind of its size: kinds^2 x types entries. Beyond this many
# kinds (40,000 pairs per type) the renamed ones are left unpaired (docs/whatif.md).
MAX_PAIRED_KINDS = 200


def _derived_pairs(
    reference: ThroughputTable, kinds: Mapping[str, tuple[str, int, tuple[float, ...]]],
    own_rows: Mapping[str, tuple[str, int, tuple[float, ...]]], types: tuple[str, ...],
) -> dict[tuple[str, str, int, str], tuple[float, float]]:
    """A pair with a kind of its own row keeps, of each member's steps/s alone, the share the
    reference's pair of their job types keeps (the estimator's factorised model: a job's row times
    its class pair's fractions, docs/estimator.md); none where the reference has no such pair."""
    out = {}
    for a in own_rows:
        type_a, size, row_a = kinds[a]
        for b, (type_b, size_b, row_b) in kinds.items():
            if size_b != size:
                continue
            for k, w in enumerate(types):
                base = reference.pair_steps_per_s.get((type_a, type_b, size, w))
                alone_a = reference.isolated_steps_per_s.get((type_a, size, w), 0.0)
                alone_b = reference.isolated_steps_per_s.get((type_b, size, w), 0.0)
                if base is None or alone_a <= 0 or alone_b <= 0:
                    continue
                fa, fb = base[0] / alone_a, base[1] / alone_b
                out[(a, b, size, w)] = (row_a[k] * fa, row_b[k] * fb)
                out[(b, a, size, w)] = (row_b[k] * fb, row_a[k] * fa)
    return out
