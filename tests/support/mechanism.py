"""A live mechanism in one process, on a clock the test moves (tests/support/clock.py, SteppedClock)."""

from __future__ import annotations

import pathlib

from common.journal import Journal
from common.messages import JobSpec
from mechanism_service.config import MechanismConfig
from mechanism_service.core.rounds import type_shuffler
from mechanism_service.core.settings import preset
from mechanism_service.service import MechanismService
from policy_service.service import shipped_context

TABLE = shipped_context().table
assert TABLE is not None


def live_mechanism(journal: pathlib.Path | None, clock: object) -> MechanismService:
    config = MechanismConfig(
        settings=preset("default", "fifo"),
        policy="fifo",
        table=TABLE,
        shuffle=type_shuffler("default", 0),
        round_timeout_s=600.0,
        deadlines=False,
        elastic_types=TABLE.accelerator_types,  # no worker yet: jobs wait rather than being refused
    )
    return MechanismService(
        config, clock=clock, journal=Journal(journal) if journal is not None else None  # type: ignore[arg-type]
    )


def spec(i: int) -> JobSpec:
    return JobSpec(f"job-{i:03d}", "ResNet-50 (batch size 64)", total_steps=1000 + i)
