"""A sweep's cells: what one simulation of a sweep is, its ids, and running it.

A cell (common/messages/sweep.py, SweepCellRequested) carries everything a simulator needs, so
the same value runs in a worker process of ``gavel sweep`` or in ``gavel serve simulator`` on
another machine, with the same code (``run_cell``): the trace is generated from its parameters
(Gavel's generator, same seed, same trace), the throughput table is named by its digest.

Ids are derived from what they name, never drawn: the sweep id from everything its cells share
(trace size, cluster, preset, round, window, table, options), the cell id from the sweep id and
the cell's policy, rate, seed and option. A restarted sweep with the same arguments therefore has
the same ids, finds its finished cells in its ledger and asks only for the others; a result that
comes back twice has one id and counts once.

The option axis (``gavel sweep --variant LABEL=FLAGS``): a ``Variant`` is a label and the cell
fields its flags set (preset, round, the generator's and the Scenario's options, the sweep's own
with the variant's flags over them). A variant's cell id also covers those fields, and the sweep id
does not name the variants: the same sweep with one variant more runs only the new variant's
cells, and a variant whose flags changed under the same label runs again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

from common.errors import PluginError
from common.messages import SweepCellFinished, SweepCellRequested
from policy_service.answer import SolveContext
from sim import sweep_jobs

ID_CHARS = 16  # hex digits of a sweep or cell id (64 bits: no collision within any sweep)


def table_digest(text: str | bytes | None) -> str:
    """The digest that names a throughput table in a cell: sha256 of its JSON, canonical (keys
    sorted, no spaces), so a reformatted copy of a table is the same table. None: the shipped one."""
    if text is None:
        text = (resources.files("common") / "data" / "simulation_throughputs.json").read_bytes()
    canonical = json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Variant:
    """One value of a sweep's option axis: its label and the fields of its cells."""

    label: str
    preset: str = "default"
    round_s: float = 360.0
    trace_json: str = ""
    scenario_json: str = ""


@dataclass(frozen=True, slots=True)
class SweepSpec:
    """What every cell of a sweep shares."""

    num_jobs: int
    multi_gpu: bool
    cluster: Mapping[str, int]
    table_sha256: str
    preset: str = "default"
    round_s: float = 360.0
    gpus_per_server: int = 1
    window: tuple[int, int] | None = None
    trace_json: str = ""  # the generator's other options (SweepCellRequested.trace_json)
    scenario_json: str = ""  # other Scenario fields (SweepCellRequested.scenario_json)
    variants: tuple[Variant, ...] = ()  # the option axis (none: every cell has the fields above)

    @property
    def sweep_id(self) -> str:
        shared = {
            "num_jobs": self.num_jobs, "multi_gpu": self.multi_gpu, "cluster": sorted(self.cluster.items()),
            "table": self.table_sha256, "preset": self.preset, "round_s": self.round_s,
            "gpus_per_server": self.gpus_per_server, "window": list(self.window) if self.window else None,
            "trace": self.trace_json, "scenario": self.scenario_json,
        }
        return _digest(json.dumps(shared, sort_keys=True))

    def cell(self, policy: str, jobs_per_hour: float, seed: int, option: str = "") -> SweepCellRequested:
        """The cell; ``option`` a variant's label takes that variant's fields (another label is
        only a label, the cell has the shared fields)."""
        sweep_id = self.sweep_id
        start, end = self.window if self.window else (-1, -1)
        named = json.dumps([sweep_id, policy, repr(float(jobs_per_hour)), seed, option])  # a cell without variants
        fields = next((v for v in self.variants if v.label == option), None) if option else None
        if fields is None:
            fields = Variant(option, self.preset, self.round_s, self.trace_json, self.scenario_json)
        else:  # what the variant's flags set is in its id: other flags under the same label are other cells
            named += json.dumps([fields.preset, repr(float(fields.round_s)), fields.trace_json, fields.scenario_json])
        return SweepCellRequested(
            sweep_id=sweep_id,
            cell_id=_digest(named),
            policy=policy,
            jobs_per_hour=float(jobs_per_hour),
            seed=seed,
            num_jobs=self.num_jobs,
            multi_gpu=self.multi_gpu,
            cluster=dict(self.cluster),
            table_sha256=self.table_sha256,
            preset=fields.preset,
            round_s=fields.round_s,
            gpus_per_server=self.gpus_per_server,
            window_start=start,
            window_end=end,
            option=option,
            trace_json=fields.trace_json,
            scenario_json=fields.scenario_json,
        )


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:ID_CHARS]


def describe(cell: SweepCellRequested) -> str:
    """A cell as a person names it, in a log line or an error."""
    option = f", option {cell.option}" if cell.option else ""
    return f"{cell.policy} at {cell.jobs_per_hour:g} jobs/h, seed {cell.seed}{option} (cell {cell.cell_id})"


def failed(cell: SweepCellRequested, simulator: str, reason: str, wall_s: float = 0.0) -> SweepCellFinished:
    return SweepCellFinished(cell.sweep_id, cell.cell_id, simulator, wall_s=wall_s, error=reason or "failed")


def run_cell(cell: SweepCellRequested, contexts: Mapping[str, SolveContext], simulator: str) -> SweepCellFinished:
    """Simulate one cell and return its result; a cell that cannot run or fails (an unknown
    policy, a table this simulator lacks, a bad option, an error in the run) is answered with the
    reason. ``contexts``: the tables this simulator holds, by digest (table_digest). A cell of
    ``num_jobs`` 0 runs on longer and longer traces (sim/sweep_jobs.py) until one holds every job
    that arrived before the window's jobs finished (Gavel's generation on demand)."""
    started_s = time.perf_counter()
    context = contexts.get(cell.table_sha256)
    if context is None:
        return failed(
            cell, simulator,
            f"this simulator has no throughput table with digest {cell.table_sha256[:12]}... "
            "(start `gavel serve simulator` with --throughputs FILE, the sweep's table)",
        )
    try:
        from policy_service.plugins import policy_entry
        from sim.scenario import run_policy

        # A cell is anybody's message on the bus: this simulator runs the built-ins, the installed
        # plug-ins and those it was started with (serve simulator --policy), and never imports a
        # module a cell names (policy_service/plugins.py)
        policy_entry(cell.policy, context.plugins)
        for num_jobs in _trace_sizes(cell):
            scenario = cell_scenario(cell, context, num_jobs)
            _refuse_seam_modules(scenario, context.plugins)
            arrivals_s = [j.arrival_time_s for j in scenario.trace]
            try:
                result, summary = run_policy(cell.policy, scenario, context, progress=_until_ran_out(cell, arrivals_s[-1]))
            except _RanOut:
                continue  # this trace is too short to stand for Gavel's run: the next one is longer
            arrived = sweep_jobs.jobs_arrived(arrivals_s, result.makespan_s)
            if cell.num_jobs != sweep_jobs.ON_DEMAND or sweep_jobs.covers(num_jobs, arrived):
                break
        else:
            # Gavel's run would not end either: its timeout stops it, and its sweep records an
            # infinite JCT at utilisation 1.0, which the saturation search reads as saturated
            return SweepCellFinished(
                cell.sweep_id, cell.cell_id, simulator, wall_s=time.perf_counter() - started_s, jobs_arrived=num_jobs,
                saturated=True,
            )
    except Exception as e:  # noqa: BLE001 - a bad cell (its policy, option or trace refused) or a bug in
        # the run: either way the sweep must hear which cell and why, and the simulator goes on
        return failed(cell, simulator, f"{type(e).__name__}: {e}", time.perf_counter() - started_s)
    if result.policy_error:  # it ended on the allocation kept in force: its figures are not the policy's
        return failed(
            cell, simulator, f"the policy's last solve failed ({result.policy_error}): the run ended on the allocation "
            "kept in force", time.perf_counter() - started_s,
        )
    return SweepCellFinished(
        cell.sweep_id,
        cell.cell_id,
        simulator,
        avg_jct_s=-1.0 if summary.avg_jct_s is None else float(summary.avg_jct_s),
        cluster_utilization=-1.0 if summary.cluster_utilization is None else float(summary.cluster_utilization),
        jobs_completed=summary.jobs_completed,
        jobs_measured=summary.jobs_measured,
        wall_s=time.perf_counter() - started_s,
        jobs_arrived=arrived,
    )


def _trace_sizes(cell: SweepCellRequested) -> tuple[int, ...]:
    """The cell's trace size, or (on demand) the sizes to try in turn."""
    if cell.num_jobs != sweep_jobs.ON_DEMAND:
        return (cell.num_jobs,)
    if cell.window_start < 0:
        raise ValueError("a cell with num_jobs 0 (generated on demand) needs a window: it is what ends the run")
    return sweep_jobs.sizes(cell.window_end, cell.jobs_per_hour)


class _RanOut(Exception):
    """A run on demand whose clock passed its trace's last arrival (sim/sweep_jobs.py)."""


def _until_ran_out(cell: SweepCellRequested, last_arrival_s: float):
    """None for a trace of --jobs N (it runs to its end); on demand, a progress callback that
    stops the run once its clock reaches the trace's last arrival: from there on it no longer
    stands for Gavel's, whose next jobs would have arrived, and a longer trace will redo it."""
    if cell.num_jobs != sweep_jobs.ON_DEMAND:
        return None

    def progress(now_s: float, _done: int, _total: int) -> None:
        if now_s >= last_arrival_s:
            raise _RanOut

    return progress


def _refuse_seam_modules(scenario, served: tuple[str, ...]) -> None:  # noqa: ANN001 - a sim.scenario.Scenario
    """A cell's admission, placement or launch named as package.module:Name is refused unless this
    process serves it (a local sweep serves what its own flags name), for the reason a policy's
    is: a simulator never imports a module a message names. Built-ins and installed entry points
    (gavel.admission, gavel.placement, gavel.launch) run."""
    for field, value in scenario.mechanism:
        if field in ("admission", "placement", "launch") and isinstance(value, str) and ":" in value and value not in served:
            instead = f"install it as an entry point of gavel.{field} on the simulators and name it so (docs/extending.md)"
            raise PluginError(field, value, f"a simulator never imports a module a cell names: {instead}")


def cell_scenario(cell: SweepCellRequested, context: SolveContext, num_jobs: int | None = None):
    """The Scenario a cell stands for, its trace generated here (and checked as the sweep did);
    ``num_jobs``: the trace's size (None: the cell's, or on demand the first size tried)."""
    from sim.scenario import Scenario, check_trace, generated_trace

    assert context.table is not None
    if num_jobs is None:
        num_jobs = _trace_sizes(cell)[0]
    trace_options = _json_object(cell.trace_json, "trace_json")
    trace = generated_trace(num_jobs, cell.jobs_per_hour, cell.multi_gpu, cell.seed, context.table, **trace_options)
    check_trace(trace, context.table, cell.cluster, f"the trace generated with seed {cell.seed} at {cell.jobs_per_hour:g} jobs/hour")
    window = (cell.window_start, cell.window_end) if cell.window_start >= 0 else None
    scenario = Scenario(trace, dict(cell.cluster), cell.preset, cell.round_s, cell.gpus_per_server, cell.seed, window)
    options = _json_object(cell.scenario_json, "scenario_json")
    if options:
        known = {f.name for f in dataclasses.fields(scenario)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"this simulator's Scenario has no field {unknown[0]!r} (an older gavel?)")
        scenario = dataclasses.replace(scenario, **options)  # type: ignore[arg-type]
    return scenario


def _json_object(text: str, name: str) -> dict[str, object]:
    """A cell's options ("" none), JSON arrays as tuples (what frozen values hold)."""
    if not text:
        return {}
    options = json.loads(text)
    if not isinstance(options, dict):
        raise TypeError(f"{name} is not a JSON object")
    return {k: _tuples(v) for k, v in options.items()}


def _tuples(value: object) -> object:
    """JSON arrays back into the tuples a frozen Scenario holds."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value
