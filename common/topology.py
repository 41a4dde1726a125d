"""The durable queues that must exist before a job is submitted, with their bindings: every
service that must see every submission, even one it was not running for, has one here. Their
consumers declare them when they start; `gavel submit` declares them before it publishes (passively
first: a least-privilege user only checks them), and deploy/rabbitmq/definitions.json declares
them with the broker (tests/deploy checks the three agree).

Queue names are below the exchange (``gavel.<name>``).
"""

from __future__ import annotations

from dataclasses import dataclass

from common.messages import (
    CancelJob,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobProgress,
    JobRejected,
    JobSubmitted,
    SubmissionsSealed,
)


@dataclass(frozen=True, slots=True)
class DurableQueue:
    name: str
    bindings: tuple[str, ...]
    consumer: str  # the service that consumes it


# The mechanism's submissions, seals and cancels, on one queue: a cancel follows its job.
MECHANISM_SUBMISSIONS = DurableQueue(
    "mechanism.submissions", (JobSubmitted.ROUTING_KEY, SubmissionsSealed.ROUTING_KEY, CancelJob.ROUTING_KEY), "mechanism"
)
# Everything the estimator learns from, on one queue: a job's progress can only follow its
# submission (it was published before the job could run), and its end follows its progress.
ESTIMATOR_INPUTS = DurableQueue(
    "estimator.inputs",
    (
        JobSubmitted.ROUTING_KEY,
        JobProgress.ROUTING_KEY,
        JobCompleted.ROUTING_KEY,
        JobFailed.ROUTING_KEY,
        JobCancelled.ROUTING_KEY,
        JobRejected.ROUTING_KEY,
    ),
    "estimator",
)
# Declared before any submission is published.
SUBMISSION_QUEUES = (MECHANISM_SUBMISSIONS, ESTIMATOR_INPUTS)
