"""Every message type, one module per domain. Import them from here."""

from common.messages.allocation import (
    AllocationComputed,
    AllocationEntry,
    AllocationFailed,
    AllocationRequested,
    EntitySpec,
    PairThroughputs,
    PolicyJob,
    PolicyProblem,
    SolveStatus,
)
from common.messages.base import Message, message, value
from common.messages.jobs import (
    CancelJob,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobProgress,
    JobRejected,
    JobSpec,
    JobSubmitted,
    SubmissionsSealed,
)
from common.messages.leases import ExtendLease, GangRendezvous, KillJobs, RunJobs, WorkerFenced
from common.messages.rounds import Assignment, RoundEnded, RoundStarted
from common.messages.status import StatusReported, StatusRequested
from common.messages.throughput import Provenance, ThroughputEstimated
from common.messages.workers import WorkerHeartbeat, WorkerRegistered

__all__ = [
    "AllocationComputed",
    "AllocationEntry",
    "AllocationFailed",
    "AllocationRequested",
    "Assignment",
    "CancelJob",
    "EntitySpec",
    "ExtendLease",
    "GangRendezvous",
    "JobCancelled",
    "JobCompleted",
    "JobFailed",
    "JobProgress",
    "JobRejected",
    "JobSpec",
    "JobSubmitted",
    "KillJobs",
    "Message",
    "PairThroughputs",
    "PolicyJob",
    "PolicyProblem",
    "Provenance",
    "RoundEnded",
    "RoundStarted",
    "RunJobs",
    "SolveStatus",
    "StatusReported",
    "StatusRequested",
    "SubmissionsSealed",
    "ThroughputEstimated",
    "WorkerFenced",
    "WorkerHeartbeat",
    "WorkerRegistered",
    "message",
    "value",
]
