"""The reference set: pre-profiled job types, as the estimator knows them before any measurement.

By default Gavel's table: each reference is a colocation class (job type, scale factor) with its
gang's steps/s alone on every accelerator type, and its *normalised* colocated throughput with
every other reference of the same scale factor (only equal gangs share GPUs):

    colocation[r, s, k] = steps/s of r when packed with s on type k / steps/s of r alone on k

in [0, 1]; NaN where the table does not list the pair (or r cannot run alone there), 0 where the
pair cannot share that type. References are grouped by scale factor: a new job is compared only
with references of its own size.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from common.errors import ProblemError
from common.throughputs import ThroughputTable, format_job_key, geometric_mean

UNCONSOLIDATED = "_unconsolidated"  # Gavel's pseudo-types for gangs spread over servers


def class_of(job_type: str, scale_factor: int) -> str:
    """A job's colocation class: its job type and gang size, written as the table writes keys."""
    return format_job_key(job_type, scale_factor)


@dataclass(frozen=True, eq=False)
class ReferenceGroup:
    """The references of one scale factor.

    classes         (R,)        colocation class names, in job type order
    isolated        (R, K)      steps/s alone (NaN: not measured there; 0: cannot run there)
    colocation      (R, R, K)   normalised colocated throughputs (module docstring)
    """

    scale_factor: int
    classes: tuple[str, ...]
    isolated: np.ndarray
    colocation: np.ndarray

    @cached_property
    def index(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.classes)}


@dataclass(frozen=True, eq=False)
class ReferenceSet:
    accelerator_types: tuple[str, ...]
    groups: dict[int, ReferenceGroup]  # scale factor -> its references

    @cached_property
    def classes(self) -> frozenset[str]:
        return frozenset(c for g in self.groups.values() for c in g.classes)

    @cached_property
    def feature_types(self) -> tuple[str, ...]:
        """The accelerator types profiled and compared on: Gavel's "_unconsolidated" pseudo-types
        repeat their type's figures for one GPU and are estimated from the match instead."""
        real = tuple(w for w in self.accelerator_types if not w.endswith(UNCONSOLIDATED))
        return real or self.accelerator_types

    def group(self, scale_factor: int) -> ReferenceGroup | None:
        return self.groups.get(scale_factor)

    def locate(self, colocation_class: str) -> tuple[ReferenceGroup, int] | None:
        for group in self.groups.values():
            i = group.index.get(colocation_class)
            if i is not None:
                return group, i
        return None

    def typical_isolated(self, scale_factor: int) -> np.ndarray:
        """(K,) the geometric mean steps/s of the references of this size (of every size when
        there is none): the prior for a job nothing is known of."""
        group = self.groups.get(scale_factor)
        rows = group.isolated if group is not None else np.concatenate([g.isolated for g in self.groups.values()])
        return np.array([geometric_mean(column[np.isfinite(column)]) for column in rows.T])


def reference_set(
    table: ThroughputTable,
    *,
    exclude: Iterable[str] = (),
    keep: int | None = None,
    rng: np.random.Generator | None = None,
) -> ReferenceSet:
    """The references of ``table``: every job type but those in ``exclude`` (unknown types in a
    simulation), or ``keep`` of them per scale factor drawn with ``rng`` (Gavel's
    num_reference_models)."""
    excluded = set(exclude)
    unknown = excluded - table.job_types
    if unknown:
        raise ProblemError(f"reference set: unknown job types {sorted(unknown)} (not in the throughput table)")
    if keep is not None and keep < 1:
        raise ProblemError(f"reference set: keep at least one reference model, not {keep}")
    types = table.accelerator_types
    by_size: dict[int, list[str]] = {}
    for job_type, scale_factor in sorted(table.job_keys):
        if job_type not in excluded:
            by_size.setdefault(scale_factor, []).append(job_type)
    if keep is not None:
        rng = rng if rng is not None else np.random.default_rng(0)
        for scale_factor, names in by_size.items():
            if len(names) > keep:
                chosen = rng.choice(len(names), size=keep, replace=False)
                by_size[scale_factor] = [names[i] for i in sorted(chosen)]
    groups = {
        scale_factor: _group(table, scale_factor, names, types) for scale_factor, names in sorted(by_size.items()) if names
    }
    if not groups:
        raise ProblemError("reference set: no job type is left to compare new jobs with")
    return ReferenceSet(types, groups)


def _group(table: ThroughputTable, scale_factor: int, names: Sequence[str], types: Sequence[str]) -> ReferenceGroup:
    n, num_types = len(names), len(types)
    isolated = np.full((n, num_types), np.nan)
    for i, name in enumerate(names):
        for k, w in enumerate(types):
            value = table.isolated_steps_per_s.get((name, scale_factor, w))
            if value is not None:
                isolated[i, k] = value
    colocation = np.full((n, n, num_types), np.nan)
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            for k, w in enumerate(types):
                pair = table.pair(a, b, scale_factor, w)
                alone = isolated[i, k]
                if pair is None or not alone > 0:
                    continue
                colocation[i, j, k] = min(1.0, pair[0] / alone)
    return ReferenceGroup(scale_factor, tuple(class_of(name, scale_factor) for name in names), isolated, colocation)
