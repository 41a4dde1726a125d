"""Throughput estimates, from the estimator to the mechanism (docs/estimator.md).

The estimator's model is factorised, as Gavel's is: a job's steps/s alone on each accelerator
type (one row per job, since measurements differ job by job), and, per pair of *colocation
classes* (a job's class is its job type and scale factor), the fraction of its steps/s alone
that each member keeps when the two share the same GPUs. A packed pair's steps/s on type k is
then ``alone[a][k] * fractions[k][0]`` and ``alone[b][k] * fractions[k][1]``: n jobs need n rows
and one fraction table per pair of classes, not n^2 pair rows.

One message carries everything an estimator step changed (a submission, a progress report):
job rows, class pairs, the measurements it asks the mechanism to make (profiling) and the workers
it flags as stragglers. ``revision`` grows with every message of one estimator (it survives a
restart with the estimator's state), so a consumer can ignore an older one delivered late.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from common.messages.base import Message, message, value


class Provenance(enum.StrEnum):
    """Where an estimate came from, weakest evidence first (after ``oracle``)."""

    ORACLE = "oracle"  # read from a measured table, taken as the truth (the estimator in oracle mode)
    REFERENCE = "reference"  # from the reference set: the matched reference job, or the typical one
    USER = "user"  # the user's own estimate at submission (gavel submit --throughput)
    COMPLETED = "completed"  # filled in by matrix completion
    PROFILED = "profiled"  # measured in a run the estimator asked for
    MEASURED = "measured"  # measured by workers running the job as scheduled


@value
class JobThroughput:
    """One job alone: per accelerator type, its gang's steps/s (0: it cannot run there), where
    that figure came from and how sure the estimator is of it (0: a guess, 1: certain)."""

    job_id: str
    throughputs_steps_per_s: Mapping[str, float]
    provenance: Mapping[str, Provenance]
    confidence: Mapping[str, float]
    colocation_class: str = ""  # its row in ``colocations`` ("": never packed)


@value
class ColocationEstimate:
    """Two colocation classes sharing GPUs: per accelerator type, (first's steps/s packed / its
    steps/s alone, second's likewise); 0 where the pair cannot share that type."""

    classes: tuple[str, ...]  # exactly two; the same class twice is two jobs of one class
    fractions: Mapping[str, tuple[float, ...]]
    provenance: Mapping[str, Provenance]
    confidence: Mapping[str, float]


@value
class ProfileCell:
    """A measurement the estimator lacks: the job alone on a type (``partner_class`` "") or
    packed there with a job of ``partner_class``."""

    accelerator_type: str
    partner_class: str = ""


@value
class ProfilingRequest:
    """Measurements wanted for one job: every cell alone, and up to ``packed_wanted`` of the
    packed cells (whichever the mechanism can serve: a running job of that class to pair with).
    An empty request withdraws an earlier one."""

    job_id: str
    cells: tuple[ProfileCell, ...]
    packed_wanted: int = 0


@value
class StragglerFlag:
    """A worker whose measurements stay well below what its jobs' estimates predict."""

    worker_id: str
    ratio: float  # median measured / predicted over its recent jobs
    jobs: int  # distinct jobs behind the ratio
    flagged: bool = True  # False: it recovered (the flag is withdrawn)


@message("throughput.estimated", version=2)
class ThroughputEstimated(Message):
    """What one estimator step changed (see the module docstring)."""

    jobs: tuple[JobThroughput, ...] = ()
    colocations: tuple[ColocationEstimate, ...] = ()
    profiling: tuple[ProfilingRequest, ...] = ()
    stragglers: tuple[StragglerFlag, ...] = ()
    revision: int = 0
    mode: str = "learned"  # or "oracle"
    profiling_share: float = 0.0  # at most this share of the cluster's GPU time may go to profiling
    # The whole current picture (a restarted estimator's first word): profiling requests and
    # straggler flags it does not list are withdrawn.
    complete: bool = False
