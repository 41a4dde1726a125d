"""How many jobs a sweep's cell generates when its window is measured and no ``--jobs`` was
given: as many as Gavel's sweep would. Pure: numbers in, numbers out; sim/sweep_cells.py runs
the cell at the sizes this module names.

Gavel's ``run_sweep_continuous.py -s START -e END`` has no number of jobs: its ``simulate()``
draws the next job whenever the clock passes its arrival time and stops as soon as the jobs with
ids START..END-1 have completed. Here a trace is generated before the run, so a cell stands for
Gavel's run exactly when the trace holds every job that arrives before the run stops: the
generator is a prefix of itself (the first N jobs of a longer trace are the N-job trace), the
jobs that arrive later cannot change a measured job's completion, and the loop only ever looks
at arrivals up to the clock. Whether that held is known after the run: the trace's last job must
still be waiting to arrive when the run stops (``covers``). A run whose clock passes the last
arrival no longer stands for Gavel's, so it is stopped there and the cell runs again on a trace
twice as long (``sizes``): the runs that ran out cost at most as much again as the last. Jobs past
the stop cost only their generation (~30 µs each), so the first size is generous and a second run
is the exception: the longest jobs (up to ~167 h alone on a V100, several times that when shared)
set how long the window's last job takes.

A rate past the cluster's saturation never lets Gavel's run end: its sweeps stop such a run at a
timeout (``-t``) and record an infinite average JCT at utilisation 1.0. Here a cell whose largest
trace still ran out is recorded so (SweepCellFinished.saturated; ``saturated_note`` says it).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

ON_DEMAND = 0  # SweepCellRequested.num_jobs: generated until the window's jobs finish, as Gavel
# The longest job Gavel's generator draws runs 10^4 minutes (~167 h) alone on a V100: the first
# size has at least that long of arrivals past the window's last job.
TAIL_H = 168.0
DOUBLINGS = 2  # traces of the first size, twice and four times it; past them the cell is saturated


def first_size(window_end: int, jobs_per_hour: float) -> int:
    """The first trace's size: twice the window's end, and at least TAIL_H hours of arrivals past
    the window's last job."""
    return max(2 * window_end, window_end + math.ceil(jobs_per_hour * TAIL_H))


def sizes(window_end: int, jobs_per_hour: float) -> tuple[int, ...]:
    """The traces' sizes, in the order tried."""
    first = first_size(window_end, jobs_per_hour)
    return tuple(first * 2**k for k in range(DOUBLINGS + 1))


def jobs_arrived(arrivals_s: Sequence[float], stopped_s: float) -> int:
    """How many jobs of a trace (arrival times ascending) had arrived by ``stopped_s``, the
    simulated time when the run stopped: what Gavel's run would have generated."""
    return bisect.bisect_right(arrivals_s, stopped_s)


def covers(num_jobs: int, arrived: int) -> bool:
    """The trace held every job that arrived before the run stopped: its last one had not
    arrived (had it, the next job Gavel would draw might have arrived too)."""
    return arrived < num_jobs


def measured_jobs(window: tuple[int, int] | None) -> str:
    """The window's jobs as a person names them: "jobs 4000-4999", "job 7", "every job"."""
    if window is None:
        return "every job"
    start, end = window
    return f"job {start}" if end - start == 1 else f"jobs {start}-{end - 1}"


def saturated_note(num_jobs: int, jobs_per_hour: float, window: tuple[int, int]) -> str:
    """Why a cell is recorded as saturated, as a person reads it."""
    return (
        f"{measured_jobs(window)} had not finished when all {num_jobs} jobs of the largest trace tried had arrived: "
        f"at {jobs_per_hour:g} jobs/hour the cluster is saturated, and Gavel's run would not end either (its sweeps' "
        "-t stops such runs and record an infinite JCT); leave this rate out (--cutoffs), or give --jobs N to measure "
        "a trace of N jobs"
    )
