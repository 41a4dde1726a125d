"""A live mechanism in one process, on a clock the test moves (tests/service)."""

from __future__ import annotations

import asyncio
import pathlib

from common.journal import Journal
from common.messages import JobSpec
from mechanism_service.core.rounds import type_shuffler
from mechanism_service.core.settings import preset
from mechanism_service.config import MechanismConfig
from mechanism_service.service import MechanismService
from policy_service.service import shipped_context

TABLE = shipped_context().table
assert TABLE is not None


class ManualClock:
    """Live time that moves only when the test moves it; a sleep lasts until cancelled."""

    def __init__(self, now_s: float = 1000.0) -> None:
        self.t = now_s

    def now_s(self) -> float:
        return self.t

    async def sleep(self, duration_s: float) -> None:
        if duration_s > 0:
            await asyncio.Event().wait()
        await asyncio.sleep(0)


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
