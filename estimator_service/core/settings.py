"""The estimator's settings (docs/estimator.md, "Settings"), with the reasons for their defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from estimator_service.core.completion import CompletionSettings

MODES = ("learned", "oracle")


@dataclass(frozen=True, slots=True)
class EstimatorSettings:
    mode: str = "learned"
    completion: CompletionSettings = field(default_factory=CompletionSettings)
    # Gavel's profiling_percentage: the share of a new class's (accelerator type, reference) cells
    # measured before completion fills the rest (0.25: the bench's median colocated error is ~8%).
    profiling_percentage: float = 0.25
    # At most this share of the cluster's GPU time goes to profiling runs (the mechanism enforces
    # it; both jobs of a packed profiling run still make progress).
    profiling_share: float = 0.1
    # Standard deviations of the log of a figure, by source (beliefs.py). One measurement: step
    # times vary a few percent between leases. Between jobs of one class: the same model and batch
    # size on the same type. A user's guess: easily 2x off. The table's own figures: measured.
    # The matched reference or the completion: the bench's median errors are 8-18%, with tails.
    # Nothing known at all: the typical reference job, an order of magnitude either way.
    measurement_sd: float = 0.05
    job_spread_sd: float = 0.05
    user_sd: float = 0.5
    reference_sd: float = 0.05
    matched_sd: float = 0.3
    typical_sd: float = 1.0
    # Republish a figure when it moved by more than this (relative) and by more than publish_sds
    # of its own standard deviation, or its provenance changed (publishing.py: a move within what
    # is known of a figure is noise the scheduler would solve again for).
    publish_tolerance: float = 0.005
    publish_sds: float = 1.0
    # A worker is a straggler when its measurements are below this share of what confident
    # estimates (made without it) predict, in the median over at least straggler_jobs jobs.
    straggler_ratio: float = 0.7
    straggler_jobs: int = 3
    # Jobs pooled per class (the most recent; a job's own measurements are all kept, as sums).
    pooled_jobs: int = 32
    # This cluster's hardware is calibrated against the table (calibration.py) when its jobs run
    # more than this (log) off the table's figures: within it, the table's own spread. The spread
    # of the classes' levels (how each runs on this hardware) is assumed this until 3 classes
    # measured it.
    calibration_tolerance: float = 0.1
    calibration_sd: float = 0.3
    # What a straggler's slowness (a median over a few jobs) is not known to: added to the
    # variance of its measurements scaled back to a healthy peer's, where no healthy one measured.
    straggler_sd: float = 0.1

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode: {self.mode!r} is not one of {', '.join(MODES)}")
        if not 0.0 <= self.profiling_percentage <= 1.0:
            raise ValueError(f"profiling_percentage: {self.profiling_percentage} is not in [0, 1]")
        if not 0.0 <= self.profiling_share <= 1.0:
            raise ValueError(f"profiling_share: {self.profiling_share} is not in [0, 1]")
        if not self.publish_sds >= 0:
            raise ValueError(f"publish_sds: {self.publish_sds} must be >= 0")
        if not self.calibration_tolerance >= 0:
            raise ValueError(f"calibration_tolerance: {self.calibration_tolerance} must be >= 0")
        for name in (
            "measurement_sd", "job_spread_sd", "user_sd", "reference_sd", "matched_sd", "typical_sd", "calibration_sd",
            "straggler_sd",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: {getattr(self, name)} must be > 0")
