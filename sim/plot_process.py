"""The plots of a run drawn by a child process that starts before the simulation (issue 12).

Importing matplotlib costs ~0.5 s of CPU and drawing a run's three plots ~0.3-0.4 s, a quarter of
what `gavel simulate` of Gavel's calibration trace takes as a whole process. The simulation
runs on one core; a child process started first imports the plotting stack (and draws a
throwaway figure, which loads the fonts) on the other core meanwhile, then draws what it is
handed once the run is over, on both cores (every other plot in a forked copy of itself: the
parent only waits by then), and exits without the interpreter's tear-down. The wall time is what the user waits for and what improves; the CPU time does not
(the child pays for its own interpreter and numpy, ~0.2 s), so on a machine whose cores are
all busy the gain shrinks. docs/mechanism.md, "Speed", says why; bench/RESULTS.md has the figures.

    plotter = PlotProcess.start()          # first: the child imports sim.plots (matplotlib)
    ...                                    # the simulation
    plotter.add("plot_jct_cdf", result, path)
    plotter.finish()                       # hands the work over, waits for the files

The work goes over the child's stdin as one pickle: (name of a ``plot_*`` function of
sim/plots.py, its arguments) pairs; the child inherits stderr, so a warning of matplotlib
reaches the user as it would in process. If the child cannot be started or fails, ``finish``
draws the same plots in this process, so the files are the same either way, and a real error is
raised from here, once: a failing child only says so by its exit code. A parent that leaves
without ``finish`` stops the child; one that dies without a word closes the child's stdin, and
the child exits at end of file.
"""

from __future__ import annotations

import os
import pathlib
import pickle
import signal
import subprocess
import sys
from collections.abc import Sequence

# The package root the child must import sim from: this checkout's, whatever the current
# directory (a bench runs a baseline checkout's `gavel simulate` from elsewhere).
_ROOT = pathlib.Path(__file__).resolve().parents[1]


class PlotProcess:
    """A child process that draws plots with sim/plots.py (see the module docstring)."""

    def __init__(self, child: subprocess.Popen[bytes] | None) -> None:
        self._child = child
        self._work: list[tuple[str, tuple[object, ...]]] = []

    @classmethod
    def start(cls) -> PlotProcess:
        """Start the child now; it imports the plotting stack while the caller works."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p)
        try:
            child = subprocess.Popen(
                [sys.executable, "-m", "sim.plot_process"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env,
            )
        except OSError:
            child = None  # no child: finish() draws in this process
        return cls(child)

    def add(self, name: str, *args: object) -> pathlib.Path:
        """Queue ``sim.plots.<name>(*args)`` (a ``plot_*`` function, its path argument last);
        returns that path, which exists once ``finish`` has returned."""
        if not name.startswith("plot_"):
            raise ValueError(f"{name!r} is not a plot_* function of sim/plots.py")
        self._work.append((name, args))
        return pathlib.Path(args[-1])  # type: ignore[arg-type]

    def finish(self) -> None:
        """Hand the queued plots to the child and wait for them; draw them here if it failed."""
        work, self._work = self._work, []
        child, self._child = self._child, None
        if child is not None and _handed_over(child, work):
            return
        draw(work)

    def close(self) -> None:
        """Leave without drawing (an error, or nothing to plot): the child is stopped at once
        rather than left to finish importing matplotlib (a bad flag still exits in a moment)."""
        child, self._child = self._child, None
        if child is not None:
            _close(child)
            child.terminate()
            child.wait()

    def __enter__(self) -> PlotProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _handed_over(child: subprocess.Popen[bytes], work: Sequence[tuple[str, tuple[object, ...]]]) -> bool:
    """Send the work, wait for the child: True when it drew everything."""
    try:
        assert child.stdin is not None
        child.stdin.write(pickle.dumps(list(work), protocol=pickle.HIGHEST_PROTOCOL))
    except (BrokenPipeError, OSError):
        pass  # the child is gone: its exit code says so
    _close(child)
    return child.wait() == 0


def _close(child: subprocess.Popen[bytes]) -> None:
    try:
        if child.stdin is not None:
            child.stdin.close()
    except OSError:
        pass


def draw(work: Sequence[tuple[str, tuple[object, ...]]]) -> None:
    """Draw each (plot function's name, arguments) with sim/plots.py, in this process: every
    plot that can be, then the first error raised, if any."""
    if not work:
        return
    import sim.plots as plots  # noqa: PLC0415 - matplotlib only where plots are drawn

    failed: list[Exception] = []
    for name, args in work:
        try:
            getattr(plots, name)(*args)
        except Exception as e:  # noqa: BLE001, PERF203 - raised below, once the others are drawn
            failed.append(e)
    if failed:
        raise failed[0]


def main() -> int:
    """The child: import the plotting stack, then draw what stdin hands over (nothing at EOF)."""
    # A Ctrl-C at the terminal reaches the whole process group: the parent stops (exit 130, one
    # line) and closes this stdin, which ends this process; a traceback of its own would only
    # add noise.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import sim.plots  # noqa: F401, PLC0415 - the point: imported before the work arrives

        _warm_up()
        try:
            work = pickle.load(sys.stdin.buffer)
        except EOFError:
            return 0  # the parent left without plots
        return draw_on_two_cores(work)
    except Exception:  # noqa: BLE001 - the exit code says it; the parent draws and reports the error once
        return 1


def _warm_up() -> None:
    """Draw a throwaway figure while the parent simulates: the first figure pays for loading the
    fonts and Agg's caches (~0.1 s), which is then off the path the user waits on."""
    import io  # noqa: PLC0415

    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    figure = Figure(figsize=(2.0, 2.0))
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    ax.step([1.0, 10.0], [0.0, 1.0], label="warm-up")
    ax.set_xscale("log")
    ax.set_title("warm-up")
    ax.legend()
    figure.savefig(io.BytesIO(), format="png")


def draw_on_two_cores(work: Sequence[tuple[str, tuple[object, ...]]]) -> int:
    """Draw every other plot in a forked copy of this process and the rest here: 0 when all were
    drawn. The parent waits for the plots by then, so both cores are free (a run's three plots:
    ~0.55 s drawn one after the other, ~0.3 s so). Where fork is missing, all are drawn here."""
    if len(work) < 2 or not hasattr(os, "fork"):
        draw(work)
        return 0
    sys.stderr.flush()  # nothing buffered is written twice
    pid = os.fork()
    if pid == 0:  # the copy: its half, then out without the interpreter's tear-down
        code = 1
        try:
            draw(work[1::2])
            code = 0
        except BaseException:  # noqa: BLE001, S110 - the exit code tells the parent, which reports the error once
            pass
        finally:
            sys.stderr.flush()
            os._exit(code)
    try:
        draw(work[::2])
    finally:
        _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    code = main()
    # Every file is written and closed: skip the interpreter's tear-down (freeing matplotlib's
    # modules and caches, ~0.25 s that the user would wait for at the end of `gavel simulate`).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
