"""A sweep's result table: one row per (policy, variant, rate), its seeds' average JCTs over the
window, their mean, min and max. Pure: the finished cells in, rows out; `gavel sweep` prints
them and puts them in its --json (services/cli/sweep_report.py).

The mean, min and max are those the plot draws (sim/sweep_lines.py, ``sweep_lines``: the line
through the mean, the band from min to max): over the seeds whose run completed a measured job.
A seed whose cell saturated the cluster counts as Gavel counts it, an infinite average JCT: the
mean and max are infinite then (the plot leaves such a point out).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.sweep_ledger import CellResult


@dataclass(frozen=True, slots=True)
class SeedFigures:
    """One seed's cell at a point of the sweep."""

    seed: int
    avg_jct_s: float | None  # over the window's jobs; None: none of them completed; inf: saturated
    cluster_utilization: float | None
    jobs_arrived: int  # jobs of the trace that had arrived when the run stopped (0: not said)


@dataclass(frozen=True, slots=True)
class TableRow:
    """A point of the sweep: a policy (under a variant's options, "" none) at a rate, over the
    seeds that finished there (ascending)."""

    policy: str
    option: str
    jobs_per_hour: float
    seeds: tuple[SeedFigures, ...]

    @property
    def _jcts_s(self) -> list[float]:
        return [s.avg_jct_s for s in self.seeds if s.avg_jct_s is not None]

    @property
    def mean_jct_s(self) -> float | None:
        jcts = self._jcts_s
        return sum(jcts) / len(jcts) if jcts else None

    @property
    def min_jct_s(self) -> float | None:
        return min(self._jcts_s, default=None)

    @property
    def max_jct_s(self) -> float | None:
        return max(self._jcts_s, default=None)

    @property
    def mean_utilization(self) -> float | None:
        known = [s.cluster_utilization for s in self.seeds if s.cluster_utilization is not None]
        return sum(known) / len(known) if known else None

    @property
    def saturated_seeds(self) -> tuple[int, ...]:
        return tuple(s.seed for s in self.seeds if s.avg_jct_s == math.inf)

    def as_json(self, variants: bool) -> dict[str, object]:
        """The row in `gavel sweep --json`'s ``table`` (``option`` only when the sweep has variants).
        JSON has no infinity: a saturated seed's JCT, and a mean or max it makes infinite, is null
        there, and ``saturated_seeds`` names those seeds."""
        return {
            "policy": self.policy, **({"option": self.option} if variants else {}), "jobs_per_hour": self.jobs_per_hour,
            "mean_avg_jct_s": finite(self.mean_jct_s), "min_avg_jct_s": finite(self.min_jct_s),
            "max_avg_jct_s": finite(self.max_jct_s), "mean_cluster_utilization": self.mean_utilization,
            "saturated_seeds": list(self.saturated_seeds),
            "seeds": [
                {"seed": s.seed, "avg_jct_s": finite(s.avg_jct_s), "cluster_utilization": s.cluster_utilization,
                 "jobs_arrived": s.jobs_arrived, "saturated": s.avg_jct_s == math.inf}
                for s in self.seeds
            ],
        }


def finite(value: float | None) -> float | None:
    """A figure as JSON can carry it: None for an infinite one (a saturated cell's JCT)."""
    return None if value is None or math.isinf(value) else value


def sweep_table(results: Iterable[CellResult], policies: Sequence[str], options: Sequence[str] = ("",)) -> tuple[TableRow, ...]:
    """The finished cells as rows: policies in the order given, then variants in theirs, then
    rates ascending (a policy or variant not given goes last, by name)."""
    points: dict[tuple[str, str, float], list[SeedFigures]] = {}
    for r in results:
        figures = r.figures
        seed = SeedFigures(r.cell.seed, figures.avg_jct_s, figures.utilization, r.result.jobs_arrived)
        points.setdefault((r.cell.policy, r.cell.option, r.cell.jobs_per_hour), []).append(seed)
    policy_order = {p: i for i, p in enumerate(policies)}
    option_order = {o: i for i, o in enumerate(options)}

    def order(key: tuple[str, str, float]) -> tuple[int, str, int, str, float]:
        policy, option, rate = key
        return policy_order.get(policy, len(policy_order)), policy, option_order.get(option, len(option_order)), option, rate

    return tuple(
        TableRow(policy, option, rate, tuple(sorted(points[(policy, option, rate)], key=lambda s: s.seed)))
        for policy, option, rate in sorted(points, key=order)
    )


def ran_out(results: Iterable[CellResult], num_jobs: int) -> int:
    """How many cells of a trace of ``num_jobs`` jobs (given with --jobs) saw its last job arrive
    before the window's jobs finished: Gavel, which draws jobs until then, would have had more
    arrivals competing with them, and another average JCT."""
    return sum(1 for r in results if r.result.jobs_arrived >= num_jobs)
