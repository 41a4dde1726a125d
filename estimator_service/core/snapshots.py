"""Estimator snapshots of older forms, upgraded on load (the service's state file pickles the model).

- Settings it lacks take their defaults.
- One from before calibration (which left stragglers' measurements out, ``_excluded``) has nothing
  calibrated yet and its flags as corrections (evidence.Stragglers).
- One from before the joint fit of hardware and classes (a calibration per type) calibrates again
  from what comes next.
- One from before changes.py holds its change tracking in fields of its own, taken into one.
- One from before view.py pickled its classes as ``estimator._Class`` (still importable there).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from estimator_service.core.calibration import AS_THE_TABLE, Calibration, Fit
from estimator_service.core.changes import Changes
from estimator_service.core.evidence import Stragglers
from estimator_service.core.settings import EstimatorSettings


def upgraded(state: dict[str, Any]) -> dict[str, Any]:
    """The pickled ``state`` of an Estimator (its ``__dict__``), of any form, in today's."""
    out = dict(state)
    if "changes" not in out:
        out["changes"] = Changes.taken_from(out)
    old = out["settings"]  # fields added since were never set on it
    if not all(hasattr(old, f.name) for f in dataclasses.fields(old)):
        out["settings"] = EstimatorSettings(**{f.name: getattr(old, f.name) for f in dataclasses.fields(old) if hasattr(old, f.name)})
    settings: EstimatorSettings = out["settings"]
    out.setdefault("_gangs_seen", {})
    out.setdefault("_packing_open", True)
    out.setdefault("_gate_jobs", set())
    out.setdefault("_gate_stale", True)
    out.setdefault("_last_fit", AS_THE_TABLE)
    if "calibration" in out:
        if not isinstance(out["_calibrated"], Fit):  # per type (calibration.py loaded it empty)
            out["_calibrated"] = AS_THE_TABLE
            out["changes"].global_stamp += 1
        return out
    out["calibration"] = Calibration(settings.calibration_tolerance, settings.calibration_sd)
    out["_calibrated"] = AS_THE_TABLE
    flagged = out["stragglers"].flagged
    out["_slow"] = Stragglers.of({w: math.log(f.ratio) for w, f in flagged.items()}, settings.straggler_sd**2)
    out.pop("_excluded", None)
    out["changes"].global_stamp += 1
    return out
