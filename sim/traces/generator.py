"""Synthetic traces with Gavel's job distribution (issue 4, item 4; Gavel's scheduler/utils.py
``generate_job`` and the arrival process of its simulator, reproduced from their behaviour).

Per job, from the job stream, in this order:
1. a scale factor: 1/2/4/8 with probability 70/10/15/5 % (Gavel's Philly-derived mix). Drawn even
   when multi-GPU jobs are off, and then replaced by 1, as Gavel does, so that switching
   ``multi_gpu`` keeps every job's run time;
2. a run time on the reference accelerator (V100): 60 x 10^U(1.5, 3) s with probability 0.8, else
   60 x 10^U(3, 4) s, i.e. 0.5 to 16.7 hours on a log scale for 80 % of the jobs and 16.7 hours to a
   week for the rest;
3. a job type, uniform over the templates the throughput table knows with scale factor 1. For a
   scale factor s > 1 the draw is repeated until the type has a throughput with s in the table:
   that is uniform over the types that have s (for Gavel's table the 19 ResNet-18/50, Transformer
   and LM variants) and is exactly Gavel's rejection loop over its "distributed" templates, so the
   random stream stays Gavel's;
4. total steps = int(run time x the type's isolated throughput with that scale factor on the
   reference type) (Gavel truncates when it writes ``%d``);
5. with priority weights on: weight 5 with probability 0.2, else 1.

With a fixed run time (Gavel's ``--fixed-job-duration``), step 2 draws nothing and every job
runs that long on the reference type: the later draws then come earlier in the stream, as in Gavel.

From the SLO stream (with SLOs on): a factor 1.2 / 2 / 10 with probability 0.33 / 0.34 / 0.33; the
SLO is factor x run time, in seconds after arrival (Gavel: deadline = arrival + factor x duration).
From the arrival stream: the first job at t = 0, then exponential gaps of mean 3600 / rate s
(Poisson arrivals), or every job at t = 0 for a static trace (no draws). Arrival times are kept to
the microsecond, the resolution of Gavel's trace files.

A steady-state start (Gavel's ``--simulate-steady-state``) puts, before those, as many jobs as the
cluster has GPUs at t = 0: for each accelerator type in Gavel's (sorted) order, jobs are drawn
until their scale factors add up to at least its GPUs. They take no arrival draw, count among
``num_jobs`` and take the first ids, so the cluster starts full instead of empty and a window of
later jobs measures a loaded cluster from its first arrival.

Three streams, not one: turning SLOs on or changing the rate leaves the jobs themselves unchanged,
so runs at several rates compare the same jobs. ``TraceStreams.gavel(seed)`` builds them as Gavel
seeds its generators; the draws above then consume them exactly as Gavel does, and the trace is
Gavel's trace for that seed, job for job (tests/sim checks this on the reference traces).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from common.errors import TraceError
from common.throughputs import ThroughputTable
from sim.traces.job import TraceJob
from sim.traces.templates import JOB_TEMPLATES, JobTemplate


@dataclass(frozen=True, slots=True)
class JobMix:
    """Gavel's job distribution as data. Weights are (value, probability) in draw order."""

    scale_factor_weights: tuple[tuple[int, float], ...] = ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05))
    short_job_probability: float = 0.8
    short_run_time_log10_min: tuple[float, float] = (1.5, 3.0)  # run time = 10^U(lo, hi) minutes
    long_run_time_log10_min: tuple[float, float] = (3.0, 4.0)
    high_priority_probability: float = 0.2
    high_priority_weight: float = 5.0
    slo_factor_weights: tuple[tuple[float, float], ...] = ((1.2, 0.33), (2.0, 0.34), (10.0, 0.33))


GAVEL_MIX = JobMix()


@dataclass(frozen=True, slots=True)
class TraceSpec:
    """What to generate. ``jobs_per_hour`` None: a static trace (every job arrives at t = 0)."""

    num_jobs: int
    jobs_per_hour: float | None = None
    multi_gpu: bool = False
    priority_weights: bool = False
    slos: bool = False
    reference_accelerator_type: str = "v100"
    mix: JobMix = GAVEL_MIX
    fixed_run_time_s: float | None = None  # every job's run time on the reference type (None: drawn)
    steady_state_gpus: tuple[int, ...] = ()  # GPUs per type, in sorted type order: jobs at t = 0 to fill them

    def __post_init__(self) -> None:
        if isinstance(self.num_jobs, bool) or not isinstance(self.num_jobs, int) or self.num_jobs < 1:
            raise TraceError(f"expected an integer >= 1, got {self.num_jobs!r}", column="num_jobs")
        rate = self.jobs_per_hour
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < math.inf):
            raise TraceError(f"expected a finite number > 0 (or none for a static trace), got {rate!r}", column="jobs_per_hour")
        fixed = self.fixed_run_time_s
        if fixed is not None and (isinstance(fixed, bool) or not isinstance(fixed, (int, float)) or not 0 < fixed < math.inf):
            raise TraceError(f"expected a finite number of seconds > 0, got {fixed!r}", column="fixed_run_time_s")
        if any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in self.steady_state_gpus):
            raise TraceError(f"expected GPU counts >= 0, got {self.steady_state_gpus!r}", column="steady_state_gpus")


@dataclass(frozen=True, slots=True)
class TraceStreams:
    """The generator's randomness: independent numpy Generators for jobs, arrivals and SLOs."""

    jobs: np.random.Generator
    arrivals: np.random.Generator
    slos: np.random.Generator

    @classmethod
    def gavel(cls, seed: int) -> TraceStreams:
        """Streams that draw what Gavel's generators draw for ``seed``: Gavel seeds Python's
        Mersenne Twister with seed + 2 (jobs), + 3 (arrivals) and + 6 (SLOs); numpy's MT19937 in
        the same state produces the same numbers. CPython's seeding (init_by_array over the seed's
        32-bit words) is taken from ``random.Random(seed).getstate()``: only the state, once; every
        draw comes from numpy."""
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise TraceError(f"expected an integer >= 0, got {seed!r}", column="seed")
        return cls(_cpython_mt19937(seed + 2), _cpython_mt19937(seed + 3), _cpython_mt19937(seed + 6))

    @classmethod
    def split(cls, rng: np.random.Generator) -> TraceStreams:
        """Three independent PCG64 streams seeded from draws of ``rng`` (deterministic in its state)."""
        seeds = rng.integers(0, 2**32, size=(3, 4), dtype=np.uint64)
        return cls(*(np.random.Generator(np.random.PCG64(np.random.SeedSequence(s.tolist()))) for s in seeds))


def _cpython_mt19937(seed: int) -> np.random.Generator:
    state = random.Random(seed).getstate()[1]  # 624 words of state, then the position
    bit_generator = np.random.MT19937()
    bit_generator.state = {
        "bit_generator": "MT19937",
        "state": {"key": np.array(state[:624], dtype=np.uint32), "pos": state[624]},
    }
    return np.random.Generator(bit_generator)


@dataclass(frozen=True, slots=True)
class _Catalog:
    """The job types on offer, in draw order, and their reference steps/s per (type, scale factor)."""

    templates: tuple[JobTemplate, ...]
    steps_per_s: Mapping[tuple[str, int], float]


def _catalog(spec: TraceSpec, table: ThroughputTable, templates: Sequence[JobTemplate]) -> _Catalog:
    reference = spec.reference_accelerator_type
    if reference not in table.accelerator_types:
        raise TraceError(
            f"reference accelerator type {reference!r} is not in the throughput table "
            f"(known: {', '.join(table.accelerator_types)})"
        )
    known = {t.job_type for t in templates}
    # Gavel's templates first, in their order (the draw is an index); job types of a custom table
    # that have no template follow, sorted, with an empty command (simulated jobs need none).
    offered = [t for t in templates if table.has_job(t.job_type, 1)]
    offered += [JobTemplate(t, "", "", "", False) for t in sorted(table.job_types - known) if table.has_job(t, 1)]
    if not offered:
        raise TraceError("no job type of the throughput table has a throughput with scale factor 1")
    scale_factors = [sf for sf, p in spec.mix.scale_factor_weights if p > 0] if spec.multi_gpu else [1]
    steps_per_s: dict[tuple[str, int], float] = {}
    for template, sf in itertools.product(offered, sorted({1, *scale_factors})):
        value = table.isolated_steps_per_s.get((template.job_type, sf, reference), 0.0)
        if value > 0:
            steps_per_s[(template.job_type, sf)] = value
        elif sf == 1:
            raise TraceError(f"job type {template.job_type!r} has no throughput on {reference!r}: cannot size its steps")
    for sf in scale_factors:
        if not any(key[1] == sf for key in steps_per_s):
            raise TraceError(f"no job type has a throughput with scale factor {sf} on {reference!r}: cannot draw multi-GPU jobs")
    return _Catalog(tuple(offered), MappingProxyType(steps_per_s))


def _pick(weights: Sequence[tuple[float, float]], u: float) -> float:
    """The value whose cumulative-probability interval holds u (u in [0, 1))."""
    for (value, _), upper in zip(weights, itertools.accumulate(p for _, p in weights), strict=True):
        if u < upper:
            return value
    return weights[-1][0]


def _uniform_index(rng: np.random.Generator, n: int) -> int:
    """Uniform in [0, n), drawn as CPython's random.choice draws it: the top bit_length(n) bits of
    a 32-bit word, rejected until below n. Any bit generator works (the low 32 bits of its raw
    output are uniform); with MT19937 the draw is Gavel's."""
    bits = n.bit_length()
    while True:
        index = (int(rng.bit_generator.random_raw()) & 0xFFFF_FFFF) >> (32 - bits)
        if index < n:
            return index


def generate_trace(
    spec: TraceSpec,
    table: ThroughputTable,
    rng: np.random.Generator | TraceStreams,
    templates: Sequence[JobTemplate] = JOB_TEMPLATES,
) -> tuple[TraceJob, ...]:
    """``spec.num_jobs`` jobs with ids "0", "1", ...; a bare Generator is split into three streams."""
    streams = rng if isinstance(rng, TraceStreams) else TraceStreams.split(rng)
    catalog = _catalog(spec, table, templates)
    mix = spec.mix
    # Gavel's arithmetic (lam = 3600 / rate; -log(1 - u) / (1 / lam)) keeps its arrival times to the last bit.
    mean_interarrival_s = None if spec.jobs_per_hour is None else 3600.0 / spec.jobs_per_hour
    draws = streams.jobs
    jobs = []
    arrival_s = 0.0
    steady = _SteadyStart(list(spec.steady_state_gpus))
    first_arrival = 0  # the position of the first job of the arrival process
    for i in range(spec.num_jobs):
        if i > first_arrival and mean_interarrival_s is not None:
            arrival_s = -math.log(1.0 - streams.arrivals.random()) / (1.0 / mean_interarrival_s) + arrival_s
        scale_factor = int(_pick(mix.scale_factor_weights, draws.uniform(0, 1)))
        if not spec.multi_gpu:
            scale_factor = 1
        if spec.fixed_run_time_s is not None:
            run_time_s = float(spec.fixed_run_time_s)
        else:
            short = draws.random() < mix.short_job_probability
            low, high = mix.short_run_time_log10_min if short else mix.long_run_time_log10_min
            run_time_s = 60 * (10 ** draws.uniform(low, high))
        while True:
            template = catalog.templates[_uniform_index(draws, len(catalog.templates))]
            if (template.job_type, scale_factor) in catalog.steps_per_s:
                break
        priority_weight = 1.0
        if spec.priority_weights and draws.uniform(0, 1) < mix.high_priority_probability:
            priority_weight = mix.high_priority_weight
        slo_s = _pick(mix.slo_factor_weights, streams.slos.uniform(0, 1)) * run_time_s if spec.slos else None
        jobs.append(
            TraceJob(
                job_id=str(i),
                job_type=template.job_type,
                # int() truncates as Gavel's %d does; max(): a very slow type of a custom table could
                # round down to no step at all.
                total_steps=max(1, int(run_time_s * catalog.steps_per_s[(template.job_type, scale_factor)])),
                scale_factor=scale_factor,
                arrival_time_s=float(f"{arrival_s:f}"),
                priority_weight=priority_weight,
                slo_s=slo_s,
                command=template.command,
                working_directory=template.working_directory,
                num_steps_arg=template.num_steps_arg,
                needs_data_dir=template.needs_data_dir,
            )
        )
        if steady.filling:  # a steady-state job: at t = 0, and the arrival process starts after it
            steady.take(scale_factor)
            first_arrival = i + 1
    return tuple(jobs)


@dataclass(slots=True)
class _SteadyStart:
    """Gavel's steady-state fill: per type, in order, jobs until their GPUs reach its count."""

    remaining_gpus: list[int]

    @property
    def filling(self) -> bool:
        while self.remaining_gpus and self.remaining_gpus[0] <= 0:
            self.remaining_gpus.pop(0)
        return bool(self.remaining_gpus)

    def take(self, scale_factor: int) -> None:
        self.remaining_gpus[0] -= scale_factor
