"""The workload catalog: every job type of Gavel's throughput table as a real PyTorch training job.

``entry_for(job_type).build(config)`` gives a job (model, optimizers, a resumable data stream,
``train_step``, ``state_dict``); ``python -m worker_service.workloads`` trains one through the
lease-aware iterator. docs/workloads.md lists the families, their shapes, what ``--data-dir``
reads, and measured step times.

Only the catalog is imported here, and it imports no torch: the families' modules (which do) are
imported when a workload is built.
"""

from worker_service.workloads.catalog import FAMILIES, Family, Workload, entry_for, known_job_types
from worker_service.workloads.config import Size, WorkloadConfig, default_size
from worker_service.workloads.errors import DataDirError, UnknownWorkloadError, WorkloadError

__all__ = [
    "FAMILIES",
    "DataDirError",
    "Family",
    "Size",
    "UnknownWorkloadError",
    "Workload",
    "WorkloadConfig",
    "WorkloadError",
    "default_size",
    "entry_for",
    "known_job_types",
]
