"""Colocation of classes the reference set does not know: matrix completion and matching.

Per scale factor, one matrix: a row per class (the references first, then every unknown class of
that size), and a column per (direction, accelerator type, reference s):

    with     fraction of the row's class's steps/s alone that it keeps packed with s on the type
    against  fraction s keeps packed with the row's class

References' rows come from the table (both directions known); an unknown class's row holds what
was measured of it (a packed run with a job of class s gives both directions at once, one from
each job's report). ``complete`` fills the rest (completion.py), and the class is matched to the
reference whose completed row is closest in cosine distance. The prior for a cell is the mean of
the completed value and the match's own value: two estimates with different errors (the bench
measures the blend better than either, docs/estimator.md).

Completion is rerun only when the observed cells of some row change: a new cell, or a value that
moved by more than ``REFIT_TOLERANCE``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from estimator_service.core.completion import CompletionSettings, complete
from estimator_service.core.reference import ReferenceGroup, ReferenceSet

WITH, AGAINST = 0, 1
REFIT_TOLERANCE = 0.02


@dataclass
class GroupModel:
    """The completion matrix of one reference group (module docstring)."""

    group: ReferenceGroup
    type_index: tuple[int, ...]  # the feature types' columns in the reference set's types
    settings: CompletionSettings
    observed: dict[str, np.ndarray] = field(default_factory=dict)  # unknown class -> observed row (NaN: not)
    fitted_from: dict[str, np.ndarray] = field(default_factory=dict)  # the rows the last fit saw
    completed: dict[str, np.ndarray] = field(default_factory=dict)  # class -> prior row (blended)
    matches: dict[str, int | None] = field(default_factory=dict)  # class -> reference index
    references: np.ndarray | None = None  # (R, C) the references' rows, gaps completed
    stale: bool = False  # an observed row changed materially since the last fit
    fits: int = 0  # how many times it was fitted (callers notice refits by it)

    @property
    def num_references(self) -> int:
        return len(self.group.classes)

    def column(self, direction: int, type_position: int, reference: int) -> int:
        r = self.num_references
        return direction * len(self.type_index) * r + type_position * r + reference

    def table_rows(self) -> np.ndarray:
        """(R, C) the references' rows from the table (NaN where it has no pair)."""
        colocation = self.group.colocation[:, :, list(self.type_index)]  # (R, R, Kf): [row, s, k]
        with_ = colocation.transpose(0, 2, 1).reshape(self.num_references, -1)
        against = colocation.transpose(1, 2, 0).reshape(self.num_references, -1)  # [s, row, k] read as row's
        return np.concatenate([with_, against], axis=1)

    def observe(self, unknown_class: str, row: np.ndarray) -> None:
        self.observed[unknown_class] = row
        if not self.stale:
            self.stale = self._changed(unknown_class)

    def refresh(self) -> bool:
        """Refit when some observed row changed materially since the last fit. True if refitted."""
        if self.references is not None and not self.stale:
            return False
        self.stale = False
        table = self.table_rows()
        # Only rows with a measurement enter the fit (an empty row would change nothing but the
        # seeded start); the others get the typical row.
        names = sorted(c for c, row in self.observed.items() if np.isfinite(row).any())
        rows = np.vstack([table, *[self.observed[c][None, :] for c in names]]) if names else table
        fitted = np.clip(complete(rows, np.isfinite(rows), self.settings), 0.0, 1.0)
        self.references = np.where(np.isfinite(table), table, fitted[: self.num_references])
        self.completed, self.matches = {}, {}
        for i, name in enumerate(names):
            row = fitted[self.num_references + i]
            seen = np.isfinite(self.observed[name])
            match = int(np.argmin(cosine_distances(np.where(seen, self.observed[name], row), self.references)))
            matched = self.references[match]
            # the match cannot share there (out of memory): neither, most likely, can this class
            self.completed[name] = np.where(matched > 0, 0.5 * (row + matched), 0.0)
            self.matches[name] = match
        self.fitted_from = {c: r.copy() for c, r in self.observed.items()}
        self.fits += 1
        return True

    @property
    def typical_row(self) -> np.ndarray:
        """The mean reference row: the prior of a class nothing was measured of packed."""
        if self.references is None:
            self.refresh()
        assert self.references is not None
        return self.references.mean(axis=0)

    def _changed(self, name: str) -> bool:
        """Whether the class's observed row differs materially from the one the last fit saw."""
        row, before = self.observed[name], self.fitted_from.get(name)
        if before is None or not np.array_equal(np.isfinite(row), np.isfinite(before)):
            return True
        seen = np.isfinite(row)
        return bool(seen.any() and np.max(np.abs(row[seen] - before[seen])) > REFIT_TOLERANCE)


def cosine_distances(row: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """1 - cos(row, each of rows) (a zero vector is at distance 1 from everything)."""
    norms = np.linalg.norm(rows, axis=1) * np.linalg.norm(row)
    with np.errstate(invalid="ignore", divide="ignore"):
        similarity = np.where(norms > 0, rows @ row / np.where(norms > 0, norms, 1.0), 0.0)
    return 1.0 - similarity


@dataclass
class ColocationModel:
    """Every group's completion, with the lookups the estimator needs."""

    references: ReferenceSet
    settings: CompletionSettings
    groups: dict[int, GroupModel] = field(default_factory=dict)

    def __post_init__(self) -> None:
        types = self.references.accelerator_types
        type_index = tuple(types.index(w) for w in self.references.feature_types)
        for scale_factor, group in self.references.groups.items():
            self.groups[scale_factor] = GroupModel(group, type_index, self.settings)

    def model(self, scale_factor: int) -> GroupModel | None:
        return self.groups.get(scale_factor)

    def empty_row(self, scale_factor: int) -> np.ndarray | None:
        model = self.groups.get(scale_factor)
        if model is None:
            return None
        return np.full(2 * len(model.type_index) * model.num_references, np.nan)

    def match(self, unknown_class: str, scale_factor: int) -> int | None:
        model = self._fresh(scale_factor)
        return None if model is None else model.matches.get(unknown_class)

    def prior_row(self, unknown_class: str, scale_factor: int) -> np.ndarray | None:
        """The class's prior row: completed and blended with its match, or the typical row."""
        model = self._fresh(scale_factor)
        if model is None:
            return None
        row = model.completed.get(unknown_class)
        return row if row is not None else model.typical_row

    def reference_row(self, scale_factor: int, reference: int) -> np.ndarray | None:
        model = self._fresh(scale_factor)
        return None if model is None or model.references is None else model.references[reference]

    def _fresh(self, scale_factor: int) -> GroupModel | None:
        model = self.groups.get(scale_factor)
        if model is not None:
            model.refresh()
        return model


def observed_row(
    model: GroupModel, fractions: Mapping[tuple[int, int, int], float]
) -> np.ndarray:
    """A row from measured fractions keyed (direction, feature type position, reference index)."""
    row = np.full(2 * len(model.type_index) * model.num_references, np.nan)
    for (direction, position, reference), value in fractions.items():
        row[model.column(direction, position, reference)] = value
    return row
