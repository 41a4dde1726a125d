"""Series over simulated time that the plots draw: the cluster's utilisation per type and the
queue, piecewise constant over rounds and the gaps between them, averaged over uniform windows
past MAX_BINS. Pure: a SimulationResult in, arrays out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from sim.results import SimulationResult


@dataclass(frozen=True, slots=True, eq=False)
class TimeSeries:
    """Piecewise-constant series over simulated time.

    ``edges_s``: shape (k + 1,), ascending, from 0 to the end of the run. ``values``: series name
    -> shape (k,); value i holds on [edges_s[i], edges_s[i+1]) and is the time-weighted mean of
    the per-round values over that interval (NaN where a series is undefined there).
    ``window_s``: None when each interval is one round or one gap between rounds (exact), else
    the width of the uniform averaging windows (smoothed).
    """

    edges_s: np.ndarray
    values: Mapping[str, np.ndarray]
    window_s: float | None


MAX_BINS = 200  # above this many rounds and gaps, series are averaged over uniform windows


def utilization_over_time(
    result: SimulationResult, max_bins: int = MAX_BINS, window_s: float | None = None
) -> TimeSeries:
    """Leased GPUs / GPUs per accelerator type over time, plus ``"all"`` for the whole cluster.

    Per round r and type w the value is ``r.busy_gpus_by_type[w] / N_w``; between recorded rounds
    nothing was placed, so the value is 0 there. Types with no GPU are left out. Exact (one
    interval per round or gap) up to ``max_bins`` intervals, else averaged over ``max_bins``
    uniform windows; with ``window_s``, averaged over windows of that width from 0 (the last one
    cut at the end of the run), e.g. to put several runs on one grid.
    """
    types = [w for w, n in result.cluster.items() if n > 0]
    total = sum(result.cluster[w] for w in types)
    per_round = {w: [r.busy_gpus_by_type.get(w, 0) / result.cluster[w] for r in result.rounds] for w in types}
    per_round["all"] = [
        sum(r.busy_gpus_by_type.get(w, 0) for w in types) / total if total else 0.0 for r in result.rounds
    ]
    return _series(result, per_round, max_bins, window_s, gaps_are_zero=True)


def queue_over_time(result: SimulationResult, max_bins: int = MAX_BINS, window_s: float | None = None) -> TimeSeries:
    """Jobs ``"waiting"`` (admitted, not running) and ``"running"`` per round over time; NaN
    between recorded rounds (the simulator records only rounds that placed something), and a
    window's value is the mean over its recorded time. Bins as in ``utilization_over_time``."""
    per_round = {
        "waiting": [float(r.jobs_waiting) for r in result.rounds],
        "running": [float(r.jobs_running) for r in result.rounds],
    }
    return _series(result, per_round, max_bins, window_s, gaps_are_zero=False)


def _series(
    result: SimulationResult,
    per_round: Mapping[str, Sequence[float]],
    max_bins: int,
    window_s: float | None,
    gaps_are_zero: bool,
) -> TimeSeries:
    order = np.argsort([r.start_s for r in result.rounds], kind="stable")
    start_s = np.array([r.start_s for r in result.rounds], dtype=float)[order]
    end_s = np.array([r.end_s for r in result.rounds], dtype=float)[order]
    # Defensive: rounds are disjoint by construction; clip a float overlap so the integral below
    # stays monotone in time.
    end_s = np.minimum(end_s, np.concatenate((start_s[1:], [np.inf])))
    end_of_run_s = max(float(result.makespan_s), float(end_s.max()) if len(end_s) else 0.0)

    if window_s is None:
        edges_s = np.unique(np.concatenate(([0.0, end_of_run_s], start_s, end_s)))
        if len(edges_s) - 1 > max_bins:
            window_s = end_of_run_s / max_bins
    if window_s is not None:
        inner_s = np.arange(0.0, end_of_run_s, window_s)
        # No sliver of a window at the end from rounding (end / (end / k) can exceed k).
        edges_s = np.append(inner_s[inner_s < end_of_run_s - 1e-9 * window_s], end_of_run_s)
    if len(edges_s) < 2:  # an empty run of zero length: one empty interval
        edges_s = np.array([0.0, 0.0])

    covered = _integral_at(edges_s, start_s, end_s, np.ones_like(start_s))
    width = np.diff(covered) if not gaps_are_zero else np.diff(edges_s)
    values = {}
    for name, series in per_round.items():
        area = np.diff(_integral_at(edges_s, start_s, end_s, np.asarray(series, dtype=float)[order]))
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(width > 0, area / np.where(width > 0, width, 1.0), np.nan if not gaps_are_zero else 0.0)
        values[name] = mean
    return TimeSeries(edges_s=edges_s, values=MappingProxyType(values), window_s=window_s)


def _integral_at(t_s: np.ndarray, start_s: np.ndarray, end_s: np.ndarray, value: np.ndarray) -> np.ndarray:
    """The integral from 0 to each t of the function equal to value[i] on [start_s[i], end_s[i])
    and 0 elsewhere (disjoint, ascending intervals): piecewise linear through the interval ends,
    so one np.interp evaluates it anywhere."""
    if not len(start_s):
        return np.zeros_like(t_s, dtype=float)
    area_end = np.cumsum(value * (end_s - start_s))
    area_start = area_end - value * (end_s - start_s)
    knots_s = np.column_stack((start_s, end_s)).ravel()
    area = np.column_stack((area_start, area_end)).ravel()
    return np.interp(t_s, knots_s, area, left=0.0, right=float(area_end[-1]))
