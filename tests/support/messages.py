"""Builders for realistic messages."""

from __future__ import annotations

from common.codec import DEFAULT_CODEC
from common.messages import JobSpec, JobSubmitted, Message

JOB_TYPES = (
    "ResNet-50 (batch size 64)",
    "Transformer (batch size 128)",
    "LM (batch size 20)",
    "Recommendation (batch size 1024)",
    "CycleGAN",
)


def submitted(i: int, **overrides: object) -> JobSubmitted:
    fields: dict[str, object] = {
        "job_id": str(i),
        "job_type": JOB_TYPES[i % len(JOB_TYPES)],
        "total_steps": 1000 + 37 * i,
        "scale_factor": (1, 1, 2, 4, 8)[i % 5],
        "priority_weight": 1.0,
        "submit_time_s": float(i),
    }
    fields.update(overrides)
    return JobSubmitted(JobSpec(**fields))  # type: ignore[arg-type]


def wire(message: Message, **envelope: object) -> bytes:
    return DEFAULT_CODEC.encode(message, source=str(envelope.get("source", "test")), sent_at_s=0.0)
