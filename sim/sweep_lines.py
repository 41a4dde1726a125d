"""A sweep's runs as the plot reads them: one row per cell (policy, rate, seed, average JCT) and
one line per policy (and variant) of mean, min and max over the seeds at each rate. Pure."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from sim.metrics import SECONDS_PER_HOUR


@dataclass(frozen=True, slots=True)
class SweepRow:
    """One run of a sweep: its policy, input rate, seed and average JCT (None: none completed);
    ``option``: its variant's label ("" none: gavel sweep --variant)."""

    policy: str
    jobs_per_hour: float
    seed: int
    avg_jct_s: float | None
    option: str = ""


@dataclass(frozen=True, slots=True, eq=False)
class SweepLine:
    """One policy's (under one variant's options) average JCT against input rate. Arrays of
    shape (rates,), rates ascending; over the seeds with a value at each rate: mean, min and max
    of the average JCT in hours, and how many seeds there were. A rate where no seed completed a
    job is left out."""

    policy: str
    jobs_per_hour: np.ndarray
    mean_jct_h: np.ndarray
    min_jct_h: np.ndarray
    max_jct_h: np.ndarray
    seeds: np.ndarray
    option: str = ""

    @property
    def label(self) -> str:
        """``policy``, or ``policy [variant]``."""
        return f"{self.policy} [{self.option}]" if self.option else self.policy


def sweep_lines(rows: Iterable[SweepRow]) -> tuple[SweepLine, ...]:
    """Group sweep rows by (policy, option) (in order of first appearance) and rate."""
    by_line: dict[tuple[str, str], dict[float, list[float]]] = {}
    for row in rows:
        rates = by_line.setdefault((row.policy, row.option), {})
        if row.avg_jct_s is not None and math.isfinite(row.avg_jct_s):  # a saturated cell: no point to draw
            rates.setdefault(float(row.jobs_per_hour), []).append(row.avg_jct_s / SECONDS_PER_HOUR)
    lines = []
    for (policy, option), rates in by_line.items():
        ordered = sorted(rates.items())
        lines.append(
            SweepLine(
                policy=policy,
                option=option,
                jobs_per_hour=np.array([rate for rate, _ in ordered], dtype=float),
                mean_jct_h=np.array([np.mean(v) for _, v in ordered], dtype=float),
                min_jct_h=np.array([np.min(v) for _, v in ordered], dtype=float),
                max_jct_h=np.array([np.max(v) for _, v in ordered], dtype=float),
                seeds=np.array([len(v) for _, v in ordered], dtype=int),
            )
        )
    return tuple(lines)
