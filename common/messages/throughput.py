"""Throughput estimates, from the estimator to the mechanism."""

from __future__ import annotations

import enum
from collections.abc import Mapping

from common.messages.base import Message, message


class Provenance(enum.StrEnum):
    ORACLE = "oracle"  # read from a measured table
    PROFILED = "profiled"  # measured against reference jobs
    COMPLETED = "completed"  # filled in by matrix completion
    MEASURED = "measured"  # reported by workers running the job


@message("throughput.estimated")
class ThroughputEstimated(Message):
    """Steps/s of one job alone (one id) or of a packed pair (two ids) on each accelerator type."""

    job_ids: tuple[str, ...]
    throughputs_steps_per_s: Mapping[str, tuple[float, ...]]  # type -> one value per job id
    provenance: Provenance
