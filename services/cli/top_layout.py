"""The frame `gavel top` draws, as lines of text for a terminal of a given size. Pure: the answers
of the mechanism's status queries in, lines out (services/cli/top_cmd.py asks and draws).

Three parts: the GPUs per type (busy, idle, lost), the jobs running and waiting (where, their
share of the allocation, how far, when they should finish, why they wait), and the last events.
No line is wider than the terminal and nothing wraps: a table drops its least needed columns
first as the terminal narrows (each column has a priority), then squeezes the free-text ones,
cutting a cell with a mark rather than a line at the edge; a wide terminal gives every column
its full width. The terminal's height bounds the job rows and the events (the rest is counted).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from services.cli.watching import event_line

if TYPE_CHECKING:
    from services.cli.times import ClockView

GAP = "  "
RUNNING = ("running",)
WAITING = ("retrying", "cancelling", "queued", "admission", "held", "submitted")  # in the order shown


@dataclass(frozen=True, slots=True)
class Line:
    text: str
    style: str = ""  # "title", "heading" (a table's column names), "section", "dim"


@dataclass(frozen=True, slots=True)
class Column:
    title: str
    min_width: int  # the narrowest it is squeezed to (its cells cut with the mark)
    max_width: int  # the widest it grows to
    priority: int  # lower: kept longer as the terminal narrows
    right: bool = False
    keep_end: bool = False  # cut at the start: ids share their starts (a trace's), their ends tell them apart


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one frame shows: the mechanism's answers (``cluster``, ``jobs``, ``workers``,
    ``shares``, ``events``), as they came, and its clock."""

    cluster: Mapping[str, object] = field(default_factory=dict)
    jobs: Sequence[Mapping[str, object]] = ()
    workers: Sequence[Mapping[str, object]] = ()
    shares: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    events: Sequence[Mapping[str, object]] = ()
    clock: ClockView | None = None
    error: str = ""  # the last refresh failed: why (the frame shows the last answers it had)


def cut(text: str, width: int, mark: str = "…", *, keep_end: bool = False) -> str:
    """``text`` in at most ``width`` characters, its end (its start, ``keep_end``) replaced by
    ``mark`` when it is cut."""
    if len(text) <= width:
        return text
    if width <= len(mark):
        return text[-width:] if keep_end else text[:width]
    return mark + text[len(text) - width + len(mark) :] if keep_end else text[: width - len(mark)] + mark


def fit(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> list[int | None]:
    """Each column's width, None for a column dropped: the columns by priority while their
    narrowest widths fit, then the room left to each in priority order, up to its cells' width."""
    natural = [
        max(c.min_width if not rows else 0, min(c.max_width, max([len(c.title), *(len(r[i]) for r in rows)])))
        for i, c in enumerate(columns)
    ]
    narrowest = [min(n, max(c.min_width, len(c.title))) for n, c in zip(natural, columns, strict=True)]
    order = sorted(range(len(columns)), key=lambda i: (columns[i].priority, i))
    chosen: list[int] = []
    used = 0
    for i in order:  # strictly by priority: a column that does not fit drops all after it
        extra = narrowest[i] + (len(GAP) if chosen else 0)
        if used + extra > width:
            break
        chosen.append(i)
        used += extra
    widths: list[int | None] = [None] * len(columns)
    for i in chosen:
        widths[i] = narrowest[i]
    room = width - used
    for i in sorted(chosen, key=lambda i: (columns[i].priority, i)):
        grow = min(room, natural[i] - narrowest[i])
        widths[i] = narrowest[i] + grow  # type: ignore[operator]
        room -= grow
    return widths


def table(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int, mark: str = "…") -> list[Line]:
    """The column names and the rows, in the columns' order, those that fit ``width``."""
    widths = fit(columns, rows, width)
    shown = [(c, w) for c, w in zip(columns, widths, strict=True) if w is not None]
    kept = [i for i, w in enumerate(widths) if w is not None]

    def render(cells: Sequence[str]) -> str:
        parts = []
        for (column, w), text in zip(shown, cells, strict=True):
            text = cut(text, w, mark, keep_end=column.keep_end)
            parts.append(text.rjust(w) if column.right else text.ljust(w))
        return GAP.join(parts).rstrip()

    return [Line(render([c.title for c, _ in shown]), "heading")] + [Line(render([row[i] for i in kept])) for row in rows]


# -- the parts ------------------------------------------------------------------------------------

GPU_COLUMNS = (
    Column("type", 4, 16, 0),
    Column("GPUs", 4, 6, 1, right=True),
    Column("busy", 4, 6, 0, right=True),
    Column("idle", 4, 6, 0, right=True),
    Column("lost", 4, 6, 1, right=True),
    Column("use", 10, 50, 3),
)

# States and times are never cut (their narrowest is their widest): a column of them goes whole or
# not at all; an id longer than 16 loses its start (a trace's ids share theirs); the free text (the
# reason, the shares by type, the job type) is squeezed.
JOB_COLUMNS = (
    Column("id", 16, 40, 0, keep_end=True),
    Column("state", 10, 10, 0),
    Column("on", 10, 10, 1),
    Column("share", 5, 5, 2, right=True),
    Column("ETA", 16, 16, 3),
    Column("done", 4, 4, 4, right=True),
    Column("why", 18, 200, 5),  # before the columns after it: a reason cut at 10 says nothing
    Column("share by type", 20, 36, 6),  # whole or not at all, nearly: "k80 0.25, v1…" says little
    Column("type", 10, 32, 7),
)


def gpu_rows(cluster: Mapping[str, object], workers: Sequence[Mapping[str, object]], bar_width: int = 20) -> list[list[str]]:
    capacity = _ints(cluster.get("capacity_gpus"))
    busy = _ints(cluster.get("in_use_gpus"))
    lost: dict[str, int] = {}
    for w in workers:
        if w.get("state") == "lost" and w.get("accelerator_type"):
            lost[str(w["accelerator_type"])] = lost.get(str(w["accelerator_type"]), 0) + int(w.get("gpus") or 0)  # type: ignore[call-overload]
    rows = []
    for kind in sorted({*capacity, *busy, *lost}):
        total, used = capacity.get(kind, 0), busy.get(kind, 0)
        filled = round(bar_width * used / total) if total else 0
        rows.append([
            kind, str(total), str(used), str(max(0, total - used)), str(lost.get(kind, 0)),
            "#" * filled + "." * (bar_width - filled) if total else "",
        ])
    return rows


def job_rows(
    jobs: Sequence[Mapping[str, object]], shares: Mapping[str, Mapping[str, float]], clock: ClockView | None,
) -> list[list[str]]:
    """The jobs running, then those waiting (in WAITING's order), each by id (its numbers as
    numbers: a trace's ``.../2`` before ``.../10``)."""
    order = {state: k for k, state in enumerate(RUNNING + WAITING)}
    active = sorted((j for j in jobs if j.get("state") in order), key=lambda j: (order[str(j["state"])], _natural(str(j["id"]))))
    rows = []
    for job in active:
        mine = shares.get(str(job["id"]), {})
        total = sum(mine.values())
        done, steps = job.get("steps_done"), job.get("steps_total")
        code, reason = str(job.get("reason_code") or ""), str(job.get("reason") or "")
        why = f"{code}: {reason}" if code and reason and code != "Running" else (reason or ("" if code == "Running" else code))
        rows.append([
            str(job["id"]), str(job["state"]), str(job.get("accelerator_type") or "-"),
            f"{total:.2f}" if mine else "-",
            _eta(job.get("eta_s"), clock),
            f"{100 * int(done) / int(steps):.0f}%" if isinstance(done, int) and isinstance(steps, int) and steps else "-",  # type: ignore[call-overload]
            why or "-",
            ", ".join(f"{kind} {share:.2f}" for kind, share in sorted(mine.items())) or "-",
            str(job.get("type") or "-"),
        ])  # in JOB_COLUMNS' order
    return rows


def _natural(text: str) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", text) if part)


def _eta(eta_s: object, clock: ClockView | None) -> str:
    if not isinstance(eta_s, (int, float)) or clock is None:
        return "-"
    return clock.until(float(eta_s))


def _ints(value: object) -> dict[str, int]:
    return {str(k): int(v) for k, v in value.items()} if isinstance(value, Mapping) else {}  # type: ignore[call-overload]


def header(s: Snapshot, counts: Mapping[str, int]) -> list[str]:
    """The title's pieces, most needed first (a narrow terminal drops them from the end)."""
    from services.cli.watching import stamp

    cluster = s.cluster
    pieces = ["gavel top"]
    if "time_s" in cluster:
        pieces.append(stamp(float(cluster["time_s"]), s.clock, short=True))  # type: ignore[arg-type]
    if cluster.get("rounds"):  # how many were dispatched: the one running is the last
        pieces.append(f"round {int(cluster['rounds']) - 1}")  # type: ignore[call-overload]
    pieces += [f"{counts['running']} running", f"{counts['waiting']} waiting"]
    if "policy" in cluster:
        pieces.append(f"policy {cluster['policy']}")
    allocation = cluster.get("allocation")
    if isinstance(allocation, Mapping) and allocation.get("state") == "degraded":
        pieces.insert(2, "DEGRADED: the policy does not answer")
    for key, label in (("jobs_completed", "completed"), ("jobs_failed", "failed")):
        if cluster.get(key):
            pieces.append(f"{cluster[key]} {label}")
    return pieces


def frame(s: Snapshot, width: int, height: int | None = None, mark: str = "…") -> list[Line]:
    """The whole frame for a terminal ``width`` x ``height`` (None: as long as it takes, for a
    pipe): never a line wider than ``width``, never more than ``height`` lines."""
    width = max(20, width)
    jobs = job_rows(s.jobs, s.shares, s.clock)
    counts = {"running": sum(r[1] == "running" for r in jobs), "waiting": sum(r[1] != "running" for r in jobs)}
    pieces = header(s, counts)
    title = pieces[0]
    for piece in pieces[1:]:
        if len(title) + 3 + len(piece) > width:
            break
        title += " · " + piece if mark == "…" else " - " + piece
    lines = [Line(title, "title")]
    if s.error:
        lines.append(Line(cut(f"(the last refresh failed: {s.error})", width, mark), "dim"))

    gpus = gpu_rows(s.cluster, s.workers, bar_width=max(10, min(50, width - 50)))
    lines += [Line(""), Line("GPUs", "section")]
    lines += table(GPU_COLUMNS, gpus, width, mark) if gpus else [Line("no workers yet", "dim")]

    events = list(s.events)
    jobs_title = Line(cut(f"Jobs: {counts['running']} running, {counts['waiting']} waiting", width, mark), "section")
    events_title = Line("Events", "section")
    job_lines = table(JOB_COLUMNS, jobs, width, mark) if jobs else [Line("no job running or waiting", "dim")]
    event_lines = [Line(cut(event_line(e, s.clock, short=True), width, mark)) for e in events] or [Line("none yet", "dim")]
    if height is not None:
        # what is left below the GPUs: a blank and a title each for jobs and events
        room = max(0, height - len(lines) - 4)
        events_room = min(len(event_lines), max(3, room // 3))
        jobs_room = max(0, room - events_room)
        if len(job_lines) > jobs_room:
            more = len(job_lines) - max(1, jobs_room - 1)
            job_lines = job_lines[: max(1, jobs_room - 1)] + [Line(cut(f"... and {more} more (gavel jobs)", width, mark), "dim")]
            job_lines = job_lines[:jobs_room]
        events_room = min(len(event_lines), room - len(job_lines))
        event_lines = event_lines[len(event_lines) - max(0, events_room):] if events_room > 0 else []
    lines += [Line(""), jobs_title, *job_lines, Line(""), events_title, *event_lines]
    if height is not None:
        lines = lines[:height]
    return lines
