"""Gavel's throughput table: how fast each job type runs on each accelerator type, alone or packed.

A pure parser — the caller reads the file (``json.load``) and hands the parsed dict to
:func:`throughput_table_from_json`; nothing here touches the file system.

The format (Gavel's ``simulation_throughputs.json``, see data/gavel/README.md):

    { accelerator type: {                      e.g. "v100"
        "('ResNet-50 (batch size 64)', 1)": {  job key: the text of a (job type, scale factor) tuple
            "null": 4.39,                      isolated steps/s of the whole gang (scale-factor GPUs)
            "('LM (batch size 20)', 1)": [3.1, 7.5],   packed with that job key on the same GPUs:
            ...                                         [this job's steps/s, the partner's steps/s]
        }, ... }, ... }

Pairs only exist between keys with the same scale factor. Throughputs are finite and >= 0 (0 means
the job cannot run there, e.g. out of memory).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType

from common.errors import ProblemError

# "('ResNet-50 (batch size 64)', 1)" -> job type, scale factor. The job type may itself contain
# parentheses, so the pattern is anchored at both ends and the name part is greedy.
_JOB_KEY = re.compile(r"^\('(?P<job_type>.+)', (?P<scale_factor>[0-9]+)\)$")

JobKey = tuple[str, int]  # (job type, scale factor)


def parse_job_key(text: str) -> JobKey:
    """``"('ResNet-50 (batch size 64)', 1)"`` -> ``("ResNet-50 (batch size 64)", 1)``."""
    match = _JOB_KEY.match(text)
    if match is None:
        raise ProblemError(f"throughput table: {text!r} is not a job key like \"('Model (batch size N)', 1)\"")
    return match.group("job_type"), int(match.group("scale_factor"))


def format_job_key(job_type: str, scale_factor: int) -> str:
    """Inverse of :func:`parse_job_key`."""
    return f"('{job_type}', {scale_factor})"


@dataclass(frozen=True)
class ThroughputTable:
    """Isolated and packed steps/s per (job type, scale factor, accelerator type). Read-only.

    ``isolated_steps_per_s``: (job type, scale factor, accelerator type) -> steps/s of the gang.
    ``pair_steps_per_s``: (type a, type b, scale factor, accelerator type) -> (a's steps/s,
    b's steps/s) when a and b share the same GPUs.
    """

    accelerator_types: tuple[str, ...]
    isolated_steps_per_s: Mapping[tuple[str, int, str], float]
    pair_steps_per_s: Mapping[tuple[str, str, int, str], tuple[float, float]]

    @cached_property
    def job_keys(self) -> frozenset[JobKey]:
        """Every (job type, scale factor) the table knows on at least one accelerator type."""
        return frozenset((job_type, sf) for job_type, sf, _ in self.isolated_steps_per_s)

    @cached_property
    def job_types(self) -> frozenset[str]:
        return frozenset(job_type for job_type, _, _ in self.isolated_steps_per_s)

    def has_job(self, job_type: str, scale_factor: int) -> bool:
        return (job_type, scale_factor) in self.job_keys

    def isolated(self, job_type: str, scale_factor: int, accelerator_type: str) -> float:
        """Steps/s of ``job_type`` on ``scale_factor`` GPUs of ``accelerator_type``, alone.

        Raises ProblemError naming what is unknown (accelerator type, job type, scale factor).
        """
        value = self.isolated_steps_per_s.get((job_type, scale_factor, accelerator_type))
        if value is not None:
            return value
        if accelerator_type not in self.accelerator_types:
            raise ProblemError(
                f"accelerator type {accelerator_type!r} is not in the throughput table "
                f"(known: {', '.join(self.accelerator_types)})"
            )
        if job_type not in self.job_types:
            raise ProblemError(f"unknown job type {job_type!r}: not in the throughput table")
        raise ProblemError(
            f"job type {job_type!r} has no throughput with scale factor {scale_factor} "
            f"on {accelerator_type!r} in the throughput table"
        )

    def without(self, job_types: Iterable[str]) -> ThroughputTable:
        """The same table without some job types (the simulator's "unknown" types: the estimator
        and the mechanism must not know them, the simulated hardware still does)."""
        gone = set(job_types)
        return _rebuild(
            self.accelerator_types,
            {k: v for k, v in self.isolated_steps_per_s.items() if k[0] not in gone},
            {k: v for k, v in self.pair_steps_per_s.items() if k[0] not in gone and k[1] not in gone},
        )

    def typical_isolated(self, scale_factor: int) -> dict[str, float]:
        """Per accelerator type, the geometric mean steps/s of the job types of this size (of every
        size when there is none): the prior for a job nothing is known of."""
        same = [v for (_, sf, _), v in self.isolated_steps_per_s.items() if sf == scale_factor]
        by_type: dict[str, list[float]] = {}
        for (_, sf, w), v in self.isolated_steps_per_s.items():
            if sf == scale_factor or not same:
                by_type.setdefault(w, []).append(v)
        return {w: geometric_mean(by_type.get(w, ())) for w in self.accelerator_types}

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # MappingProxyType cannot be pickled; send plain dicts and wrap them again on the other
        # side (the policy service hands its table to a worker process).
        return _rebuild, (self.accelerator_types, dict(self.isolated_steps_per_s), dict(self.pair_steps_per_s))

    def pair(
        self, job_type_a: str, job_type_b: str, scale_factor: int, accelerator_type: str
    ) -> tuple[float, float] | None:
        """(a's steps/s, b's steps/s) when a and b share GPUs; None when the pair was not measured."""
        return self.pair_steps_per_s.get((job_type_a, job_type_b, scale_factor, accelerator_type))


def geometric_mean(values: Iterable[float]) -> float:
    """Of the positive values (a job that cannot run somewhere says nothing of how fast jobs run
    there); 0 when there is none."""
    logs = [math.log(v) for v in values if v > 0]
    return math.exp(math.fsum(logs) / len(logs)) if logs else 0.0


def _rebuild(
    accelerator_types: tuple[str, ...],
    isolated: dict[tuple[str, int, str], float],
    pairs: dict[tuple[str, str, int, str], tuple[float, float]],
) -> ThroughputTable:
    return ThroughputTable(accelerator_types, MappingProxyType(isolated), MappingProxyType(pairs))


def _steps_per_s(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProblemError(f"throughput table: {where}: expected a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ProblemError(f"throughput table: {where}: {value!r} is not a finite number >= 0")
    return number


def throughput_table_from_json(data: Mapping[str, object]) -> ThroughputTable:
    """Parse Gavel's throughput table (already decoded from JSON) into a ThroughputTable.

    Raises ProblemError with the offending key path on any malformed entry.
    """
    if not isinstance(data, Mapping) or not data:
        raise ProblemError("throughput table: expected a non-empty object keyed by accelerator type")
    isolated: dict[tuple[str, int, str], float] = {}
    pairs: dict[tuple[str, str, int, str], tuple[float, float]] = {}
    for accelerator_type, jobs in data.items():
        if not isinstance(jobs, Mapping):
            raise ProblemError(f"throughput table: {accelerator_type}: expected an object of job keys")
        for key_text, entries in jobs.items():
            job_type, scale_factor = parse_job_key(str(key_text))
            where = f"{accelerator_type}.{key_text}"
            if not isinstance(entries, Mapping) or "null" not in entries:
                raise ProblemError(f"throughput table: {where}: expected an object with a 'null' entry")
            for other_text, value in entries.items():
                if other_text == "null":
                    isolated[(job_type, scale_factor, accelerator_type)] = _steps_per_s(value, f"{where}.null")
                    continue
                other_type, other_scale_factor = parse_job_key(str(other_text))
                pair_where = f"{where}.{other_text}"
                if other_scale_factor != scale_factor:
                    raise ProblemError(f"throughput table: {pair_where}: a pair must share one scale factor")
                if not isinstance(value, (list, tuple)) or len(value) != 2:
                    raise ProblemError(f"throughput table: {pair_where}: expected [own, partner] steps/s")
                pairs[(job_type, other_type, scale_factor, accelerator_type)] = (
                    _steps_per_s(value[0], pair_where + "[0]"),
                    _steps_per_s(value[1], pair_where + "[1]"),
                )
    return ThroughputTable(
        accelerator_types=tuple(data.keys()),
        isolated_steps_per_s=MappingProxyType(isolated),
        pair_steps_per_s=MappingProxyType(pairs),
    )
