"""Calibration: how fast this cluster's hardware of each accelerator type runs against the table.

The reference table was measured on other machines. A cluster whose "v100" servers run slower or
faster than the table's (another GPU generation, a CPU test cluster declared as `--type v100`,
other drivers) is not made of stragglers: every worker of the type is off by about the same
factor, and that factor is what the estimator learns here, per type. (A straggler is slow against
its peers of the same type: stragglers.py.)

Each measurement alone of a job of a reference class gives its worker a log ratio measured /
table (the job's mean over its leases on that worker). A worker's **level** is the median of its
latest ratio per job; a type's **calibration** is the median of its workers' levels (flagged
stragglers left out), so one odd job or one odd worker does not move it. The table's figures on
that type, and everything derived from them (the typical job, a matched reference's ratios
between types), are multiplied by exp(shift), with the spread of the type's jobs' ratios around
it added to their variance: the table's jobs do not all slow down by the same factor (a CPU runs
the catalog's jobs at 0.1-0.25 of their table figure).

Within ``tolerance`` of the table, or within twice the shift's standard error of it, the table
stands as it is: the table's own jobs vary that much (reference_sd, job_spread_sd), and noisy
measurements of a cluster that matches the table would otherwise move every prior back and forth
(one job measured 12% off by chance says little; one measured at a quarter of the table says it
all).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection
from dataclasses import dataclass, field

RECENT_JOBS = 20  # ratios remembered per worker (its latest jobs)
WORKERS_KEPT = 10_000  # workers remembered, the most recently measured (as stragglers.py)
SPREAD_JOBS = 3  # ratios needed before their spread is measured rather than assumed
MAD_TO_SD = 1.4826  # a normal distribution's sd over its median absolute deviation


@dataclass(frozen=True, slots=True)
class TypeCalibration:
    """What the table's figures on one type are multiplied by (exp(log_shift)) and how much
    variance (of the log) that adds to each of them."""

    log_shift: float = 0.0
    variance: float = 0.0
    workers: int = 0  # behind it
    jobs: int = 0

    @property
    def factor(self) -> float:
        return math.exp(self.log_shift)

    def moved(self, other: TypeCalibration, step: float) -> bool:
        """Whether the two differ by more than ``step`` in shift or in sd (log)."""
        return (
            abs(self.log_shift - other.log_shift) > step
            or abs(math.sqrt(self.variance) - math.sqrt(other.variance)) > step
        )


AS_THE_TABLE = TypeCalibration()


@dataclass
class Calibration:
    tolerance: float = 0.1  # |log shift| within which the table stands (module docstring)
    assumed_sd: float = 0.3  # the spread of jobs' ratios while fewer than SPREAD_JOBS are known
    ratios: dict[str, dict[str, float]] = field(default_factory=dict)  # worker -> job -> log(measured / table)
    types: dict[str, str] = field(default_factory=dict)  # worker -> its accelerator type
    levels: dict[str, float] = field(default_factory=dict)  # worker -> median of its ratios

    def observe(self, worker_id: str, accelerator_type: str, job_id: str, log_ratio: float) -> None:
        """A job's (mean) log ratio measured / table on the worker."""
        if not math.isfinite(log_ratio):
            return
        recent = self.ratios.pop(worker_id, {})
        self.ratios[worker_id] = recent  # re-inserted last: the most recently measured in order
        while len(self.ratios) > WORKERS_KEPT:
            gone = next(iter(self.ratios))
            del self.ratios[gone]
            self.types.pop(gone, None)
            self.levels.pop(gone, None)
        recent.pop(job_id, None)
        recent[job_id] = log_ratio
        while len(recent) > RECENT_JOBS:
            del recent[next(iter(recent))]
        self.types[worker_id] = accelerator_type
        self.levels[worker_id] = statistics.median(recent.values())

    def of(self, accelerator_type: str, left_out: Collection[str] = ()) -> TypeCalibration | None:
        """The type's calibration from its workers but ``left_out`` (the flagged stragglers, and
        the worker being judged); None when no other worker of the type has measured a reference
        job (then nothing is known of this hardware but the table)."""
        workers = [w for w, t in self.types.items() if t == accelerator_type and w not in left_out]
        if not workers:
            return None
        shift = statistics.median(self.levels[w] for w in workers)
        if abs(shift) <= self.tolerance:  # (the common case, at every reference report: no list)
            return TypeCalibration(0.0, 0.0, len(workers), sum(len(self.ratios[w]) for w in workers))
        ratios = [r for w in workers for r in self.ratios[w].values()]
        if len(ratios) >= SPREAD_JOBS:
            spread_sd = MAD_TO_SD * statistics.median(abs(r - shift) for r in ratios)
        else:
            spread_sd = self.assumed_sd
        # a job's ratio strays from the shift by the spread; the shift itself is known to spread^2 / n
        shift_variance = spread_sd**2 / len(ratios)
        if abs(shift) <= self.tolerance + 2.0 * math.sqrt(shift_variance):
            return TypeCalibration(0.0, 0.0, len(workers), len(ratios))
        return TypeCalibration(shift, spread_sd**2 + shift_variance, len(workers), len(ratios))

    def applied(self, accelerator_type: str, flagged: Collection[str]) -> TypeCalibration:
        """What the estimator applies to the type's table figures: the calibration, or the table
        as it is when nothing was measured there."""
        return self.of(accelerator_type, flagged) or AS_THE_TABLE
