"""What a trace holds, in a few numbers (``gavel trace show``)."""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from common.throughputs import ThroughputTable
from sim.traces.job import TraceJob


@dataclass(frozen=True, slots=True)
class TraceSummary:
    """Job-type and unsized counts are in descending order of count (ties by name); scale factors
    and priority weights in ascending order of value. ``gpu_hours`` is the GPU time every
    job needs alone on the reference type (total steps / isolated steps/s x scale factor), over the
    jobs the table can size; ``unsized_job_counts`` counts the other (job type, scale factor) keys.
    """

    num_jobs: int
    first_arrival_s: float | None
    last_arrival_s: float | None
    mean_interarrival_s: float | None  # (last - first) / (jobs - 1); None below two jobs
    job_type_counts: Mapping[str, int]
    scale_factor_counts: Mapping[int, int]
    priority_weight_counts: Mapping[float, int]
    num_with_slo: int
    reference_accelerator_type: str
    gpu_hours: float
    unsized_job_counts: Mapping[tuple[str, int], int]
    arrivals_in_order: bool  # Gavel's simulator asserts non-decreasing arrival times


def _counts(values: Sequence, by_value: bool = False) -> Mapping:
    counted = collections.Counter(values)
    order = sorted(counted.items()) if by_value else sorted(counted.items(), key=lambda kv: (-kv[1], str(kv[0])))
    return MappingProxyType(dict(order))


def summarize_trace(jobs: Sequence[TraceJob], table: ThroughputTable, reference_accelerator_type: str = "v100") -> TraceSummary:
    arrivals = [job.arrival_time_s for job in jobs]
    gpu_s = 0.0
    unsized = []
    for job in jobs:
        steps_per_s = table.isolated_steps_per_s.get((job.job_type, job.scale_factor, reference_accelerator_type), 0.0)
        if steps_per_s > 0:
            gpu_s += job.total_steps / steps_per_s * job.scale_factor
        else:
            unsized.append((job.job_type, job.scale_factor))
    return TraceSummary(
        num_jobs=len(jobs),
        first_arrival_s=min(arrivals) if arrivals else None,
        last_arrival_s=max(arrivals) if arrivals else None,
        mean_interarrival_s=(max(arrivals) - min(arrivals)) / (len(jobs) - 1) if len(jobs) > 1 else None,
        job_type_counts=_counts([job.job_type for job in jobs]),
        scale_factor_counts=_counts([job.scale_factor for job in jobs], by_value=True),
        priority_weight_counts=_counts([float(job.priority_weight) for job in jobs], by_value=True),
        num_with_slo=sum(job.slo_s is not None for job in jobs),
        reference_accelerator_type=reference_accelerator_type,
        gpu_hours=gpu_s / 3600,
        unsized_job_counts=_counts(unsized),
        arrivals_in_order=all(a <= b for a, b in zip(arrivals, arrivals[1:])),
    )
