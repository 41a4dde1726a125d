"""A distributed sweep's cells (``gavel sweep --bus amqp``, ``gavel serve simulator``).

A cell is one simulation of a sweep: a policy on the trace Gavel generates with a seed at an input
rate, on a cluster, with everything a simulator needs to run it on another machine (the trace is
generated there from its parameters; the throughput table is named by its digest, which the
simulator must hold). Cells go to one durable work queue that every simulator competes on; the
answers go to the sweep's own results queue (``sweep.result.<sweep_id>``). The ids are derived
from what a cell says (sim/sweep_cells.py), so a restarted sweep asks for the same cells by the
same ids and a cell answered twice (redelivered after a simulator died) counts once.
"""

from __future__ import annotations

from collections.abc import Mapping

from common.messages.base import Message, message


@message("sweep.cell")
class SweepCellRequested(Message):
    sweep_id: str
    cell_id: str
    policy: str
    jobs_per_hour: float
    seed: int  # the trace's and the scheduler's seed, as Gavel's sweeps
    num_jobs: int  # jobs in the generated trace; 0: generated until the window's jobs finish (sim/sweep_jobs.py)
    multi_gpu: bool
    cluster: Mapping[str, int]  # accelerator type -> GPUs
    table_sha256: str  # the throughput table's digest (sim/sweep_cells.py, table_digest)
    preset: str = "default"
    round_s: float = 360.0
    gpus_per_server: int = 1
    window_start: int = -1  # measured jobs: positions window_start..window_end-1; -1: all
    window_end: int = -1
    option: str = ""  # the variant's label when a sweep compares options ("" none)
    # The generator's other options (sim/traces TraceSpec's fields: priority weights, SLOs, ...),
    # as a JSON object ("" none).
    trace_json: str = ""
    # Other Scenario fields, as a JSON object (the variant's options; "" none): a sweep flag that
    # sets one rides here without a new message field.
    scenario_json: str = ""


@message("sweep.started.{sweep_id}")
class SweepCellStarted(Message):
    """A simulator began a cell (the sweep counts what is running)."""

    sweep_id: str
    cell_id: str
    simulator: str


@message("sweep.result.{sweep_id}")
class SweepCellFinished(Message):
    """A cell's outcome: its figures, that it saturated the cluster (``saturated``), or why it
    failed (``error`` not empty)."""

    sweep_id: str
    cell_id: str
    simulator: str
    avg_jct_s: float = -1.0  # -1: no measured job completed
    cluster_utilization: float = -1.0  # -1: not defined (no makespan)
    jobs_completed: int = 0
    jobs_measured: int = 0
    wall_s: float = 0.0
    error: str = ""
    # jobs of the trace that had arrived when the run stopped (what Gavel's run would have
    # generated; 0: not said, a simulator before this field)
    jobs_arrived: int = 0
    # the window's jobs had not finished when every job of the largest trace tried had arrived:
    # the run stands for one of Gavel's that its timeout (-t) stops, which Gavel's sweep records
    # as an infinite average JCT at utilisation 1.0, a result, not a failure (sim/sweep_jobs.py)
    saturated: bool = False
