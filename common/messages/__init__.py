"""Every message type, one module per domain. Import them from here."""

from common.messages.allocation import (
    AllocationComputed,
    AllocationEntry,
    AllocationFailed,
    AllocationRequested,
    ClassColocation,
    EntitySpec,
    PairThroughputs,
    PolicyJob,
    PolicyProblem,
    SolveStatus,
)
from common.messages.base import Message, message, value
from common.messages.events import EVENT_KINDS, ClusterEvent
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
from common.messages.leases import ExtendLease, GangRendezvous, KillJobs, RunJobs, WorkerFenced, WorkerRefused
from common.messages.logs import LogsReported, LogsRequested, attempt_key
from common.messages.rounds import Assignment, RoundEnded, RoundStarted
from common.messages.status import StatusReported, StatusRequested
from common.messages.sweep import SweepCellFinished, SweepCellRequested, SweepCellStarted
from common.messages.throughput import (
    ColocationEstimate,
    JobThroughput,
    ProfileCell,
    ProfilingRequest,
    Provenance,
    StragglerFlag,
    ThroughputEstimated,
)
from common.messages.workers import WorkerHeartbeat, WorkerIdInUse, WorkerRegistered

__all__ = [
    "AllocationComputed",
    "AllocationEntry",
    "AllocationFailed",
    "AllocationRequested",
    "Assignment",
    "CancelJob",
    "ClassColocation",
    "ClusterEvent",
    "ColocationEstimate",
    "EVENT_KINDS",
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
    "JobThroughput",
    "KillJobs",
    "LogsReported",
    "LogsRequested",
    "Message",
    "PairThroughputs",
    "PolicyJob",
    "PolicyProblem",
    "ProfileCell",
    "ProfilingRequest",
    "Provenance",
    "RoundEnded",
    "RoundStarted",
    "RunJobs",
    "SolveStatus",
    "StatusReported",
    "StatusRequested",
    "StragglerFlag",
    "SubmissionsSealed",
    "SweepCellFinished",
    "SweepCellRequested",
    "SweepCellStarted",
    "ThroughputEstimated",
    "WorkerFenced",
    "WorkerRefused",
    "WorkerHeartbeat",
    "WorkerIdInUse",
    "WorkerRegistered",
    "attempt_key",
    "message",
    "value",
]
