"""sim/output.py and sim/plots.py: the files of a run, a comparison and a sweep exist, parse, have
the right rows and columns, and the plots are real PNGs with something drawn on them.

The results come from `toy_run`, a few lines of round-based scheduling (not the simulator) that
give a consistent schedule with queueing, idle gaps and lease extensions to draw.
"""

from __future__ import annotations

import csv
import json
import pathlib
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from matplotlib.image import imread
from matplotlib.transforms import Bbox

from sim.metrics import summarize
from sim.series import MAX_BINS, utilization_over_time
from sim.sweep_lines import SweepRow
from sim.output import JOB_COLUMNS, write_comparison, write_jobs_csv, write_run, write_sweep
from sim.plots import (
    jct_cdf_figure,
    jct_cdf_overlay_figure,
    plot_jct_cdf,
    plot_queue,
    plot_sweep,
    plot_utilization,
    queue_figure,
    sweep_figure,
    utilization_figure,
    utilization_overlay_figure,
)
from sim.results import JobOutcome, RoundRecord, SimulationResult

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLUSTER = {"v100": 4, "p100": 4, "k80": 4}
SPEED = {"v100": 1.0, "p100": 0.55, "k80": 0.3}  # steps/s of every toy job on each type, alone
PRICES = {"v100": 2.48, "p100": 1.46, "k80": 0.45}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def toy_run(
    policy: str = "las_aware",
    num_jobs: int = 60,
    jobs_per_hour: float = 4.0,
    seed: int = 0,
    round_s: float = 360.0,
    cluster: dict[str, int] | None = None,
) -> SimulationResult:
    """Jobs arrive (Poisson) with 60 x 10^U(1, 2.5) s of work on a v100 and scale factor 1, 2 or 4;
    each round, active jobs in FIFO order (``fifo*``) or least attained service first, each on
    the fastest type with room (``*aware``) or a random one with room. A round lasts round_s, or
    less when every job in it finishes early. Measured: all but the first and last 10% of jobs."""
    cluster = dict(CLUSTER if cluster is None else cluster)
    rng = np.random.default_rng(seed)
    arrival_s = np.cumsum(rng.exponential(3600.0 / jobs_per_hour, num_jobs))
    total_steps = (60 * 10 ** rng.uniform(1.0, 2.5, num_jobs)).astype(int) + 1
    scale = rng.choice([1, 2, 4], size=num_jobs, p=[0.7, 0.2, 0.1])
    done = np.zeros(num_jobs)
    attained_s = np.zeros(num_jobs)
    start = [None] * num_jobs
    completion = [None] * num_jobs
    gpu_s = [dict.fromkeys(cluster, 0.0) for _ in range(num_jobs)]
    rounds: list[RoundRecord] = []
    previous: dict[int, str] = {}
    t = 0.0
    while any(c is None for c in completion):
        active = [j for j in range(num_jobs) if arrival_s[j] <= t and completion[j] is None]
        if not active:
            t = float(min(arrival_s[j] for j in range(num_jobs) if completion[j] is None))
            previous = {}
            continue
        fifo = policy.startswith("fifo")
        order = sorted(active, key=lambda j: (arrival_s[j] if fifo else attained_s[j], j))
        free = dict(cluster)
        placed: dict[int, str] = {}
        for j in order:
            fits = [w for w in cluster if free[w] >= scale[j]]
            if fits:
                w = max(fits, key=SPEED.get) if policy.endswith("aware") else fits[rng.integers(len(fits))]
                placed[j] = w
                free[w] -= scale[j]
        finish = {}
        for j, w in placed.items():
            steps = min(SPEED[w] * round_s, total_steps[j] - done[j])
            finish[j] = t + steps / SPEED[w]
            done[j] += steps
        end = max(finish.values()) if all(f < t + round_s for f in finish.values()) else t + round_s
        busy_s = dict.fromkeys(cluster, 0.0)
        busy = dict.fromkeys(cluster, 0)
        for j, w in placed.items():
            start[j] = t if start[j] is None else start[j]
            attained_s[j] += (end - t) * scale[j]
            gpu_s[j][w] += (end - t) * scale[j]
            busy[w] += int(scale[j])
            busy_s[w] += (finish[j] - t) * scale[j]
            if done[j] >= total_steps[j]:
                completion[j] = finish[j]
        rounds.append(
            RoundRecord(
                round_id=len(rounds),
                start_s=t,
                end_s=end,
                busy_gpus_by_type=busy,
                busy_gpu_seconds_by_type=busy_s,
                jobs_running=len(placed),
                jobs_waiting=len(active) - len(placed),
                leases_extended=sum(previous.get(j) == w for j, w in placed.items()),
                lease_opportunities=sum(j in active for j in previous),
                reset=set(placed) != set(previous),
            )
        )
        previous = placed
        t = end
    jobs = tuple(
        JobOutcome(
            job_id=str(j),
            job_type="ResNet-18 (batch size 64)",
            scale_factor=int(scale[j]),
            priority_weight=1.0,
            total_steps=int(total_steps[j]),
            arrival_s=float(arrival_s[j]),
            start_s=start[j],
            completion_s=None if j == num_jobs - 1 else completion[j],  # the last one: unfinished
            steps_done=int(done[j]),
            gpu_seconds_by_type=gpu_s[j],
            dropped=j == num_jobs - 2,
        )
        for j in range(num_jobs)
    )
    return SimulationResult(
        policy=policy,
        preset="default",
        cluster=cluster,
        round_s=round_s,
        seed=seed,
        jobs=jobs,
        rounds=tuple(rounds),
        makespan_s=t,
        measured_job_ids=tuple(str(j) for j in range(num_jobs // 10, num_jobs - num_jobs // 10)),
        resets=sum(r.reset for r in rounds),
        solve_times_s=tuple(rng.uniform(0.01, 0.2, sum(r.reset for r in rounds))),
        wall_s=1.5,
    )


@pytest.fixture(scope="module")
def small() -> SimulationResult:
    return toy_run(num_jobs=40)


def assert_png_with_content(path: pathlib.Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert len(data) > 15_000, f"{path} is only {len(data)} bytes"
    pixels = imread(path)
    assert pixels.shape[0] > 300 and pixels.shape[1] > 600
    # Not blank: many pixels differ from the background.
    rgb = pixels[..., :3].reshape(-1, 3)
    assert (np.abs(rgb - rgb[0]).sum(axis=1) > 0.1).mean() > 0.01, f"{path} looks blank"
    assert rgb.std() > 0.05


def test_write_run_writes_the_summary_the_jobs_and_three_plots(small, tmp_path):
    summary = summarize(small, PRICES)
    paths = write_run(small, summary, tmp_path / "run")
    assert [p.name for p in paths] == ["summary.json", "jobs.csv", "jct_cdf.png", "utilization.png", "queue.png"]

    record = json.loads(paths[0].read_text())
    settings = {"policy": "las_aware", "preset": "default", "cluster": CLUSTER, "round_s": 360.0, "seed": 0}
    assert {k: record[k] for k in (*settings, "wall_s", "jobs_total")} == {**settings, "wall_s": 1.5, "jobs_total": 40}
    assert {k: v for k, v in record.items() if k in summary.as_dict()} == json.loads(json.dumps(summary.as_dict()))
    assert [record[f"jobs_{k}"] for k in ("measured", "completed", "dropped", "unfinished")] == [32, 32, 0, 0]

    with paths[1].open(newline="") as f:
        rows = list(csv.DictReader(f))
    header = [*JOB_COLUMNS, "gpu_seconds_v100", "gpu_seconds_p100", "gpu_seconds_k80", "dropped", "measured"]
    assert list(rows[0]) == header
    assert [row["job_id"] for row in rows] == [job.job_id for job in small.jobs]
    for row, job in zip(rows, small.jobs):
        assert float(row["arrival_s"]) == job.arrival_s
        assert row["jct_s"] == ("" if job.jct_s is None else str(job.jct_s))
        assert float(row["gpu_seconds_k80"]) == job.gpu_seconds_by_type["k80"]
    assert rows[-1]["completion_s"] == rows[-1]["jct_s"] == ""  # unfinished
    assert (rows[-2]["dropped"], rows[-1]["dropped"]) == ("true", "false")
    assert [row["measured"] for row in rows].count("true") == 32

    for png in paths[2:]:
        assert_png_with_content(png)


def test_jobs_csv_has_a_column_for_a_type_outside_the_cluster(tmp_path):
    result = toy_run(num_jobs=5, cluster={"v100": 4, "p100": 0, "k80": 4})
    odd = JobOutcome("x", "t", 1, 1.0, 10, 0.0, None, None, 0, {"tpu": 3.0})
    path = write_jobs_csv(replace(result, jobs=(*result.jobs, odd)), tmp_path / "jobs.csv")
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    gpu_columns = [c for c in rows[0] if c.startswith("gpu_seconds_")]
    assert gpu_columns == [f"gpu_seconds_{w}" for w in ("v100", "p100", "k80", "tpu")]
    assert (rows[-1]["gpu_seconds_tpu"], rows[-1]["start_s"], rows[0]["gpu_seconds_tpu"]) == ("3.0", "", "0.0")


def test_write_comparison_writes_the_table_and_two_overlays(tmp_path):
    results = {p: toy_run(p, num_jobs=40, jobs_per_hour=6.0) for p in ("fifo_agnostic", "las_agnostic", "las_aware")}
    summaries = {p: summarize(r, PRICES) for p, r in results.items()}
    paths = write_comparison(results, summaries, tmp_path / "cmp")
    names = ["comparison.json", "comparison.txt", "comparison_jct_cdf.png", "comparison_utilization.png"]
    assert [p.name for p in paths] == names
    record = json.loads(paths[0].read_text())
    assert [row["policy"] for row in record["rows"]] == list(results)
    assert record["rows"][2]["avg_jct_h"] == pytest.approx(summaries["las_aware"].avg_jct_s / 3600)
    assert record["runs"]["las_aware"]["avg_jct_s"] == summaries["las_aware"].avg_jct_s
    lines = paths[1].read_text().splitlines()
    assert lines[0].startswith("policy") and [line.split()[0] for line in lines[1:]] == list(results)
    for png in paths[2:]:
        assert_png_with_content(png)
    with pytest.raises(ValueError, match="different keys"):
        write_comparison(results, {"las_aware": summaries["las_aware"]}, tmp_path / "bad")


def test_many_rounds_are_smoothed_and_still_plot(tmp_path):
    result = toy_run(num_jobs=80, jobs_per_hour=3.0, seed=3, round_s=120.0)
    assert len(result.rounds) > MAX_BINS and utilization_over_time(result).window_s is not None
    assert_png_with_content(plot_utilization(result, tmp_path / "utilization.png"))
    assert_png_with_content(plot_queue(result, tmp_path / "queue.png"))


def test_sweep_plot_and_csv(tmp_path):
    rows = [
        SweepRow(policy, rate, seed, 3600.0 * base * (1 + 0.1 * seed) / max(0.2, 1 - rate / 8.0))
        for policy, base in (("las_agnostic", 2.0), ("las_aware", 1.5), ("las_aware_packed", 1.2))
        for rate in (1.0, 2.0, 4.0, 6.0)
        for seed in range(3)
    ]
    csv_path, png = write_sweep([*rows, SweepRow("fifo", 1.0, 0, None)], tmp_path / "sweep")
    with csv_path.open(newline="") as f:
        written = list(csv.DictReader(f))
    assert len(written) == 37
    assert written[-1] == {"policy": "fifo", "jobs_per_hour": "1.0", "seed": "0", "avg_jct_s": ""}
    assert_png_with_content(png)


def test_a_sweep_with_variants_has_a_line_per_policy_and_variant_and_their_column(tmp_path):
    rows = [SweepRow("fifo", rate, 0, 3600.0 * rate * k, option) for k, option in ((1, "base"), (2, "load05")) for rate in (1.0, 2.0)]
    ax = sweep_figure(rows).axes[0]
    assert [line.get_label() for line in ax.get_lines()] == ["fifo [base]", "fifo [load05]"]
    assert [line.get_ydata().tolist() for line in ax.get_lines()] == [[1.0, 2.0], [2.0, 4.0]]
    csv_path, png = write_sweep(rows, tmp_path / "sweep")
    with csv_path.open(newline="") as f:
        written = list(csv.DictReader(f))
    assert written[-1] == {"policy": "fifo", "jobs_per_hour": "2.0", "seed": "0", "avg_jct_s": "14400.0", "option": "load05"}
    assert_png_with_content(png)


def test_empty_inputs_still_make_labelled_plots(tmp_path):
    empty = SimulationResult("fifo", "default", dict(CLUSTER), 360.0, 0, (), (), 0.0, (), 0, ())
    for plot in (plot_jct_cdf, plot_utilization, plot_queue):
        path = plot(empty, tmp_path / f"{plot.__name__}.png")
        assert path.read_bytes()[:8] == PNG_SIGNATURE
    assert plot_sweep([], tmp_path / "sweep.png").read_bytes()[:8] == PNG_SIGNATURE


def test_plotting_leaves_pyplot_alone(tmp_path):
    code = (
        "import sys; from sim.plots import plot_sweep; from sim.sweep_lines import SweepRow; "
        f"plot_sweep([SweepRow('a', 1.0, 0, 3600.0)], {str(tmp_path / 'p.png')!r}); "
        "print('matplotlib.pyplot' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- geometry: what a person sees is inside the picture, and the data fills the panels ----------

LONG_POLICY = "max_min_fairness_packed"  # the longest of Gavel's policy names in a title


def drawn(fig):
    """Lay the figure out as savefig would (constrained layout runs at draw time)."""
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def assert_laid_out(fig) -> None:
    """Every drawn artist (titles, labels, tick labels, legends) lies within the figure, so
    nothing is cut off at its edges, and the title, the figure's legends and the panels (each
    with its own labels and legend) do not overlap one another."""
    renderer = drawn(fig)
    half_px = 0.5
    page_px = fig.bbox
    ink_px = fig.get_tightbbox(renderer).transformed(fig.dpi_scale_trans)
    assert ink_px.x0 >= page_px.x0 - half_px and ink_px.x1 <= page_px.x1 + half_px, (ink_px, page_px)
    assert ink_px.y0 >= page_px.y0 - half_px and ink_px.y1 <= page_px.y1 + half_px, (ink_px, page_px)
    assert fig.get_suptitle() or any(ax.get_title() for ax in fig.axes), "every figure has a title"
    # Figure.get_suptitle gives only the string; the Text itself has no public getter.
    blocks = {"title": fig._suptitle.get_window_extent(renderer)} if fig.get_suptitle() else {}
    blocks |= {f"legend {i}": legend.get_window_extent(renderer) for i, legend in enumerate(fig.legends)}
    blocks |= {f"panel {i}": ax.get_tightbbox(renderer) for i, ax in enumerate(fig.axes)}
    names = list(blocks)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            overlap = Bbox.intersection(blocks[a], blocks[b])
            assert overlap is None or min(overlap.width, overlap.height) <= half_px, f"{a} overlaps {b}"


@pytest.mark.parametrize("figure", [jct_cdf_figure, utilization_figure, queue_figure])
def test_a_runs_figures_keep_their_titles_and_labels_inside(figure):
    result = replace(toy_run(num_jobs=40), policy=LONG_POLICY)
    assert_laid_out(figure(result))


def three_policies() -> dict[str, SimulationResult]:
    return {
        name: replace(toy_run(policy, num_jobs=40, jobs_per_hour=6.0), policy=name)
        for name, policy in (
            ("max_min_fairness", "las_agnostic"),
            ("max_min_fairness_perf", "las_aware"),
            (LONG_POLICY, "fifo_aware"),
        )
    }


def test_the_utilization_overlay_panels_span_the_figure_and_the_data_spans_them():
    results = three_policies()
    fig = utilization_overlay_figure(results)
    assert_laid_out(fig)
    end_h = max(r.makespan_s for r in results.values()) / 3600
    assert len(fig.axes) == 4  # the whole cluster, then v100, p100, k80
    for ax in fig.axes:
        # The panels take the figure's width (the legend must not take a column of its own
        # beside them), and the longest run reaches the right edge of each panel.
        assert ax.get_position().width > 0.8, ax.get_title(loc="left")
        assert ax.get_xlim() == pytest.approx((0.0, end_h))
        assert max(np.nanmax(line.get_xdata()) for line in ax.get_lines()) == pytest.approx(end_h)
    legend_texts = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    legend_texts += [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert [t.split(" ")[0] for t in legend_texts] == list(results)


def test_the_jct_overlay_keeps_everything_inside():
    assert_laid_out(jct_cdf_overlay_figure(three_policies()))


def test_the_sweep_legend_covers_no_data():
    rows = [
        SweepRow(policy, rate, seed, 3600.0 * (30 - 8 * i + rate + seed))
        for i, policy in enumerate(("max_min_fairness", "max_min_fairness_perf", LONG_POLICY))
        for rate in (1.0, 2.0, 3.0)
        for seed in range(2)
    ]
    # the settings line of Gavel's README sweep, as gavel sweep writes it under the title
    fig = sweep_figure(rows, setting="36 v100, 36 p100, 36 k80, jobs 4000-4999, preset default, seeds 0, 1, 2")
    renderer = drawn(fig)
    assert_laid_out(fig)
    (ax,) = fig.axes
    legend = ax.get_legend() or fig.legends[0]
    # Outside the plot area: whatever the lines and bands do, the legend cannot hide them.
    assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))


def test_past_ten_policies_the_sweep_lines_still_differ():
    # Thirteen policies (the comparison of docs/policies.md): the colours come round after ten,
    # so policies 0 and 10 share one; the line style and marker tell them apart.
    rows = [SweepRow(f"p{i}", rate, 0, 3600.0 * (i + rate)) for i in range(13) for rate in (1.0, 2.0)]
    (ax,) = sweep_figure(rows).axes
    looks = [(line.get_color(), line.get_linestyle(), line.get_marker()) for line in ax.get_lines()]
    assert len(looks) == 13 and len(set(looks)) == 13
    assert looks[0][0] == looks[10][0]


def test_bands_are_drawn_for_a_few_lines_only():
    # Two seeds a policy: a band each for three policies; for thirteen the bands would cover
    # one another and the lines, so none is drawn (sweep.csv keeps each seed).
    def bands(policies: int) -> int:
        rows = [SweepRow(f"p{i}", rate, s, 3600.0 * (i + rate + s)) for i in range(policies) for rate in (1.0, 2.0) for s in (0, 1)]
        (ax,) = sweep_figure(rows).axes
        return len(ax.collections)

    assert (bands(3), bands(13)) == (3, 0)
