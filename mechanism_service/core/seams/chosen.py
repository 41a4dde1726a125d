"""The seams' choices a mechanism runs with, resolved once at start (mechanism_service/plugins.py
builds them from MechanismSettings' names). ``None`` for a seam means its built-in default,
which the round runs as its own code rather than through a call: the default schedule stays the
same to the bit and pays nothing for the seam."""

from __future__ import annotations

import collections
from dataclasses import dataclass

from mechanism_service.core.seams.admission import AdmissionPolicy
from mechanism_service.core.seams.launch import LaunchStrategy
from mechanism_service.core.seams.placement import PlacementStrategy


@dataclass(frozen=True)
class Chosen:
    admission: AdmissionPolicy | None = None  # None: accept_all
    placement: PlacementStrategy | None = None  # None: consolidated (core/planning/placement.py)
    launch: LaunchStrategy | None = None  # None: priority (the pick as it is)
    # the specs as given (for the error lines that name a plug-in that failed)
    admission_name: str = "accept_all"
    placement_name: str = "consolidated"
    launch_name: str = "priority"


DEFAULTS = Chosen()


FALLBACKS = {"admission": "accept_all", "placement": "consolidated", "launch": "priority"}


def failure_fields(chosen: Chosen, seam: str, reason: str) -> dict[str, str]:
    """The fields of the error line a shell logs when a seam's plug-in was not used
    (``plugin_failed``): which seam, the plug-in as named, why, and what ran instead."""
    name = {"admission": chosen.admission_name, "placement": chosen.placement_name, "launch": chosen.launch_name}[seam]
    return {"seam": seam, "plugin": name, "reason": reason, "fallback": FALLBACKS[seam]}


class FailureTally:
    """How often each seam's plug-in was not used, and which failures to say: the 1st, 2nd, 4th,
    8th, ... of each seam. A broken plug-in fails at every boundary; a line each time would bury
    the rest of a long run's log (thousands of lines), while the doubling still says that it goes
    on and how often (``failures``), in a dozen lines over a run of thousands of boundaries."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()

    def said(self, chosen: Chosen, seam: str, reason: str) -> dict[str, object] | None:
        """The ``plugin_failed`` line's fields for this failure, or None when it is not one to say."""
        self.counts[seam] += 1
        n = self.counts[seam]
        if n & (n - 1):  # not a power of two
            return None
        return {**failure_fields(chosen, seam, reason), "failures": n}
