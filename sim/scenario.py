"""What ``gavel simulate``, ``gavel sweep`` and ``gavel demo`` share: turning their flags into
values (cluster, window, policies; the throughput table, the trace and the estimator's flags in
sim/run_inputs.py, re-exported here), refusing a bad one in one line (exit 2) before any
simulated second passes, and running one policy on either engine.

Engines: ``fast`` is the bus-free path (sim/fastpath.py); ``services`` runs the real mechanism,
policy service and a simulated fleet on the in-memory bus in virtual time (sim/driver.py). Both
make the same schedule (tests/sim/test_equivalence.py); the second is a few times slower.
``ideal`` is the fluid run of the policy, no rounds (sim/ideal.py, ``gavel simulate --ideal``).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import pathlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from common.errors import (
    PluginError,
    UnknownPolicyError,
)
from common.throughputs import ThroughputTable
from mechanism_service.core.settings import preset
from policy_service.answer import SolveContext, solver_unavailable_for
from policy_service.core.catalog import policy_names
from policy_service.plugins import is_builtin, load_policy
from sim.checkpoint import CheckpointSpec
from sim.checkpoint import hooks as checkpoint_hooks
from sim.fastpath import Progress, RunConfig, simulate
from sim.faults import FaultSpec
from sim.learning import EstimationConfig
from sim.metrics import Summary, isolated_throughputs_from_table, summarize
from sim.results import SimulationResult
from sim.run_inputs import (  # noqa: F401 - re-exported: simulate, sweep, demo and the tests import them from here
    REFERENCE_ACCELERATOR_TYPE,
    bad_input,
    check_prices,
    check_trace,
    format_cluster,
    generated_trace,
    load_context,
    load_trace,
    parse_estimation,
    trace_context,
)
from sim.traces import TraceJob

GAVEL_CLUSTER_ORDER = ("v100", "p100", "k80")  # Gavel's "36:36:36" is v100:p100:k80
UNCONSOLIDATED = "_unconsolidated"  # Gavel's table's pseudo-types (a gang spread over servers)


# --- flags into values -----------------------------------------------------------------------


def parse_cluster(text: str, table: ThroughputTable, gpus_per_server: int = 1) -> dict[str, int]:
    """``v100=36,p100=36,k80=36`` or Gavel's ``36:36:36`` (v100:p100:k80) -> accelerator type ->
    GPUs. Types with 0 GPUs are left out; every type must be in the throughput table and fill
    whole servers."""
    flag = f"--cluster {text}"
    cluster: dict[str, int] = {}
    if "=" not in text and ":" in text:
        counts = text.split(":")
        if len(counts) != len(GAVEL_CLUSTER_ORDER):
            raise bad_input(flag, f"Gavel's form is {':'.join(GAVEL_CLUSTER_ORDER)}, three GPU counts")
        pairs = list(zip(GAVEL_CLUSTER_ORDER, counts, strict=True))
    else:
        pairs = []
        for part in text.split(","):
            name, sep, count = part.partition("=")
            if not sep or not name.strip():
                raise bad_input(flag, f"{part!r} is not TYPE=GPUS (e.g. v100=36,p100=36,k80=36, or 36:36:36)")
            pairs.append((name.strip(), count))
    for name, count in pairs:
        gpus = _whole_number(count)
        if gpus is None:
            raise bad_input(flag, f"{name}: {count.strip()!r} is not a whole number of GPUs >= 0")
        if name in cluster:
            raise bad_input(flag, f"{name} is given twice")
        known = ", ".join(w for w in table.accelerator_types if not w.endswith(UNCONSOLIDATED))
        if name.endswith(UNCONSOLIDATED):
            # Gavel's table has these columns, `gavel job-types --unconsolidated` shows them; no
            # server has such GPUs (Gavel's simulator never registered them either).
            raise bad_input(flag, f"{name!r} is the table's steps/s of a gang spread over servers, not an accelerator type (known: {known})")
        if name not in table.accelerator_types:
            raise bad_input(flag, f"{name!r} is not in the throughput table (known: {known})")
        if gpus % gpus_per_server:
            raise bad_input(flag, f"{name}: {gpus} GPUs do not fill servers of --gpus-per-server {gpus_per_server}")
        cluster[name] = gpus
    cluster = {name: gpus for name, gpus in cluster.items() if gpus > 0}
    if not cluster:
        raise bad_input(flag, "the cluster has no GPU")
    return cluster


def parse_window(text: str | None, num_jobs: int) -> tuple[int, int] | None:
    """``START:END``: the measured jobs are those at trace positions START..END-1 (Gavel's job
    ids; its steady-state experiments measure e.g. 4000:5000 of a longer trace)."""
    if text is None:
        return None
    start_text, sep, end_text = text.partition(":")
    start, end = _whole_number(start_text), _whole_number(end_text)
    if not sep or start is None or end is None:
        raise bad_input(f"--window {text}", "expected START:END, two whole numbers (trace positions, END excluded)")
    if not start < end <= num_jobs:
        raise bad_input(
            f"--window {text}",
            f"out of range: the trace has {num_jobs} jobs (positions 0 to {num_jobs - 1}); "
            "need START < END <= the number of jobs",
        )
    return start, end


def parse_policies(single: str | None, several: str | None) -> tuple[str, ...] | None:
    """``--policy NAME`` or ``--policies a,b,c`` (not both), each a registered name; None when
    neither is given (the caller says what is missing once it has checked what was given)."""
    if single is not None and several is not None:
        raise bad_input("--policy", "one policy, or --policies A,B,... to compare several: not both")
    if single is None and several is None:
        return None
    flag = "--policy" if single is not None else "--policies"
    if single is not None and "," in single and all(n.strip() in policy_names() for n in single.split(",")):
        raise bad_input(flag, f"one policy only; for several side by side: --policies {single}")
    names = [single] if single is not None else [n.strip() for n in several.split(",")]  # type: ignore[union-attr]
    return check_policies(flag, names)


def check_policies(flag: str, names: Sequence[str]) -> tuple[str, ...]:
    """Each name a built-in, an installed plug-in or a package.module:Name, loaded here: a plug-in
    that does not load is refused before the run, in one line naming it (docs/extending.md)."""
    known = policy_names()
    for name in names:
        if not name:
            raise bad_input(flag, "an empty policy name (known: " + ", ".join(sorted(known)) + ")")
        if name not in known:
            _check_plugin(flag, name)
    repeated = [n for n, k in collections.Counter(names).items() if k > 1]
    if repeated:
        raise bad_input(flag, f"{repeated[0]} is listed twice")
    return tuple(names)


def _check_plugin(flag: str, name: str) -> None:
    try:
        load_policy(name)
    except UnknownPolicyError as e:  # known: the built-ins and the installed plug-ins
        raise bad_input(flag, f"unknown policy {name!r} (known: {', '.join(e.known)}; or package.module:Name)") from None
    except PluginError as e:
        raise bad_input(flag, str(e)) from None


def serving(context: SolveContext, policies: Iterable[str]) -> SolveContext:
    """``context`` serving the plug-ins among ``policies`` besides its own: the policies the user
    named for this run (policy_service/plugins.py; a process a spec travels to resolves it)."""
    plugins = tuple(dict.fromkeys([*context.plugins, *(p for p in policies if not is_builtin(p))]))
    return context if plugins == context.plugins else dataclasses.replace(context, plugins=plugins)


def check_solvers(policies: Sequence[str], preset: str) -> None:
    """Refuse at once a preset whose solver is not installed (preset gavel solves with ECOS, an
    optional package): each solve would fail, and the run would end saying its jobs can never be
    scheduled, after the time it took to get there."""
    for policy in policies:
        unavailable = solver_unavailable_for(policy, preset)
        if unavailable is not None:
            raise bad_input(f"--preset {preset}", f"{policy} cannot solve under it here: {unavailable}")


def parse_numbers(flag: str, text: str, convert: Callable[[str], float | int], what: str) -> tuple:
    """A comma-separated list (``0.2,0.4`` or ``0,1,2``), each converted and checked by convert
    (which raises ValueError with a reason)."""
    values = []
    for part in text.split(","):
        try:
            values.append(convert(part.strip()))
        except ValueError:
            raise bad_input(flag, f"{part.strip()!r} is not {what}") from None
    if len(set(values)) != len(values):
        raise bad_input(flag, "a value is listed twice")
    return tuple(values)


def positive_rate(text: str) -> float:
    value = float(text)
    if not 0 < value < math.inf:
        raise ValueError(text)
    return value


def seed_number(text: str) -> int:
    value = _whole_number(text)
    if value is None:
        raise ValueError(text)
    return value


def check_mechanism_flags(round_s: float, gpus_per_server: int) -> None:
    if not 0 < round_s < math.inf:
        raise bad_input("--round-s", f"expected a number of seconds > 0, got {round_s:g}")
    if gpus_per_server < 1:
        raise bad_input("--gpus-per-server", f"expected a whole number >= 1, got {gpus_per_server}")


def _whole_number(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


# --- running ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scenario:
    """Everything a run needs except the policy."""

    trace: tuple[TraceJob, ...]
    cluster: Mapping[str, int]
    preset: str = "default"
    round_s: float = 360.0
    gpus_per_server: int = 1
    seed: int = 0
    window: tuple[int, int] | None = None
    engine: str = "fast"
    estimation: EstimationConfig = EstimationConfig()
    faults: FaultSpec | None = None  # the services engine only (gavel simulate --faults)
    fault_seed: int = 0
    fault_journal_dir: pathlib.Path | None = None  # where a run with mechanism crashes keeps its journal
    mechanism: tuple[tuple[str, object], ...] = ()  # MechanismSettings fields set apart from the preset
    boundary_lag_s: float = 0.0  # the fast engine only: RunConfig.boundary_lag_s (gavel whatif)
    fleet_changes: tuple[tuple[float, tuple[tuple[str, int], ...]], ...] = ()  # likewise RunConfig's
    checkpoint: CheckpointSpec | None = None  # the fast engine only (gavel simulate --checkpoint-to, --resume)
    skip_quiet_rounds: bool = True  # the fast engine only: RunConfig's (gavel simulate --no-skip-quiet-rounds)

    def config(self, policy: str) -> RunConfig:
        settings = preset(self.preset, policy, round_s=self.round_s, gpus_per_server=self.gpus_per_server)
        if self.mechanism:
            settings = dataclasses.replace(settings, **dict(self.mechanism))
        return RunConfig(
            policy, dict(self.cluster), settings, seed=self.seed, window=self.window, estimation=self.estimation,
            boundary_lag_s=self.boundary_lag_s, fleet_changes=self.fleet_changes, skip_quiet_rounds=self.skip_quiet_rounds,
        )


def _fault_journal(scenario: Scenario, policy: str):  # noqa: ANN202 - a common.journal.Journal, or None
    """A run with mechanism crashes keeps its journal in the output directory (a fresh one: a file
    left by an earlier run there would be recovered from), else in a temporary directory."""
    if scenario.faults is None or not scenario.faults.mechanism_crash or scenario.fault_journal_dir is None:
        return None
    from common.journal import Journal

    path = scenario.fault_journal_dir / f"mechanism-{policy}.sqlite"
    for stale in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        stale.unlink(missing_ok=True)
    return Journal(path)


def run_policy(
    policy: str, scenario: Scenario, context: SolveContext, progress: Progress | None = None
) -> tuple[SimulationResult, Summary]:
    """Simulate one policy on the scenario's engine and summarise the run. A plug-in ``policy``
    is served by this run's policy (policy_service/plugins.py): the spec travels (a sweep's worker
    process gets the name) and is resolved where it runs."""
    context = serving(context, [policy])
    config = scenario.config(policy)
    if scenario.engine == "services":
        import asyncio  # the services engine's runtime: the fast path (the default) never loads it

        from sim.driver import simulate_services

        result = asyncio.run(
            simulate_services(
                scenario.trace, config, context, progress=progress, faults=scenario.faults, fault_seed=scenario.fault_seed,
                journal=_fault_journal(scenario, policy),
            )
        )
    elif scenario.engine == "ideal":  # the fluid run (gavel simulate --ideal)
        from sim.ideal import simulate_ideal

        result = simulate_ideal(scenario.trace, config, context, progress=progress)
    else:
        checkpointing = checkpoint_hooks(scenario.checkpoint, scenario.trace, config, context.table)
        result = simulate(scenario.trace, config, context, progress=progress, **checkpointing)  # type: ignore[arg-type]
    assert context.table is not None
    summary = summarize(result, context.prices_per_hour or {}, isolated_throughputs_from_table(result, context.table))
    return result, summary
