"""The workloads' errors: what a person or the worker can fix, said in one line.

    GavelError (common.errors), ValueError
    └── WorkloadError
        ├── UnknownWorkloadError  a job type no family of the catalog trains; lists the known ones
        └── DataDirError          a --data-dir that lacks the files its family reads; names them

The runner prints ``str(error)`` and exits 2 (no traceback): both are the caller's to fix.
"""

from __future__ import annotations

from common.errors import GavelError


class WorkloadError(GavelError, ValueError):
    """A workload cannot be built as asked."""


class UnknownWorkloadError(WorkloadError):
    """A job type the catalog does not know; the message lists the known families."""


class DataDirError(WorkloadError):
    """A data directory without the files its family expects; the message names them."""
