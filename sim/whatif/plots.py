"""The what-if plots: the JCT CDF of each run (the real one and each replay), and a bar chart of
the summary. matplotlib is imported by the functions that draw (a --no-plots run never loads it);
each figure on an Agg canvas of its own, as sim/plots.py does."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from sim.metrics import SECONDS_PER_HOUR, measured_jcts_s
from sim.results import SimulationResult
from sim.whatif.compare import REAL, RunFigures

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# (title, RunFigures field, scale, unit)
PANELS = (
    ("average JCT", "avg_jct_s", 1 / 3600, "h"),
    ("p99 JCT", "p99_jct_s", 1 / 3600, "h"),
    ("makespan", "makespan_s", 1 / 3600, "h"),
    ("utilisation", "utilization", 100.0, "%"),
    ("worst rho (FTF)", "rho_worst", 1.0, ""),
    ("Jain's index", "jain_index", 1.0, ""),
)


def plot_jct_cdfs(results: Mapping[str, SimulationResult], path: str | os.PathLike[str]) -> pathlib.Path:
    """The JCT CDFs of the real run and every replay on one log axis; the real run dashed in
    black, drawn last: the replay of the policy it ran often lies exactly under it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.0, 5.0), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    order = [label for label in results if label != REAL] + [label for label in results if label == REAL]
    positive = []
    for index, label in enumerate(order):
        jct_h = measured_jcts_s(results[label]) / SECONDS_PER_HOUR
        if not len(jct_h):
            continue
        positive.append(jct_h[jct_h > 0])
        fraction = np.arange(1, len(jct_h) + 1) / len(jct_h)
        style = {"color": "black", "linestyle": "--", "linewidth": 2.0} if label == REAL else {"color": f"C{index}"}
        ax.step(
            np.concatenate(([jct_h[0]], jct_h)), np.concatenate(([0.0], fraction)), where="post",
            label=f"{label} ({len(jct_h)} jobs, mean {jct_h.mean():.2f} h)", **style,
        )
    values = np.concatenate(positive) if positive else np.empty(0)
    if len(values):
        ax.set_xscale("log")
        ax.set_xlim(values.min() / 1.5, values.max() * 1.5)
    ax.set_xlabel("job completion time (h, log scale)")
    ax.set_ylabel("fraction of the compared jobs completed")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="lower right", framealpha=0.9)
    fig.suptitle("What if: job completion times, the real run and each policy on its jobs")
    return _save(fig, path)


def plot_summary_bars(runs: Sequence[RunFigures], path: str | os.PathLike[str]) -> pathlib.Path:
    """A panel per figure, a bar per run (the real run first, in grey)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12.0, 6.5), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 3)
    labels = [r.label for r in runs]
    colors = ["0.55" if label == REAL else f"C{i}" for i, label in enumerate(labels)]
    for ax, (title, field, scale, unit) in zip(axes.flat, PANELS):
        values = [getattr(r, field) for r in runs]
        heights = [0.0 if v is None else v * scale for v in values]
        bars = ax.bar(range(len(runs)), heights, color=colors)
        for bar, value in zip(bars, values):
            text = "-" if value is None else f"{value * scale:.3g}"
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize="small")
        ax.set_title(f"{title} ({unit})" if unit else title)
        ax.set_xticks(range(len(runs)), labels, rotation=20, ha="right", fontsize="small")
        ax.grid(axis="y", alpha=0.3)
        ax.margins(y=0.15)  # room for the figures above the bars
    fig.suptitle("What if: the real run and each policy on its jobs")
    return _save(fig, path)


def _save(fig: Figure, path: str | os.PathLike[str]) -> pathlib.Path:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path
