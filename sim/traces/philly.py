"""Gavel's Philly-derived traces, one per virtual cluster of Microsoft's Philly cluster, shipped
with the simulator (``gavel simulate --trace philly:VC[:SEED]``).

Data, not logic: ``philly/seed=N/<vc>.trace.gz`` are Gavel's ``traces/msr/seed=N/<vc>.trace``
compressed (figures only, MIT licence; tests/data/gavel/README.md): arrival times and GPU counts
from Philly (Aug-Dec 2017), job types and steps assigned by Gavel with seed N, in Gavel's older
7-column format (sim/traces/formats.py reads it; a 10-column file of the same jobs reads the same).
Large virtual clusters were capped at 2,000 jobs. The clusters Gavel ran them on are its
``cluster_specs.json`` (500 V100s) and ``cluster_specs_heterogeneous.json`` (300 of each type).

Gavel gave the gangs job types without regard to the sizes its throughput table has (a 4-GPU
Recommendation job; gangs of 12 to 64 GPUs), so 13 of the 15 traces have jobs the table cannot
size: ``sized_table`` adds their figures by the simulated fleets' stated rule for a size a table
lacks (sim/derived_rates.py), and a run of a Philly trace uses it.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable
from importlib import resources
from types import MappingProxyType

from common.errors import TraceError
from common.throughputs import ThroughputTable
from sim.derived_rates import TableReference, reference_rate
from sim.traces.formats import TraceFormat, parse_trace
from sim.traces.job import TraceJob

PREFIX = "philly:"  # gavel simulate --trace philly:VC[:SEED]

VIRTUAL_CLUSTERS = (
    "0e4a51", "103959", "11cb48", "23dbec", "2869ce", "51b7ef", "6214e9", "6c71a0", "795a4c", "7f04ca", "925e2b",
    "b436b2", "e13805", "ed69ec", "ee9e8c",
)
SEEDS = (0, 1)  # the seeds Gavel assigned job types with
# Gavel's cluster specs for these traces, as v100:p100:k80
CLUSTERS = MappingProxyType({"homogeneous": "500:0:0", "heterogeneous": "300:300:300"})


def philly_trace(virtual_cluster: str, seed: int = 0) -> tuple[TraceJob, ...]:
    """The jobs of one virtual cluster's trace, ids 0, 1, ... in file order."""
    philly_trace_check(virtual_cluster, seed)
    name = f"seed={seed}/{virtual_cluster}.trace.gz"
    data = resources.files("sim.traces").joinpath("philly", name).read_bytes()
    return parse_trace(gzip.decompress(data).decode("utf-8"), source=f"philly {name}", trace_format=TraceFormat.PHILLY)


def parse_name(text: str) -> tuple[str, int] | None:
    """``philly:VC`` or ``philly:VC:SEED`` -> (virtual cluster, seed); None for any other text (a
    file's path). Raises TraceError for a philly name that names no shipped trace."""
    if not text.startswith(PREFIX):
        return None
    vc, _, seed_text = text[len(PREFIX):].partition(":")
    if seed_text and not seed_text.isdigit():
        raise TraceError(f"{text}: expected philly:VC or philly:VC:SEED, and {seed_text!r} is not a seed")
    seed = int(seed_text) if seed_text else 0
    philly_trace_check(vc, seed)
    return vc, seed


def philly_trace_check(virtual_cluster: str, seed: int) -> None:
    if virtual_cluster not in VIRTUAL_CLUSTERS:
        raise TraceError(f"unknown virtual cluster {virtual_cluster!r} (known: {', '.join(VIRTUAL_CLUSTERS)})")
    if seed not in SEEDS:
        raise TraceError(f"no trace with seed {seed} (Gavel published seeds {', '.join(map(str, SEEDS))})")


def sized_table(table: ThroughputTable, jobs: Iterable[TraceJob]) -> ThroughputTable:
    """The table with a figure for every (job type, scale factor) of ``jobs`` on every accelerator
    type: the table's own where it has one, else the simulated fleets' stated rule for a size a
    table lacks (sim/derived_rates.py: the type's figure at its nearest size there, times the size
    ratio to the 0.75). Gavel assigned job types to Philly's gangs without regard to the sizes its
    table has (a 4-GPU Recommendation job), so most virtual clusters need it; such jobs are never
    packed (the table has no pair of theirs)."""
    reference = TableReference(table)
    missing = sorted({(j.job_type, j.scale_factor) for j in jobs} - table.job_keys)
    if not missing:
        return table
    isolated = dict(table.isolated_steps_per_s)
    for job_type, scale_factor in missing:
        for w in table.accelerator_types:
            isolated[(job_type, scale_factor, w)] = reference_rate(reference, job_type, scale_factor, w)
    return ThroughputTable(table.accelerator_types, MappingProxyType(isolated), table.pair_steps_per_s)
