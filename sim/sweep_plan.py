"""Which cells a sweep runs: its rates (a list, Gavel's evenly spaced interval, or Gavel's
automatic search for the rate where the cluster saturates), limited by cutoffs. Pure: values in,
values out; the shells (services/cli/sweep_cmd.py and sweep_amqp.py) run what it asks for.

Gavel's scheduler/scripts/sweeps/run_sweep_continuous.py, read for its semantics:

- ``-a A -b B -n N``: the rates ``numpy.linspace(A, B, N)`` in jobs per hour, the first dropped
  when it is 0 (``--rate-start/--rate-stop/--rate-count``);
- ``--cutoff-throughputs-file``: a JSON object ``{cluster: {policy: rate}}``; a policy is not run
  at a rate >= its cutoff on that cluster (``--cutoffs``; the cluster in Gavel's ``36:36:36``
  form or ours, ``v100=36,p100=36,k80=36``);
- ``-u U`` (its automatic sweep, run_throughput_vs_latency_lambda_sweep.py before it was
  folded in): for each policy and seed, in order, starting from one job every 32,768 s,
  (1) halve the time between arrivals until the cluster's utilisation reaches U; (2) between the
  last two (9 evenly spaced inter-arrival times, from the unsaturated one) the first whose
  utilisation reaches U is the knee; (3) shorten it by 5% steps of the knee's until the largest
  average JCT of the search is 10x its smallest (``--until-saturated [U]``). Gavel's step (3)
  never advances its counter, and would run one rate forever; here it advances, at most 19
  steps (the 20th would be no time between arrivals at all), and step (1) gives up after 24
  halvings (the cluster never saturates: one job every 2 ms). Each cell's result decides the
  next, so each (policy, seed, option) is a chain of cells; the chains run side by side.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

START_INTERARRIVAL_S = 32768.0  # Gavel's first lambda: one job every 32,768 s
MAX_HALVINGS = 24
KNEE_POINTS = 10  # numpy.linspace(2 lam, lam, 10)[1:]: nine inter-arrival times
EXTEND_STEP = 0.05  # of the knee's inter-arrival time
MAX_EXTEND_STEPS = 19
JCT_SPREAD = 10.0  # stop extending when max / min average JCT reaches this
DEFAULT_UTILIZATION = 0.98  # Gavel's -u default


class RangeError(ValueError):
    """A range option that cannot be met: (flag, reason)."""

    def __init__(self, flag: str, reason: str) -> None:
        super().__init__(f"{flag}: {reason}")
        self.flag = flag
        self.reason = reason


def evenly_spaced_rates(start: float, stop: float, count: int) -> tuple[float, ...]:
    """Gavel's ``-a/-b/-n``: ``numpy.linspace(start, stop, count)`` jobs per hour, without a
    leading 0 (no arrivals at all)."""
    if not 0 <= start < math.inf:
        raise RangeError("--rate-start", f"expected a number of jobs per hour >= 0, got {start:g}")
    if not 0 < stop < math.inf:
        raise RangeError("--rate-stop", f"expected a number of jobs per hour > 0, got {stop:g}")
    if count < 1:
        raise RangeError("--rate-count", f"expected a whole number >= 1, got {count}")
    if count > 1 and not start < stop:
        raise RangeError("--rate-stop", f"{count} rates need --rate-stop > --rate-start ({stop:g} <= {start:g})")
    rates = [float(r) for r in np.linspace(start, stop, num=count)]
    if rates[0] == 0.0:
        rates = rates[1:]
    if not rates:
        raise RangeError("--rate-count", "the only rate is 0 jobs per hour: nothing to run")
    return tuple(rates)


def parse_cutoffs(
    text: str, cluster: Mapping[str, int], read_cluster: Callable[[str], Mapping[str, int]]
) -> dict[str, float]:
    """Gavel's cutoff file -> policy -> cutoff rate for this sweep's cluster (the entries of other
    clusters are ignored, as Gavel does). ``read_cluster`` parses a key (raising on a bad one)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise RangeError("--cutoffs", f"not JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    if not isinstance(data, dict):
        raise RangeError("--cutoffs", 'expected an object {"CLUSTER": {"POLICY": JOBS_PER_HOUR, ...}, ...}')
    cutoffs: dict[str, float] = {}
    for key, policies in data.items():
        try:
            same = dict(read_cluster(key)) == dict(cluster)
        except Exception as e:  # noqa: BLE001 - read_cluster raises the CLI's one-line error; say where
            raise RangeError("--cutoffs", f"cluster {key!r}: {e}") from None
        if not isinstance(policies, dict):
            raise RangeError("--cutoffs", f"cluster {key!r}: expected an object of policy -> jobs per hour")
        for policy, rate in policies.items():
            if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < math.inf:
                raise RangeError("--cutoffs", f"cluster {key!r}, policy {policy!r}: expected a rate > 0, got {rate!r}")
            if same:
                cutoffs[policy] = float(rate)
    return cutoffs


@dataclass(frozen=True, slots=True)
class Figures:
    """What a finished cell tells the plan: its average JCT (None: no measured job completed;
    infinite: the cell saturated the cluster, its utilisation then 1.0, as Gavel records a run its
    timeout stopped) and the cluster's utilisation (None: not defined); ``failed``: it has no
    figures."""

    avg_jct_s: float | None
    utilization: float | None
    failed: bool = False


Key = tuple[str, float, int, str]  # (policy, jobs per hour, seed, option: a variant's label, "" none)


@dataclass(frozen=True, slots=True)
class SweepPlan:
    """The cells of a sweep: every (policy, rate, seed, option) of ``rates`` (below each
    policy's cutoff), or with ``until_utilization`` each (policy, seed, option)'s search.
    ``options``: the variants' labels (("",): none, one cell per (policy, rate, seed))."""

    policies: tuple[str, ...]
    seeds: tuple[int, ...]
    rates: tuple[float, ...] = ()
    until_utilization: float | None = None
    cutoffs: Mapping[str, float] | None = None
    options: tuple[str, ...] = ("",)

    def below_cutoff(self, policy: str, rate: float) -> bool:
        cutoff = (self.cutoffs or {}).get(policy)
        return cutoff is None or rate < cutoff

    def cut(self) -> tuple[tuple[str, float], ...]:
        """The (policy, rate) a fixed list leaves out for the cutoffs."""
        return tuple((p, r) for p in self.policies for r in self.rates if not self.below_cutoff(p, r))

    def needed(self, results: Mapping[Key, Figures]) -> tuple[Key, ...]:
        """The cells whose results the sweep still needs now (none: it is complete). A fixed
        list needs all of its cells at once; a search needs the next cell of each chain."""
        if self.until_utilization is None:
            return tuple(
                (p, r, s, o) for s in self.seeds for r in self.rates for p in self.policies for o in self.options
                if self.below_cutoff(p, r) and (p, r, s, o) not in results
            )
        wanted = []
        for seed in self.seeds:
            for policy in self.policies:
                for option in self.options:
                    rate = saturation_next(
                        lambda r, p=policy, s=seed, o=option: results.get((p, r, s, o)),
                        self.until_utilization,
                        (self.cutoffs or {}).get(policy),
                    )
                    if rate is not None:
                        wanted.append((policy, rate, seed, option))
        return tuple(wanted)


def saturation_next(
    lookup: Callable[[float], Figures | None], threshold: float, cutoff: float | None = None
) -> float | None:
    """Replay Gavel's automatic sweep over the results known so far (``lookup(rate)``); the next
    rate to run, or None when the search is over (a failed cell, a rate at the cutoff, or its
    end). Replaying from the start each time keeps no state: a restarted sweep walks the same
    chain through its ledger to where it stopped."""
    visited: list[Figures] = []

    def step(interarrival_s: float) -> tuple[str, float | Figures | None]:
        rate = 3600.0 / interarrival_s
        if cutoff is not None and rate >= cutoff:
            return "over", None
        figures = lookup(rate)
        if figures is None:
            return "run", rate
        if figures.failed:
            return "over", None
        visited.append(figures)
        return "known", figures

    def saturated(f: Figures) -> bool:
        return f.utilization is not None and f.utilization >= threshold

    # (1) halve the time between arrivals until the cluster saturates
    lam = START_INTERARRIVAL_S
    for _ in range(MAX_HALVINGS + 1):
        what, value = step(lam)
        if what != "known":
            return value if what == "run" else None  # type: ignore[return-value]
        assert isinstance(value, Figures)
        if saturated(value):
            break
        lam /= 2
    else:
        return None  # never saturated
    # (2) the knee: between the last unsaturated time and the first saturated one
    knee = lam
    for candidate in np.linspace(lam * 2, lam, num=KNEE_POINTS)[1:]:
        what, value = step(float(candidate))
        if what != "known":
            return value if what == "run" else None  # type: ignore[return-value]
        assert isinstance(value, Figures)
        if saturated(value):
            knee = float(candidate)
            break
    # (3) past the knee until the average JCT spreads tenfold
    for i in range(1, MAX_EXTEND_STEPS + 1):
        what, value = step(knee * (1.0 - i * EXTEND_STEP))
        if what != "known":
            return value if what == "run" else None  # type: ignore[return-value]
        if _spread(visited) >= JCT_SPREAD:
            return None
    return None


def _spread(visited: Sequence[Figures]) -> float:
    """max / min average JCT over the search so far; a cell where no job completed counts as an
    infinite JCT (Gavel: a run that timed out)."""
    jcts = [math.inf if f.avg_jct_s is None else f.avg_jct_s for f in visited]
    low = min(jcts)
    return math.inf if low <= 0 or math.isinf(max(jcts)) else max(jcts) / low
