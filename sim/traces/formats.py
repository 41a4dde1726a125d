"""Trace text <-> TraceJobs, for Gavel's 10-column format, its older 7-column one and JSON Lines.

Pure: text in, jobs out (and back). File I/O is in ``sim.traces.files``.

- ``GAVEL`` (``.trace``): one job a line, 10 tab-separated columns (GAVEL_COLUMNS). Job ids are
  implicit: 0, 1, 2, ... in file order. SLO -1 (any negative, as Gavel reads it) means none; any
  other SLO is read and written as seconds after arrival. (Gavel's own writer puts its SLO *factor*
  there, 1.2 / 2 / 10 x the job's duration, which no trace records; no published trace has one.)
- ``PHILLY``: Gavel's older 7-column order (PHILLY_COLUMNS), used by the Philly-derived traces in
  data/gavel/traces/msr. No working directory (the command ``cd``s itself), no priority, no SLO.
- ``JSONL`` (``.jsonl``): one JSON object a line; the fields of TraceJob. ``job_type``,
  ``total_steps`` and ``arrival_time_s`` are required, the rest default. Gavel's reference files
  (data/gavel-reference/*.jsonl) write ids as numbers and the SLO as ``"SLO"``; both are read.
  Unknown fields (``isolated_throughput_steps_per_s``, ...) are ignored, as the codec does.

Blank lines are skipped; line numbers in errors are the file's physical lines. Every malformed line
raises TraceError naming the source, the line and the column (or JSON field).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from common.errors import TraceError
from sim.traces.job import TraceJob


class TraceFormat(enum.Enum):
    GAVEL = "gavel 10-column"
    PHILLY = "philly 7-column"
    JSONL = "jsonl"


GAVEL_COLUMNS = (
    "job_type",
    "command",
    "working_directory",
    "num_steps_arg",
    "needs_data_dir",
    "total_steps",
    "scale_factor",
    "priority_weight",
    "SLO",
    "arrival_time",
)
PHILLY_COLUMNS = ("job_type", "command", "num_steps_arg", "needs_data_dir", "total_steps", "arrival_time", "scale_factor")
_COLUMNS = {TraceFormat.GAVEL: GAVEL_COLUMNS, TraceFormat.PHILLY: PHILLY_COLUMNS}
# TraceJob's field -> the column that holds it (the names differ only where Gavel's lack units).
_COLUMN_OF_FIELD = {"slo_s": "SLO", "arrival_time_s": "arrival_time"}

_INTEGER = re.compile(r"[+-]?[0-9]+")
_CANONICAL_ID = re.compile(r"0|[1-9][0-9]*")


# -- reading ---------------------------------------------------------------------------------


def _lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) for every non-blank line. Split on "\\n" only: str.splitlines would
    also split on form feeds and other separators a command could contain."""
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if line.strip():
            yield number, line


def detect_format(text: str, *, source: str = "<string>") -> TraceFormat | None:
    """The format of trace text, from its first non-blank line; None when it holds no job."""
    for number, line in _lines(text):
        if line.lstrip().startswith("{"):
            return TraceFormat.JSONL
        count = line.count("\t") + 1
        for trace_format, columns in _COLUMNS.items():
            if count == len(columns):
                return trace_format
        raise TraceError(
            f"expected 10 tab-separated columns (Gavel's format), 7 (its older Philly-derived one) "
            f"or a JSON object, got {count} column{'s' if count != 1 else ''}",
            source=source,
            line=number,
        )
    return None


def parse_trace(text: str, *, source: str = "<string>", trace_format: TraceFormat | None = None) -> tuple[TraceJob, ...]:
    """Jobs of a trace, in file order. ``trace_format`` None: detected from the first line."""
    trace_format = trace_format or detect_format(text, source=source)
    if trace_format is None:
        return ()
    if trace_format is TraceFormat.JSONL:
        return _parse_jsonl(text, source)
    return _parse_columns(text, source, trace_format)


def _parse_columns(text: str, source: str, trace_format: TraceFormat) -> tuple[TraceJob, ...]:
    columns = _COLUMNS[trace_format]
    jobs: list[TraceJob] = []
    for number, line in _lines(text):
        cells = line.split("\t")
        if len(cells) != len(columns):
            raise TraceError(
                f"expected {len(columns)} tab-separated columns ({trace_format.value}), got {len(cells)}",
                source=source,
                line=number,
            )
        row = dict(zip(columns, cells, strict=True))
        try:
            jobs.append(_job_from_row(row, job_id=str(len(jobs))))
        except TraceError as e:
            name = _COLUMN_OF_FIELD.get(e.column or "", e.column or "")
            label = f"column {columns.index(name) + 1} ({name})" if name in columns else e.column
            raise TraceError(e.reason, source=source, line=number, column=label) from None
    return tuple(jobs)


def _job_from_row(row: Mapping[str, str], job_id: str) -> TraceJob:
    slo = _float_cell(row, "SLO") if "SLO" in row else -1.0
    return TraceJob(
        job_id=job_id,
        job_type=row["job_type"],
        total_steps=_int_cell(row, "total_steps"),
        scale_factor=_int_cell(row, "scale_factor"),
        arrival_time_s=_float_cell(row, "arrival_time"),
        priority_weight=_float_cell(row, "priority_weight") if "priority_weight" in row else 1.0,
        slo_s=None if slo < 0 else slo,  # Gavel writes -1 for "no SLO", and reads any negative as none
        command=row["command"],
        working_directory=row.get("working_directory", ""),
        num_steps_arg=row["num_steps_arg"],
        needs_data_dir=_flag_cell(row, "needs_data_dir"),
    )


def _int_cell(row: Mapping[str, str], name: str) -> int:
    text = row[name].strip()
    if not _INTEGER.fullmatch(text):
        raise TraceError(f"expected an integer, got {row[name]!r}", column=name)
    return int(text)


def _float_cell(row: Mapping[str, str], name: str) -> float:
    try:
        return float(row[name])
    except ValueError:
        raise TraceError(f"expected a number, got {row[name]!r}", column=name) from None


def _flag_cell(row: Mapping[str, str], name: str) -> bool:
    text = row[name].strip()
    if text not in ("0", "1"):
        raise TraceError(f"expected 0 or 1, got {row[name]!r}", column=name)
    return text == "1"


def _parse_jsonl(text: str, source: str) -> tuple[TraceJob, ...]:
    jobs: list[TraceJob] = []
    first_line_of_id: dict[str, int] = {}
    for number, line in _lines(text):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(f"not JSON: {e.msg}", source=source, line=number, column=f"column {e.colno}") from None
        if not isinstance(obj, dict):
            raise TraceError(f"expected a JSON object, got {type(obj).__name__}", source=source, line=number)
        try:
            job = _job_from_json(obj, default_id=str(len(jobs)))
        except TraceError as e:
            field = "SLO" if e.column == "slo_s" and "slo_s" not in obj else e.column
            raise TraceError(e.reason, source=source, line=number, column=f"field {field}") from None
        if job.job_id in first_line_of_id:
            raise TraceError(
                f"duplicate job id {job.job_id!r} (first on line {first_line_of_id[job.job_id]})",
                source=source,
                line=number,
                column="field job_id",
            )
        first_line_of_id[job.job_id] = number
        jobs.append(job)
    return tuple(jobs)


_REQUIRED: Any = object()


def _json_value(obj: Mapping[str, Any], name: str, kinds: tuple[type, ...], what: str, default: Any = _REQUIRED) -> Any:
    if name not in obj:
        if default is _REQUIRED:
            raise TraceError("missing", column=name)
        return default
    value = obj[name]
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise TraceError(f"expected {what}, got {json.dumps(value)}", column=name)
    return value


def _json_int(obj: Mapping[str, Any], name: str, default: Any = _REQUIRED) -> int:
    value = _json_value(obj, name, (int, float), "an integer", default)
    if isinstance(value, float):
        if not value.is_integer():
            raise TraceError(f"expected an integer, got {value!r}", column=name)
        value = int(value)
    return value


def _job_from_json(obj: Mapping[str, Any], default_id: str) -> TraceJob:
    job_id = _json_value(obj, "job_id", (int, str), "a string or an integer", default_id)
    if "slo_s" in obj and "SLO" in obj and obj["slo_s"] != obj["SLO"]:
        raise TraceError(f"SLO {json.dumps(obj['SLO'])} and slo_s {json.dumps(obj['slo_s'])} disagree", column="slo_s")
    if "slo_s" in obj:
        slo_s = _json_value(obj, "slo_s", (int, float, type(None)), "a number of seconds or null")
    else:
        slo_s = _json_value(obj, "SLO", (int, float, type(None)), "a number of seconds, -1 or null", None)
        slo_s = None if slo_s is not None and slo_s < 0 else slo_s  # Gavel's -1: no SLO
    needs_data_dir = _json_value(obj, "needs_data_dir", (bool, int), "true or false", False)
    if needs_data_dir not in (True, False):  # 0 and 1 pass (== False / True), other numbers do not
        raise TraceError(f"expected true or false, got {json.dumps(needs_data_dir)}", column="needs_data_dir")
    return TraceJob(
        job_id=str(job_id),
        job_type=_json_value(obj, "job_type", (str,), "a string"),
        total_steps=_json_int(obj, "total_steps"),
        scale_factor=_json_int(obj, "scale_factor", 1),
        arrival_time_s=_json_value(obj, "arrival_time_s", (int, float), "a number of seconds"),
        priority_weight=_json_value(obj, "priority_weight", (int, float), "a number", 1.0),
        slo_s=slo_s,
        command=_json_value(obj, "command", (str,), "a string", ""),
        working_directory=_json_value(obj, "working_directory", (str,), "a string", ""),
        num_steps_arg=_json_value(obj, "num_steps_arg", (str,), "a string", ""),
        needs_data_dir=bool(needs_data_dir),
        entity=_json_value(obj, "entity", (str, type(None)), "a string or null", None),
    )


# -- writing ---------------------------------------------------------------------------------


def format_trace(jobs: Iterable[TraceJob], trace_format: TraceFormat) -> str:
    if trace_format is TraceFormat.GAVEL:
        return format_gavel_trace(jobs)
    if trace_format is TraceFormat.JSONL:
        return format_jsonl_trace(jobs)
    raise TraceError(f"writing the {trace_format.value} format is not supported: write Gavel's 10 columns or JSON Lines")


def format_gavel_trace(jobs: Iterable[TraceJob]) -> str:
    """Gavel's 10-column text, as Gavel writes it (``%d`` integers, ``%f`` times and SLO), except
    that a value ``%f`` would round is written in full, so reading it back gives the same jobs.

    The format has no id column, so the ids must already be 0, 1, 2, ... in order (see
    ``renumbered``); anything else would be lost silently.
    """
    lines = []
    for position, job in enumerate(jobs):
        if job.job_id != str(position):
            raise TraceError(
                f"job {job.job_id!r} is at position {position}: Gavel's 10-column format has no id column, so ids "
                "must be 0, 1, 2, ... in file order (renumber the jobs to write it)"
            )
        for name in ("job_type", "command", "working_directory", "num_steps_arg"):
            if any(c in getattr(job, name) for c in "\t\r\n"):
                raise TraceError(f"job {job.job_id!r}: {name} holds a tab or a line break, which the 10-column format cannot")
        cells = (
            job.job_type,
            job.command,
            job.working_directory,
            job.num_steps_arg,
            "1" if job.needs_data_dir else "0",
            str(job.total_steps),
            str(job.scale_factor),
            _weight_text(job.priority_weight),
            "-1.000000" if job.slo_s is None else _seconds_text(job.slo_s),
            _seconds_text(job.arrival_time_s),
        )
        lines.append("\t".join(cells) + "\n")
    return "".join(lines)


def _seconds_text(value: float) -> str:
    text = f"{value:f}"
    return text if float(text) == value else repr(float(value))


def _weight_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def format_jsonl_trace(jobs: Iterable[TraceJob]) -> str:
    """JSON Lines with TraceJob's fields. Ids like "12" are written as numbers, as in Gavel's
    reference files; the reader turns them back into strings."""
    return "".join(json.dumps(_job_to_json(job), allow_nan=False) + "\n" for job in jobs)


def _job_to_json(job: TraceJob) -> dict[str, Any]:
    entity = {} if job.entity is None else {"entity": job.entity}  # a file without entities stays as it was
    return {
        "job_id": int(job.job_id) if _CANONICAL_ID.fullmatch(job.job_id) else job.job_id,
        "arrival_time_s": float(job.arrival_time_s),
        "job_type": job.job_type,
        "command": job.command,
        "working_directory": job.working_directory,
        "num_steps_arg": job.num_steps_arg,
        "needs_data_dir": job.needs_data_dir,
        "total_steps": job.total_steps,
        "scale_factor": job.scale_factor,
        "priority_weight": float(job.priority_weight),
        "slo_s": None if job.slo_s is None else float(job.slo_s),
        **entity,
    }


def renumbered(jobs: Iterable[TraceJob]) -> tuple[TraceJob, ...]:
    """The same jobs with ids 0, 1, 2, ... in order (what the 10-column format implies)."""
    return tuple(dataclasses.replace(job, job_id=str(i)) for i, job in enumerate(jobs))
