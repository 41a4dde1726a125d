"""The one check of a job's fields, shared by every place a job enters: `gavel submit`, the trace
readers, the mechanism (at receipt and at admission) and the policy's problem validation.

    check_job(job_id=..., job_type=..., scale_factor=..., ...)   None, or JobFieldError

Issue 9: these rules had four copies that drifted, and a field only the policy refused (a
negative SLO) made every later solve fail, for every job. A job that passes here is never refused
by a policy for its fields. The bounds beyond "finite and positive" are where the solvers stay
exact (measured over every registered policy, 12 jobs plus one extreme one): priority weights
between 1e-3 and 1e3 solve optimally everywhere, while 1e-4 against 1e4 comes back inaccurate from
water filling, 1e9 makes finish-time fairness fail outright, and 1e-300 makes max-min fairness
fail; times beyond 1e10 s (317 years) make finish-time fairness fail from 1e12 s.

Messages name the field with the caller's prefix (``jobs[3].slo_s: must be > 0, got -10``), so a
command line can swap the field for its flag (``--slo-s: must be > 0, got -10``).
"""

from __future__ import annotations

import math

from common.errors import JobFieldError

MIN_PRIORITY_WEIGHT = 1e-3
MAX_PRIORITY_WEIGHT = 1e3
MAX_TOTAL_STEPS = 10**12
MAX_SCALE_FACTOR = 1024
MAX_SLO_S = 1e10
MAX_TIME_S = 1e10  # arrival times (a trace's clock, or the Unix epoch for one-off submissions)
MAX_NAME_CHARS = 256


def _is_number(value: object) -> bool:
    """An int or float, or a numpy scalar of one (the policy builds problems from arrays); not a
    bool, although Python counts it as an int."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    dtype = getattr(value, "dtype", None)
    return getattr(dtype, "kind", "") in ("i", "u", "f") and getattr(value, "ndim", None) == 0


def check_number(
    value: object, path: str, *, minimum: float | None = 0.0, strict: bool = False, maximum: float | None = None
) -> float:
    """A finite float >= minimum (> minimum when strict) and <= maximum, or JobFieldError."""
    if type(value) is float and math.isfinite(value) and (
        minimum is None or (value > minimum if strict else value >= minimum)
    ) and (maximum is None or value <= maximum):
        return value  # the common case, checked without the general machinery below
    if not _is_number(value):
        raise JobFieldError(path, f"expected a number, got {type(value).__name__}")
    number = float(value)  # type: ignore[arg-type]
    if math.isnan(number):
        raise JobFieldError(path, "NaN is not allowed")
    if math.isinf(number):
        raise JobFieldError(path, f"must be finite, got {number}")
    if minimum is not None and (number <= minimum if strict else number < minimum):
        relation = ">" if strict else ">="
        raise JobFieldError(path, f"must be {relation} {minimum:g}, got {number:g}")
    if maximum is not None and number > maximum:
        raise JobFieldError(path, f"must be <= {maximum:g}, got {number:g}")
    return number


def check_integer(value: object, path: str, *, minimum: int, maximum: int | None = None) -> int:
    """An integer (a float that is one will do: JSON has no integers) in range, or JobFieldError."""
    integral = _is_number(value) and (isinstance(value, int) or float(value).is_integer())  # type: ignore[arg-type]
    if not integral:
        raise JobFieldError(path, f"expected an integer, got {value!r}")
    number = int(value)  # type: ignore[call-overload]
    if number < minimum:
        raise JobFieldError(path, f"must be >= {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise JobFieldError(path, f"must be <= {maximum}, got {number}")
    return number


def check_name(value: object, path: str) -> str:
    """A non-empty printable string without whitespace: an id or a name people type."""
    if not isinstance(value, str):
        raise JobFieldError(path, f"expected a string, got {type(value).__name__}")
    if not value:
        raise JobFieldError(path, "must not be empty")
    if len(value) > MAX_NAME_CHARS:
        raise JobFieldError(path, f"must be at most {MAX_NAME_CHARS} characters, got {len(value)}")
    if not value.isprintable() or " " in value:  # isprintable() is False for every other space
        raise JobFieldError(path, f"must be printable, without spaces, got {value!r}")
    return value


def check_job(
    *,
    job_id: object,
    job_type: object,
    scale_factor: object,
    priority_weight: object,
    slo_s: object = None,
    entity: object = None,
    total_steps: object = None,
    command: object = "",
    arrival_s: object = None,
    path: str = "",
    id_field: str = "job_id",
) -> None:
    """Every field of a job, as the policy would check it. ``None`` leaves an optional field out
    (``total_steps`` and ``arrival_s`` where the caller has none; ``job_type`` for a policy input
    that gives throughputs instead). ``path`` prefixes each field: ``"jobs[3]."`` or ``""``;
    ``id_field`` is what the caller calls the id (the policy's JSON says ``id``)."""
    check_name(job_id, f"{path}{id_field}")
    if job_type is not None:
        if not isinstance(job_type, str):
            raise JobFieldError(f"{path}job_type", f"expected a string, got {type(job_type).__name__}")
        if not job_type.strip():
            raise JobFieldError(f"{path}job_type", "must not be empty")
    check_integer(scale_factor, f"{path}scale_factor", minimum=1, maximum=MAX_SCALE_FACTOR)
    check_number(
        priority_weight, f"{path}priority_weight", minimum=MIN_PRIORITY_WEIGHT, maximum=MAX_PRIORITY_WEIGHT
    )
    if slo_s is not None:
        check_number(slo_s, f"{path}slo_s", strict=True, maximum=MAX_SLO_S)
    if entity is not None:
        check_name(entity, f"{path}entity")
    if total_steps is not None:
        check_integer(total_steps, f"{path}total_steps", minimum=1, maximum=MAX_TOTAL_STEPS)
    if not isinstance(command, str):
        raise JobFieldError(f"{path}command", f"expected a string, got {type(command).__name__}")
    if arrival_s is not None:
        check_number(arrival_s, f"{path}arrival_s", maximum=MAX_TIME_S)
