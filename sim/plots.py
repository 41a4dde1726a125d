"""PNG plots of one run, of several policies side by side, and of a sweep (issue 4, item 5).

Each ``*_figure`` function draws one figure from values (sim/series.py computes the series);
its ``plot_*`` twin writes it to ``path``. Figures are built with ``matplotlib.figure.Figure`` on
an Agg canvas of their own, never through pyplot, so nothing here selects a backend or keeps
figures alive for the rest of the program, and plotting works without a display.

A one-axes figure has fixed margins (MARGINS_IN, and the legend's own width when it sits outside
the axes) rather than constrained layout, which measured every tick label several times per draw:
more than half of what a run's three plots cost (issue 12: 2.06 s -> 0.87 s for the calibration
run's three, on a loaded machine). Only the multi-panel utilisation overlay keeps it.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterable, Mapping

import numpy as np

# Every figure is drawn on an Agg canvas of its own, whatever backend the user chose for
# interactive work: an MPLBACKEND that matplotlib does not know fails its import, so it is not
# shown to the import (and is put back at once).
_BACKEND = os.environ.pop("MPLBACKEND", None)
try:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import to_rgba
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, PercentFormatter
finally:
    if _BACKEND is not None:
        os.environ["MPLBACKEND"] = _BACKEND

from sim.metrics import SECONDS_PER_HOUR, measured_jcts_s
from sim.series import TimeSeries, queue_over_time, utilization_over_time
from sim.sweep_lines import SweepRow, sweep_lines
from sim.results import SimulationResult

FIGSIZE_IN = (9.0, 5.0)
DPI = 120
# Room around a one-axes figure's axes: tick labels and axis labels on the left and at the bottom,
# the two-line title at the top, a little on the right (plus the legend's width when it is there).
MARGINS_IN = {"left": 0.8, "right": 0.25, "bottom": 0.6, "top": 0.75}
ALL_TYPES = "all"  # the whole cluster's series in utilization_over_time
_PLAIN_NUMBERS = FuncFormatter(lambda value, _: f"{value:g}")  # 0.1, 1, 10 rather than 10^-1


def plot_jct_cdf(result: SimulationResult, path: str | os.PathLike[str]) -> pathlib.Path:
    """jct_cdf_figure(result), written to path."""
    return _save(jct_cdf_figure(result), path)


def jct_cdf_figure(result: SimulationResult) -> Figure:
    """The CDF of the measured completed jobs' JCT, hours on a log x axis."""
    fig, ax = _figure()
    jct_h = measured_jcts_s(result) / SECONDS_PER_HOUR
    _draw_cdf(ax, jct_h, label=None)
    _title(fig, f"Job completion times: {result.policy}", _run_label(result))
    _cdf_axes(ax, [jct_h])
    return fig


def plot_utilization(result: SimulationResult, path: str | os.PathLike[str]) -> pathlib.Path:
    """utilization_figure(result), written to path."""
    return _save(utilization_figure(result), path)


def utilization_figure(result: SimulationResult) -> Figure:
    """Leased GPUs / GPUs per accelerator type over time, and the whole cluster's (dashed)."""
    fig, ax = _figure()
    series = utilization_over_time(result)
    colors = _type_colors(result.cluster)
    for w, color in colors.items():
        _draw_steps(ax, series, w, color=color, label=f"{w} ({result.cluster[w]} GPUs)")
    _draw_steps(
        ax, series, ALL_TYPES, color="black", linestyle="--", linewidth=1.2,
        label=f"whole cluster ({sum(result.cluster.values())} GPUs)",
    )
    _title(fig, f"GPU utilisation: {result.policy}", _run_label(result), _smoothing_note(series))
    _utilization_axes(ax, series)
    _legend_outside(ax)
    return fig


def plot_queue(result: SimulationResult, path: str | os.PathLike[str]) -> pathlib.Path:
    """queue_figure(result), written to path."""
    return _save(queue_figure(result), path)


def queue_figure(result: SimulationResult) -> Figure:
    """Jobs waiting and jobs running per round over time (gaps: no round was recorded)."""
    fig, ax = _figure()
    series = queue_over_time(result)
    _draw_steps(ax, series, "running", color="tab:green", label="running")
    _draw_steps(ax, series, "waiting", color="tab:red", label="waiting (admitted, not running)")
    _title(fig, f"Jobs in the system: {result.policy}", _run_label(result), _smoothing_note(series))
    ax.set_xlabel("simulated time (h)")
    ax.set_ylabel("jobs")
    ax.set_xlim(0, series.edges_s[-1] / SECONDS_PER_HOUR or 1)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    _legend_outside(ax)
    return fig


def plot_estimation_error(result: SimulationResult, path: str | os.PathLike[str]) -> pathlib.Path:
    """estimation_error_figure(result), written to path."""
    return _save(estimation_error_figure(result), path)


def estimation_error_figure(result: SimulationResult) -> Figure:
    """The mean absolute percentage error of the estimates each solve used, over time: alone and
    packed (a learned estimator; sim/estimation.py)."""
    fig, ax = _figure()
    samples = result.estimation
    time_h = np.array([s.time_s for s in samples]) / SECONDS_PER_HOUR
    for name, label in (("isolated", "alone"), ("colocated", "packed")):
        values = np.array([np.nan if getattr(s, f"{name}_mape") is None else getattr(s, f"{name}_mape") for s in samples])
        if np.isfinite(values).any():
            ax.plot(time_h, values, label=f"{label} (mean {np.nanmean(values):.1%})", drawstyle="steps-post")
    unknown = f"{len(result.unknown_types)} job types unknown" if result.unknown_types else "every job type known"
    _title(fig, f"Error of the estimates the policy used: {result.policy}", f"{result.estimator} estimator, {unknown}", _run_label(result))
    ax.set_xlabel("simulated time (h)")
    ax.set_ylabel("mean absolute percentage error")
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if len(samples):
        ax.legend(loc="upper right", fontsize="small")
    else:
        _no_data(ax, "no estimates: the policy read the true table (oracle)")
    return fig


def plot_jct_cdf_overlay(results: Mapping[str, SimulationResult], path: str | os.PathLike[str]) -> pathlib.Path:
    """jct_cdf_overlay_figure(results), written to path."""
    return _save(jct_cdf_overlay_figure(results), path)


def jct_cdf_overlay_figure(results: Mapping[str, SimulationResult]) -> Figure:
    """The JCT CDFs of several runs (keyed by label, usually the policy) on one log axis."""
    fig, ax = _figure()
    all_jct_h = []
    for label, result in results.items():
        jct_h = measured_jcts_s(result) / SECONDS_PER_HOUR
        all_jct_h.append(jct_h)
        mean = f", mean {jct_h.mean():.2f} h" if len(jct_h) else ""
        _draw_cdf(ax, jct_h, label=f"{label} ({len(jct_h)} jobs{mean})")
    _title(fig, "Job completion times by policy", _shared_label(results))
    _cdf_axes(ax, all_jct_h)
    ax.legend(loc="lower right", framealpha=0.9)
    return fig


LEGEND_LINE_IN = 0.22  # height of one legend entry in small type
OVERLAY_WINDOWS = 150  # the overlays average every run over the same windows, this many on the longest run


def plot_utilization_overlay(results: Mapping[str, SimulationResult], path: str | os.PathLike[str]) -> pathlib.Path:
    """utilization_overlay_figure(results), written to path."""
    return _save(utilization_overlay_figure(results), path)


def utilization_overlay_figure(results: Mapping[str, SimulationResult]) -> Figure:
    """Utilisation over time of several runs: one panel for the whole cluster and one per
    accelerator type, one line per run (keyed by label), all averaged over the same windows
    (1/OVERLAY_WINDOWS of the longest run) so the lines can be compared."""
    panels = [ALL_TYPES]
    for result in results.values():
        panels += [w for w, n in result.cluster.items() if n > 0 and w not in panels]
    # Room for the panels, the title, and the legend below them (one line per run).
    height_in = 2.0 * len(panels) + 1.0 + LEGEND_LINE_IN * len(results)
    fig = Figure(figsize=(FIGSIZE_IN[0], height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    end_s = max((r.makespan_s for r in results.values()), default=0.0)
    window_s = end_s / OVERLAY_WINDOWS if end_s > 0 else None
    series = None
    for i, (label, result) in enumerate(results.items()):
        series = utilization_over_time(result, window_s=window_s)
        cluster_mean = _time_mean(series, ALL_TYPES)
        for ax, panel in zip(axes, panels):
            if panel in series.values:
                name = f"{label} (mean {cluster_mean:.0%} leased)" if panel == ALL_TYPES else label
                _draw_steps(ax, series, panel, color=f"C{i % 10}", label=name, linewidth=1.2)
    for ax, panel in zip(axes, panels):
        ax.set_ylim(0, 1.05)
        ax.set_xlim(0, end_s / SECONDS_PER_HOUR or 1)
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1))
        ax.set_ylabel("GPUs leased")
        ax.set_title("whole cluster" if panel == ALL_TYPES else panel, fontsize="medium", loc="left")
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("simulated time (h)")
    # Below the panels, not beside one: the panels share a column, so a legend to the right of
    # the first one took its width from all of them and left a third of each blank. Not above
    # them either: constrained layout puts an "outside upper" legend over the figure's title.
    if axes[0].get_lines():
        fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", fontsize="small")
    note = _smoothing_note(series) if series is not None else ""
    _title(fig, "GPU utilisation by policy", _shared_label(results), note)
    return fig


# (line style, marker) of the sweep's lines, ten policies each (one per colour)
SWEEP_STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"))
# Up to this many lines, each has its band (min to max over seeds); past it the bands cover one
# another and the lines under them (a comparison of a dozen policies was a grey mass): lines only,
# the spread stays in sweep.csv.
SWEEP_BANDS_UP_TO = 6


def plot_sweep(
    rows: Iterable[SweepRow], path: str | os.PathLike[str], title: str | None = None, setting: str = ""
) -> pathlib.Path:
    """sweep_figure(rows, title, setting), written to path."""
    return _save(sweep_figure(rows, title, setting), path)


SWEEP_TICKS_UP_TO = 12  # rates marked on the x axis, each at its own tick, up to this many


def sweep_figure(rows: Iterable[SweepRow], title: str | None = None, setting: str = "") -> Figure:
    """Average JCT (h) against input rate (jobs/h), one line per policy (per policy and variant:
    "policy [variant]") through the mean over seeds, with a band from the lowest to the highest
    seed's value (Gavel's Figure 8 shape) while there are few enough lines (SWEEP_BANDS_UP_TO).
    ``setting``: what every cell shared (cluster, measured jobs, preset, seeds), under the title."""
    fig, ax = _figure()
    lines = sweep_lines(rows)
    bands = len(lines) <= SWEEP_BANDS_UP_TO
    for i, line in enumerate(lines):
        color = f"C{i % 10}"
        # past ten policies the colours come round again: the line and marker tell them apart
        style, marker = SWEEP_STYLES[i // 10 % len(SWEEP_STYLES)]
        seeds = int(line.seeds.max()) if len(line.seeds) else 0
        ax.plot(
            line.jobs_per_hour, line.mean_jct_h, marker=marker, linestyle=style, color=color,
            label=f"{line.label} (mean of {seeds} seeds)" if seeds > 1 else line.label,
        )
        if seeds > 1 and bands:
            # a faint face and a firmer edge: where two policies' bands overlap, each edge still shows
            ax.fill_between(
                line.jobs_per_hour, line.min_jct_h, line.max_jct_h, facecolor=to_rgba(color, 0.15),
                edgecolor=to_rgba(color, 0.6), linewidth=0.8,
            )
    if title:
        _title(fig, title, setting)
    else:
        spread = "band: min to max over seeds" if bands else f"no bands past {SWEEP_BANDS_UP_TO} lines: sweep.csv has each seed"
        _title(fig, "Average JCT against input rate", "; ".join(part for part in (setting, spread) if part))
    rates = np.unique(np.concatenate([line.jobs_per_hour for line in lines])) if lines else np.empty(0)
    if 0 < len(rates) <= SWEEP_TICKS_UP_TO:
        # Gavel's -a/-b/-n rates (0.25, 0.5, ...) where the points are, not matplotlib's round steps between them
        ax.set_xticks(rates)
        ax.xaxis.set_major_formatter(_PLAIN_NUMBERS)
    ax.set_xlabel("input job rate (jobs/h)")
    ax.set_ylabel("average JCT (h)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if lines:
        _legend_outside(ax)  # inside, it hid whichever line or band ran through its corner
    else:
        _no_data(ax, "no sweep runs")
    return fig


# --- drawing helpers ---------------------------------------------------------------------------


def _figure():
    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI)
    FigureCanvasAgg(fig)  # this figure's own canvas: no pyplot, no global backend
    ax = fig.add_subplot()
    _margins(fig, right_in=MARGINS_IN["right"])
    return fig, ax


def _margins(fig: Figure, right_in: float) -> None:
    width_in, height_in = fig.get_size_inches()
    fig.subplots_adjust(
        left=MARGINS_IN["left"] / width_in,
        right=1.0 - right_in / width_in,
        bottom=MARGINS_IN["bottom"] / height_in,
        top=1.0 - MARGINS_IN["top"] / height_in,
    )


def _save(fig: Figure, path: str | os.PathLike[str]) -> pathlib.Path:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def _draw_cdf(ax, jct_h: np.ndarray, label: str | None) -> None:
    if not len(jct_h):
        return
    fraction = np.arange(1, len(jct_h) + 1) / len(jct_h)
    # Start at 0 on the left of the shortest JCT so the first step is visible.
    ax.step(np.concatenate(([jct_h[0]], jct_h)), np.concatenate(([0.0], fraction)), where="post", label=label)


def _cdf_axes(ax, all_jct_h: list[np.ndarray]) -> None:
    values = np.concatenate(all_jct_h) if all_jct_h else np.empty(0)
    positive = values[values > 0]
    ax.set_xlabel("job completion time (h, log scale)")
    ax.set_ylabel("fraction of measured jobs completed")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3, which="both")
    if len(positive):
        ax.set_xscale("log")
        ax.set_xlim(positive.min() / 1.5, positive.max() * 1.5)
        ax.xaxis.set_major_formatter(_PLAIN_NUMBERS)
    else:
        _no_data(ax, "no measured job completed")


def _draw_steps(ax, series: TimeSeries, name: str, **style) -> None:
    """A piecewise-constant series as steps; NaN values leave gaps."""
    x_h = np.repeat(series.edges_s / SECONDS_PER_HOUR, 2)[1:-1]
    y = np.repeat(series.values[name], 2)
    ax.plot(x_h, y, **style)


def _time_mean(series: TimeSeries, name: str) -> float:
    """The time-weighted mean of a series over the run (NaN intervals left out)."""
    width_s = np.diff(series.edges_s)
    values = series.values[name]
    known = ~np.isnan(values) & (width_s > 0)
    return float((values[known] * width_s[known]).sum() / width_s[known].sum()) if known.any() else 0.0


def _utilization_axes(ax, series: TimeSeries) -> None:
    ax.set_xlabel("simulated time (h)")
    ax.set_ylabel("GPUs leased / GPUs of the type")
    ax.set_xlim(0, series.edges_s[-1] / SECONDS_PER_HOUR or 1)
    ax.set_ylim(0, 1.05)
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1))
    ax.grid(alpha=0.3)


def _type_colors(cluster: Mapping[str, int]) -> dict[str, str]:
    return {w: f"C{i % 10}" for i, w in enumerate(w for w, n in cluster.items() if n > 0)}


def _legend_outside(ax) -> None:
    """Right of the axes: time series fill the whole plot area, wherever a legend inside would go.
    The axes give up the legend's width (its text measured once) and a gap."""
    legend = ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize="small")
    fig = ax.get_figure()
    width_in = legend.get_window_extent(fig.canvas.get_renderer()).width / fig.dpi
    _margins(fig, right_in=width_in + 0.15 + MARGINS_IN["right"])


def _title(fig: Figure, headline: str, *details: str) -> None:
    """What the figure shows on one line, the run's settings on a second. A figure title rather
    than the axes': an axes title is centred on the axes, which a legend outside pushes left, so
    a title wider than the axes ran off the figure's left edge; two lines keep each one short."""
    fig.suptitle("\n".join([headline, ", ".join(d for d in details if d)]).rstrip("\n"))


def _smoothing_note(series: TimeSeries) -> str:
    if series.window_s is None:
        return ""
    if series.window_s < SECONDS_PER_HOUR:
        window = f"{series.window_s / 60:.3g} min"
    else:
        window = f"{series.window_s / SECONDS_PER_HOUR:.3g} h"
    return f"mean over {window} windows"


def _cluster_label(cluster: Mapping[str, int]) -> str:
    return " ".join(f"{w}={n}" for w, n in cluster.items())


def _run_label(result: SimulationResult) -> str:
    return f"{_cluster_label(result.cluster)}, preset {result.preset}, seed {result.seed}"


def _shared_label(results: Mapping[str, SimulationResult]) -> str:
    clusters = {_cluster_label(r.cluster) for r in results.values()}
    return next(iter(clusters)) if len(clusters) == 1 else "several clusters"


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize="large", color="gray")
