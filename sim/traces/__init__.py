"""Job traces: read and write Gavel's formats and JSON Lines, generate Gavel-distributed traces.

    job.py        TraceJob (one job, validated), to_job_spec
    formats.py    text <-> jobs: Gavel's 10 columns, its older 7 (Philly-derived), JSON Lines (pure)
    files.py      read_trace / write_trace: the format from the extension and first line
    templates.py  the job catalog (command, working directory, ...) per job type, as data
    generator.py  generate_trace: Gavel's job distribution and arrival process, seeded
    summary.py    summarize_trace: counts, arrival span, GPU-hours
"""

from sim.traces.files import input_format, output_format, read_trace, read_trace_text, write_trace
from sim.traces.formats import (
    GAVEL_COLUMNS,
    PHILLY_COLUMNS,
    TraceFormat,
    detect_format,
    format_gavel_trace,
    format_jsonl_trace,
    format_trace,
    parse_trace,
    renumbered,
)
from sim.traces.generator import GAVEL_MIX, JobMix, TraceSpec, TraceStreams, generate_trace
from sim.traces.job import TraceJob, to_job_spec
from sim.traces.summary import TraceSummary, summarize_trace
from sim.traces.templates import JOB_TEMPLATES, TEMPLATES_BY_TYPE, JobTemplate

__all__ = [
    "GAVEL_COLUMNS",
    "GAVEL_MIX",
    "JOB_TEMPLATES",
    "PHILLY_COLUMNS",
    "TEMPLATES_BY_TYPE",
    "JobMix",
    "JobTemplate",
    "TraceFormat",
    "TraceJob",
    "TraceSpec",
    "TraceStreams",
    "TraceSummary",
    "detect_format",
    "format_gavel_trace",
    "format_jsonl_trace",
    "format_trace",
    "generate_trace",
    "input_format",
    "output_format",
    "parse_trace",
    "read_trace",
    "read_trace_text",
    "renumbered",
    "summarize_trace",
    "to_job_spec",
    "write_trace",
]
