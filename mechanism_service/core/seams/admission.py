"""The admission seam: after feasibility admits a job (core/admission.py: it can run here), an
admission policy decides whether it joins the scheduled set now or waits in the admission queue.

Writing one (docs/extending.md walks through a whole package):

    class MyAdmission:
        def __init__(self, **params: str) -> None:      # --admission-param KEY=VALUE, as strings
            self.max_jobs = int(params.pop("max_jobs", "100"))
            if params:
                raise TypeError(f"unknown parameters: {', '.join(params)}")

        def admit(self, view: AdmissionView) -> AdmissionDecision:
            room = max(0, self.max_jobs - view.scheduled_jobs)
            return AdmissionDecision(
                admit=tuple(j.job_id for j in view.waiting[:room]),
                reason=f"{view.scheduled_jobs} jobs are scheduled; at most {self.max_jobs}",
            )

The name given to ``--admission`` (a built-in, an entry point of group ``gavel.admission``, or
``package.module:Name``) names a callable, usually a class, that is called once at start with the
parameters as keyword arguments (strings) and returns the policy. A parameter it does not know
should raise TypeError or ValueError: the command refuses it in one line naming the flag.

The contract:

- ``admit`` is called at a boundary (before the allocation is solved and the round is planned)
  whenever some job waits: the feasible arrivals of this boundary and the jobs already in the
  admission queue, together, in arrival order. It is never called for nothing.
- It returns the ids to admit now. They join the scheduled set in arrival order, whatever order
  they are given in; the others stay in the admission queue (in arrival order) and are offered
  again at the next boundary. An id that is not waiting is an invalid answer.
- ``reason`` (or ``reasons[job_id]``) says why a job waits; `gavel job ID --why` shows it under
  the reason code ``Admission``.
- It must be a pure function of the view. Keep no state between calls: a restarted mechanism
  builds a new policy and goes on from its journal's memory, and the simulator's two engines
  must make the same schedule (what a policy needs to remember belongs in the view).
- It should be fast: it runs inside every boundary while jobs wait.
- If it raises, or answers what the mechanism cannot use, the mechanism admits every waiting
  job for that boundary (``accept_all``) and logs one error line naming the policy; the cluster
  goes on.

Normalised compute: work in V100-seconds is a job's steps x its GPUs / its own steps/s alone on a
v100 (the rates the mechanism plans with: the table, or the estimates). It is the same however
the job is placed, so an entity's quota means the same work on any mix of types. A job with no
known speed on a v100 is normalised by its fastest type instead (as if that were a v100).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

# The type every job's work is normalised to (Gavel's table is relative to it too).
REFERENCE_TYPE = "v100"


@dataclass(frozen=True, slots=True)
class WaitingJob:
    """A feasible job that has not joined the scheduled set."""

    job_id: str
    entity: str | None  # the team or account it is charged to (JobSpec.entity); None: none given
    job_type: str
    gpus: int  # its gang: GPUs of one type it needs at once
    arrival_s: float  # when it arrived, mechanism time
    total_steps: int
    work_v100_s: float  # its whole work in V100-seconds (normalised compute, above)
    work_gpu_s: float  # its whole work in device-seconds at its fastest type


@dataclass(frozen=True, slots=True)
class EntityUsage:
    """What one entity's scheduled jobs (admitted, not ended) hold. ``used``: the work they have
    done (V100-seconds: steps done x GPUs / steps/s on a v100) or the device time they held
    (GPU-seconds, wherever they ran); ``committed``: the work they have left."""

    jobs: int = 0
    gpus: int = 0  # GPU demand: the sum of their gangs
    used_v100_s: float = 0.0
    used_gpu_s: float = 0.0
    committed_v100_s: float = 0.0
    committed_gpu_s: float = 0.0  # remaining steps at their fastest type


@dataclass(frozen=True, slots=True)
class AdmissionView:
    """What an admission policy sees at a boundary. Immutable; ``usage()`` is computed on its
    first call (one pass over the scheduled jobs), so a policy that needs no usage pays nothing."""

    now_s: float
    waiting: tuple[WaitingJob, ...]  # the admission queue then this boundary's arrivals, arrival order
    gpus_by_type: Mapping[str, int]  # the cluster's GPUs, by accelerator type
    scheduled_jobs: int  # admitted and not ended: running or waiting for the scheduler
    scheduled_gpus: int  # their GPU demand (sum of their gangs)
    running_jobs: int  # jobs in the last round's leases
    usage_of: Callable[[], Mapping[str, EntityUsage]] = field(default=dict, repr=False, compare=False)

    @property
    def cluster_gpus(self) -> int:
        return sum(self.gpus_by_type.values())

    def usage(self) -> Mapping[str, EntityUsage]:
        """Entity -> its scheduled jobs' usage (a job with no entity counts under "")."""
        return self.usage_of()


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    """Which waiting jobs join the scheduled set now; why the others wait (``reasons`` per job
    id, else ``reason``)."""

    admit: tuple[str, ...]
    reason: str = ""
    reasons: Mapping[str, str] = field(default_factory=dict)

    def reason_for(self, job_id: str) -> str:
        return self.reasons.get(job_id) or self.reason or "the admission policy holds it"


@runtime_checkable
class AdmissionPolicy(Protocol):
    def admit(self, view: AdmissionView) -> AdmissionDecision:
        """The waiting jobs to admit now (see the module's docstring for the contract)."""
        ...
