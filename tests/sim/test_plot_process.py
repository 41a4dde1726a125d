"""sim/plot_process.py: the plots a child process draws are the files drawing them in process
writes, byte for byte; a child that fails leaves the drawing to the parent; a parent that leaves
without handing work over stops the child with nothing drawn."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

from sim.output import write_comparison, write_run
from sim.metrics import summarize
from sim.plot_process import PlotProcess, draw, draw_on_two_cores
from tests.sim.test_plots import PRICES, toy_run

RUN_PLOTS = ("jct_cdf.png", "utilization.png", "queue.png")


def test_the_child_draws_the_same_files_as_this_process(tmp_path) -> None:
    result = toy_run()
    summary = summarize(result, PRICES)
    write_run(result, summary, tmp_path / "here")
    with PlotProcess.start() as plotter:
        written = write_run(result, summary, tmp_path / "child", plotter=plotter)
        assert not (tmp_path / "child" / "queue.png").exists()  # queued, not drawn yet
        plotter.finish()
    assert [p.name for p in written] == ["summary.json", "jobs.csv", *RUN_PLOTS]
    for name in ("summary.json", "jobs.csv", *RUN_PLOTS):
        assert (tmp_path / "child" / name).read_bytes() == (tmp_path / "here" / name).read_bytes(), name


def test_a_comparisons_overlays_go_to_the_child_too(tmp_path) -> None:
    results = {p: toy_run(p) for p in ("las_aware", "fifo_aware")}
    summaries = {p: summarize(r, PRICES) for p, r in results.items()}
    write_comparison(results, summaries, tmp_path / "here")
    with PlotProcess.start() as plotter:
        write_comparison(results, summaries, tmp_path / "child", plotter=plotter)
        plotter.finish()
    for name in ("comparison_jct_cdf.png", "comparison_utilization.png"):
        assert (tmp_path / "child" / name).read_bytes() == (tmp_path / "here" / name).read_bytes(), name


def test_a_child_that_failed_leaves_the_plots_to_this_process(tmp_path) -> None:
    failing = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"], stdin=subprocess.PIPE)
    plotter = PlotProcess(failing)
    result = toy_run()
    write_run(result, summarize(result, PRICES), tmp_path, plotter=plotter)
    plotter.finish()
    assert failing.returncode == 3
    for name in RUN_PLOTS:
        assert (tmp_path / name).stat().st_size > 0, name


def test_leaving_without_finishing_draws_nothing_and_ends_the_child(tmp_path) -> None:
    result = toy_run()
    with PlotProcess.start() as plotter:
        child = plotter._child
        write_run(result, summarize(result, PRICES), tmp_path, plotter=plotter)
    assert child is not None and child.returncode is not None  # stopped and reaped
    assert not any((tmp_path / name).exists() for name in RUN_PLOTS)


def test_a_child_whose_parent_is_gone_exits_at_end_of_file() -> None:
    child = subprocess.Popen([sys.executable, "-m", "sim.plot_process"], stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = child.communicate(b"", timeout=120)  # stdin closed with nothing handed over
    assert child.returncode == 0 and err == b""


def test_only_plot_functions_are_queued() -> None:
    with PlotProcess(None) as plotter, pytest.raises(ValueError, match="not a plot_"):
        plotter.add("jct_cdf_figure", object(), "x.png")


def test_plots_drawn_on_two_cores_are_all_drawn_and_a_failing_half_is_reported(tmp_path) -> None:
    result = toy_run()
    work = [(f"plot_{name}", (result, tmp_path / f"{name}.png")) for name in ("jct_cdf", "utilization", "queue")]
    assert draw_on_two_cores(work) == 0
    assert all((tmp_path / f"{name}.png").stat().st_size > 0 for name in ("jct_cdf", "utilization", "queue"))
    # the second plot goes to the forked copy, whose failure is the exit code (the parent then
    # draws everything in process and raises the real error)
    broken = [work[0], ("plot_queue", (object(), tmp_path / "broken.png"))]
    assert draw_on_two_cores(broken) == 1
    assert not (tmp_path / "broken.png").exists()


def test_a_failing_plot_process_says_so_by_its_exit_code_only(tmp_path) -> None:
    """The parent draws what the child could not and raises the real error, once: a traceback
    from the child as well would say it twice."""
    work = [("plot_jct_cdf", (object(), tmp_path / "a.png")), ("plot_queue", (object(), tmp_path / "b.png"))]
    child = subprocess.Popen([sys.executable, "-m", "sim.plot_process"], stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = child.communicate(pickle.dumps(work), timeout=120)
    assert child.returncode == 1 and err == b""


def test_drawing_in_process_draws_every_plot_it_can_then_raises_the_first_error(tmp_path) -> None:
    result = toy_run()
    work = [
        ("plot_jct_cdf", (object(), tmp_path / "broken.png")),
        ("plot_queue", (result, tmp_path / "queue.png")),
        ("plot_utilization", (result, tmp_path / "utilization.png")),
    ]
    with pytest.raises(AttributeError):
        draw(work)
    assert (tmp_path / "queue.png").stat().st_size > 0 and (tmp_path / "utilization.png").stat().st_size > 0
