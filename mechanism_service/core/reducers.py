"""The only functions that change a MechanismState, by concern (issue 24 split them out of this
module): admission.py (whether an arrived job is admitted, held or refused), job_entries.py (a job
joins and leaves), servers.py (workers join and leave), allocation.py (resets and the new
allocation), settle.py (settling a finished round). Section numbers refer to
docs/gavel-semantics.md.

The names stay importable from here: callers import them so, and snapshots written before the
split pickled ``NewJob`` (memory.submitted, memory.held) under this module's path.
"""

from __future__ import annotations

from mechanism_service.core.admission import (  # noqa: F401
    WAITS_FOR_WORKERS,
    Admission,
    NewJob,
    admission,
    submission_problem,
)
from mechanism_service.core.allocation import (  # noqa: F401
    allocation_columns,
    apply_allocation,
    reset_due,
    reset_ledgers,
)
from mechanism_service.core.job_entries import admit, remove_job, withdraw_job  # noqa: F401
from mechanism_service.core.servers import add_server, entry_throughputs, refresh_throughputs, remove_server  # noqa: F401
from mechanism_service.core.settle import LeaseResult, record_first_runs, settle_round  # noqa: F401
