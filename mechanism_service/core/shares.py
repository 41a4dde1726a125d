"""The status query ``shares``: each active job's share of the allocation in force, per type (the
fraction of rounds the policy gives it there, alone or packed), for `gavel top`. Pure."""

from __future__ import annotations

from mechanism_service.core.model import MechanismState


def shares_report(state: MechanismState | None) -> dict[str, dict[str, float]]:
    """Job id -> accelerator type -> share (a packed pair's entry counts for both of its jobs);
    a job the allocation leaves out is absent."""
    if state is None:
        return {}
    out: dict[str, dict[str, float]] = {}
    for entry, fractions in state.allocation.items():
        for index in entry:
            job = state.jobs.get(index)
            if job is None:
                continue
            mine = out.setdefault(job.job_id, {})
            for accelerator_type, share in fractions.items():
                if share > 0:
                    mine[accelerator_type] = round(mine.get(accelerator_type, 0.0) + share, 6)
    return out
