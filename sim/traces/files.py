"""Trace files: the format from the extension (and, for reading, the first line), then formats.py.

Every failure, I/O included, is a TraceError naming the file, so a command prints one line.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterable

from common.errors import TraceError
from sim.traces.formats import TraceFormat, detect_format, format_trace, parse_trace
from sim.traces.job import TraceJob

# What each extension is written as. Reading also detects the format from the first line, so a
# 7-column file named .trace (Gavel's msr traces) reads as what it is.
OUTPUT_FORMATS = {".trace": TraceFormat.GAVEL, ".jsonl": TraceFormat.JSONL}


def read_trace_text(path: str | os.PathLike[str]) -> str:
    try:
        return pathlib.Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(f"not UTF-8 text (byte {e.start}: {e.reason})", source=str(path)) from None
    except OSError as e:
        raise TraceError(f"cannot read: {e.strerror or e}", source=str(path)) from None


def input_format(path: str | os.PathLike[str], text: str) -> TraceFormat | None:
    """``.jsonl`` is JSON Lines; anything else by its first line. None: no job in the file."""
    if pathlib.Path(path).suffix == ".jsonl":
        return TraceFormat.JSONL
    return detect_format(text, source=str(path))


def read_trace(path: str | os.PathLike[str]) -> tuple[TraceJob, ...]:
    """The jobs of a trace file in any of the three formats, in file order."""
    text = read_trace_text(path)
    return parse_trace(text, source=str(path), trace_format=input_format(path, text))


def output_format(path: str | os.PathLike[str]) -> TraceFormat:
    suffix = pathlib.Path(path).suffix
    if suffix not in OUTPUT_FORMATS:
        raise TraceError(
            f"cannot tell the format from the extension {suffix or '(none)'!r}: "
            "use .trace (Gavel's 10 columns) or .jsonl (JSON Lines)",
            source=str(path),
        )
    return OUTPUT_FORMATS[suffix]


def write_trace(jobs: Iterable[TraceJob], path: str | os.PathLike[str]) -> TraceFormat:
    """Write the jobs in the format the extension names; returns that format."""
    trace_format = output_format(path)
    try:
        text = format_trace(jobs, trace_format)  # before opening: a refused trace leaves no file behind
    except TraceError as e:
        raise TraceError(e.reason, source=str(path)) from None
    try:
        pathlib.Path(path).write_text(text, encoding="utf-8")
    except OSError as e:
        raise TraceError(f"cannot write: {e.strerror or e}", source=str(path)) from None
    return trace_format
