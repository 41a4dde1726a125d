"""The durable queues that must exist before a job is submitted, with their bindings: every
service that must see every submission, even one it was not running for, has one here. Their
consumers declare them when they start; `gavel submit` declares them before it publishes (passively
first: a least-privilege user only checks them), and deploy/rabbitmq/definitions.json declares
them with the broker (tests/deploy checks the three agree).

Queue names are below the exchange (``gavel.<name>``).

Backpressure (issue 13): the mechanism's submissions queue is bounded. It holds at most
``max_length`` messages waiting (GAVEL_SUBMISSIONS_MAX_LENGTH; RabbitMQ counts only messages not
yet delivered, so the mechanism's prefetch is on top), and a publish past that is refused with a
nack (``x-overflow: reject-publish``), which the bus raises as QueueFullError: the submitter is
told which jobs did not fit, nothing is dropped without a word. Only this queue is bounded:
a message routed to several queues is nacked when any one refuses it, so with one bounded queue
a nack means exactly "the mechanism did not take it"; and the estimator's queue carries workers'
progress, which must never be refused. The bound is a queue argument, declared by everyone who
declares the queue (the same arguments, or RabbitMQ refuses the declaration): a queue made before
the bound existed is refused by name with what to do (common/transport/rabbit.py).
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
    bounded: bool = False  # at most the settings' submissions_max_length waiting (backpressure)


# The mechanism's submissions, seals and cancels, on one queue: a cancel follows its job.
MECHANISM_SUBMISSIONS = DurableQueue(
    "mechanism.submissions",
    (JobSubmitted.ROUTING_KEY, SubmissionsSealed.ROUTING_KEY, CancelJob.ROUTING_KEY),
    "mechanism",
    bounded=True,
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


def queue_bounds(max_length: int | None) -> dict[str, int]:
    """Queue name (below the exchange) -> its bound; empty with no bound (``None``)."""
    if max_length is None:
        return {}
    return {q.name: max_length for q in SUBMISSION_QUEUES if q.bounded}


def bound_arguments(max_length: int | None) -> dict[str, object]:
    """The queue arguments of a bound: refuse a publish past it (a nack), never drop the oldest
    (RabbitMQ's default overflow, drop-head, would lose accepted submissions without a word)."""
    if max_length is None:
        return {}
    return {"x-max-length": max_length, "x-overflow": "reject-publish"}
