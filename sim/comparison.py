"""The comparison table of several runs (one row per policy or run label) from their summaries,
as `gavel simulate`, `gavel demo` and comparison.json show it. Pure: Summary values in, rows and
text out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from sim.metrics import SECONDS_PER_HOUR, Summary


@dataclass(frozen=True, slots=True)
class ComparisonRow:
    """One policy's line in the comparison table. Hours = seconds / 3600; ``lease_extension_pct``
    = 100 x lease_extension_share; ``cost_usd`` is the measured jobs' cost (comparable across
    policies with a window, where each run stops at a different time)."""

    policy: str
    jobs_completed: int
    jobs_measured: int
    avg_jct_h: float | None
    median_jct_h: float | None
    p95_jct_h: float | None
    p99_jct_h: float | None
    makespan_h: float
    cluster_utilization: float | None
    lease_extension_pct: float | None
    cost_usd: float

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def compare(summaries: Mapping[str, Summary]) -> list[ComparisonRow]:
    """One row per summary, keyed by policy (or any run label), in the mapping's order."""
    return [
        ComparisonRow(
            policy=policy,
            jobs_completed=s.jobs_completed,
            jobs_measured=s.jobs_measured,
            avg_jct_h=_hours(s.avg_jct_s),
            median_jct_h=_hours(s.median_jct_s),
            p95_jct_h=_hours(s.p95_jct_s),
            p99_jct_h=_hours(s.p99_jct_s),
            makespan_h=s.makespan_s / SECONDS_PER_HOUR,
            cluster_utilization=s.cluster_utilization,
            lease_extension_pct=None if s.lease_extension_share is None else 100.0 * s.lease_extension_share,
            cost_usd=s.cost_measured_usd,
        )
        for policy, s in summaries.items()
    ]


_COLUMNS = (  # header, right-aligned?, cell
    ("policy", False, lambda r: r.policy),
    ("done", True, lambda r: f"{r.jobs_completed}/{r.jobs_measured}"),
    ("avg JCT h", True, lambda r: _fmt(r.avg_jct_h, ".2f")),
    ("median h", True, lambda r: _fmt(r.median_jct_h, ".2f")),
    ("p95 h", True, lambda r: _fmt(r.p95_jct_h, ".2f")),
    ("p99 h", True, lambda r: _fmt(r.p99_jct_h, ".2f")),
    ("makespan h", True, lambda r: _fmt(r.makespan_h, ".2f")),
    ("util", True, lambda r: _fmt(r.cluster_utilization, ".3f")),
    ("lease-ext %", True, lambda r: _fmt(r.lease_extension_pct, ".1f")),
    ("cost $", True, lambda r: _fmt(r.cost_usd, ",.2f")),
)


def render_comparison(rows: Sequence[ComparisonRow]) -> str:
    """A plain-text table, one line per row under a header, columns separated by two spaces;
    '-' for a value that is undefined (None). Ends with a newline."""
    cells = [[header for header, _, _ in _COLUMNS]] + [[cell(r) for _, _, cell in _COLUMNS] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(_COLUMNS))]
    lines = [
        "  ".join(c.rjust(w) if right else c.ljust(w) for c, w, (_, right, _) in zip(line, widths, _COLUMNS)).rstrip()
        for line in cells
    ]
    return "\n".join(lines) + "\n"


def _hours(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / SECONDS_PER_HOUR


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
