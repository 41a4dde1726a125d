"""Calibration: how this cluster's hardware runs against the table, apart from how each job runs on it.

The reference table was measured on other machines. A cluster whose "v100" servers run slower or
faster than the table's (another GPU generation, a CPU test cluster declared as `--type v100`,
other drivers) is not made of stragglers: every worker of the type is off by about the same
factor. But not every job is off by the same factor: a CPU runs the catalog's LM at ~0.2 of its
table figure and its Transformer at ~4 times it. Which jobs a type happened to run must not be
taken for how fast the type is (issue 23, item 3: the CPU "k80" ran Transformers, the CPU "v100"
LMs, and per-type medians made the k80 look faster than the v100 for every job).

So a measurement alone of reference class j on type k, as a log ratio to the table, is modelled

    r_jk = log(measured / T[j, k]) = a_k + b_j + noise

a_k: the type's hardware against the table's ratios between types; b_j: how class j runs on this
cluster's hardware against the table, the same on every type. Each (class, type) cell is the median
over the type's healthy workers of each one's median ratio over its latest jobs of the class (so
one odd job or worker does not move it), and a and b are fitted jointly by ridge least squares over
the observed cells (one small linear solve, ``cell_fit.fit_cells``): a_k is shrunk towards 0 (a prior sd of
HARDWARE_SD), b_j is left free. So a_k - a_k' is learned only from classes measured on both types
(or through a chain of them); a type whose difference from the others no class links stays at the
table's ratio, and the cluster's common level is the mean of b.

Applied to a figure T[j, k] (Fit): a class measured on some types but not on k gets
exp(a_k + b_j); a class measured nowhere, the typical job, and a class on a type it was measured on
(its measurements say the rest) get exp(a_k + mean b) with the spread of b added to the variance
(a guess: the classes' ratios differ); a new class's speed measured on k' gets the matched
reference's ratio times exp(a_k - a_k').

When every cell measured is within ``tolerance`` of the table, or within twice the standard error
of its estimate (how far the estimate moves with the cells' noise, not the prior's uncertainty),
the cluster is the table's and the table stands everywhere as it is: the table's own jobs vary that
much, and noisy measurements of a cluster that matches the table would otherwise move every prior
back and forth (one job measured 12% off by chance says little; one measured at a quarter of the
table says it all). Otherwise each figure's shift is applied unless it is within that tolerance
itself, and its variance always: a type no class links to the others is a guess until one does.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from estimator_service.core.cell_fit import fit_cells

RECENT_JOBS = 20  # ratios remembered per worker (its latest jobs)
WORKERS_KEPT = 10_000  # workers remembered, the most recently measured (as stragglers.py)
FITS_KEPT = 32  # fits cached (one per set of workers left out: the flagged, plus one judged)
CELL_STEP = 0.002  # a cell's median moved by more than this (log) since the last fit: fit again


@dataclass(frozen=True, slots=True)
class Shift:
    """What a table figure is multiplied by (exp(log_shift)) and the variance (of the log) it adds."""

    log_shift: float = 0.0
    variance: float = 0.0

    @property
    def factor(self) -> float:
        return math.exp(self.log_shift)


NO_SHIFT = Shift()


@dataclass(frozen=True, eq=False)
class Fit:
    """The fitted calibration, as applied (the tolerance rule already applied: a 0 shift is the table).

    types: (K,), classes: (J,) the reference classes measured alone (by the workers not left out).
    reference_*: (J, K) the shift of T[j, k] and its variance; typical_*: (K,) for a class measured
    nowhere (and for one on a type it was measured on); between_*: (K, K) [to, from] the shift of a
    ratio T[., to] / T[., from]; peers: (K,) whether a worker of the type measured any cell;
    hardware (K,) a and levels (J,) b as fitted, before the tolerance."""

    types: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    reference_log: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    reference_var: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    typical_log: np.ndarray = field(default_factory=lambda: np.zeros(0))
    typical_var: np.ndarray = field(default_factory=lambda: np.zeros(0))
    between_log: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    between_var: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    peers: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    hardware: np.ndarray = field(default_factory=lambda: np.zeros(0))
    levels: np.ndarray = field(default_factory=lambda: np.zeros(0))
    table: bool = False  # every shift 0: the table stands as it is

    @classmethod
    def as_the_table(cls, types: tuple[str, ...], peers: np.ndarray) -> Fit:
        return cls(
            types, (), np.zeros((0, len(types))), np.zeros((0, len(types))), np.zeros(len(types)), np.zeros(len(types)),
            np.zeros((len(types), len(types))), np.zeros((len(types), len(types))), peers, np.zeros(len(types)), table=True,
        )

    @cached_property
    def _type_index(self) -> dict[str, int]:
        return {w: k for k, w in enumerate(self.types)}

    @cached_property
    def _class_index(self) -> dict[str, int]:
        return {c: j for j, c in enumerate(self.classes)}

    @cached_property
    def _shifts(self) -> dict[tuple[str, str, str], Shift]:
        return {}

    def reference(self, colocation_class: str, accelerator_type: str) -> Shift:
        """The shift of the table's figure of a reference class on the type."""
        key = ("r", colocation_class, accelerator_type)
        found = self._shifts.get(key)
        if found is None:
            k = self._type_index.get(accelerator_type)
            j = self._class_index.get(colocation_class)
            if k is None:
                found = NO_SHIFT
            elif j is None:
                found = self.typical(accelerator_type)
            else:
                found = _shift(self.reference_log[j, k], self.reference_var[j, k])
            self._shifts[key] = found
        return found

    def typical(self, accelerator_type: str) -> Shift:
        """The shift of a class measured nowhere (the typical job's too)."""
        k = self._type_index.get(accelerator_type)
        return NO_SHIFT if k is None else _shift(self.typical_log[k], self.typical_var[k])

    def between(self, to_type: str, from_type: str) -> Shift:
        """The shift of a ratio between two types' table figures, T[., to] / T[., from]."""
        k, other = self._type_index.get(to_type), self._type_index.get(from_type)
        return NO_SHIFT if k is None or other is None else _shift(self.between_log[k, other], self.between_var[k, other])

    def has_peers(self, accelerator_type: str) -> bool:
        k = self._type_index.get(accelerator_type)
        return k is not None and bool(self.peers[k])

    def moved(self, other: Fit, step: float) -> bool:
        """Whether any shift applied differs by more than ``step`` (log), in value or in sd."""
        if self.table and other.table:
            return False
        types = self.types if self.types == other.types else tuple(dict.fromkeys((*self.types, *other.types)))
        classes = self.classes if self.classes == other.classes else tuple(dict.fromkeys((*self.classes, *other.classes)))
        return any(
            values.size and (np.max(np.abs(values - others)) > step or np.max(np.abs(np.sqrt(variances) - np.sqrt(other_variances))) > step)
            for (values, variances), (others, other_variances) in zip(
                self._aligned(classes, types), other._aligned(classes, types), strict=True
            )
        )

    def _aligned(self, classes: tuple[str, ...], types: tuple[str, ...]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Its (shifts, variances) of reference, typical and between over the given classes and types,
        as reference(), typical() and between() give them (a class it lacks: the typical; a type: 0)."""
        if classes == self.classes and types == self.types:
            return [
                (self.reference_log, self.reference_var), (self.typical_log, self.typical_var),
                (self.between_log, self.between_var),
            ]
        ks = np.array([self._type_index.get(w, -1) for w in types], dtype=int)
        js = np.array([self._class_index.get(c, -1) for c in classes], dtype=int)
        typical = _pick(self.typical_log, self.typical_var, (ks,))
        reference = _pick(self.reference_log, self.reference_var, np.ix_(js, ks))
        lacking = (js < 0)[:, None]
        return [
            (np.where(lacking, typical[0], reference[0]), np.where(lacking, typical[1], reference[1])),
            typical,
            _pick(self.between_log, self.between_var, np.ix_(ks, ks)),
        ]


def _pick(values: np.ndarray, variances: np.ndarray, index: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
    """values[index] and variances[index], 0 where an index is -1 (not in the fit)."""
    missing = np.zeros(np.broadcast_shapes(*(i.shape for i in index)), dtype=bool)
    for i in index:
        missing = missing | (i < 0)
    if values.size == 0:
        return np.zeros(missing.shape), np.zeros(missing.shape)
    safe = tuple(np.where(i < 0, 0, i) for i in index)
    return np.where(missing, 0.0, values[safe]), np.where(missing, 0.0, variances[safe])


def _shift(log_shift: float, variance: float) -> Shift:
    return NO_SHIFT if log_shift == 0.0 and variance == 0.0 else Shift(float(log_shift), float(variance))


AS_THE_TABLE = Fit(table=True)


@dataclass(frozen=True, slots=True)
class TypeCalibration:
    """A type's calibration as estimator snapshots from before the joint fit pickled it (kept so that
    they load; Estimator.__setstate__ replaces it)."""

    log_shift: float = 0.0
    variance: float = 0.0
    workers: int = 0
    jobs: int = 0


@dataclass
class Calibration:
    tolerance: float = 0.1  # |log shift| within which the table stands (module docstring)
    assumed_sd: float = 0.3  # the spread of b while fewer than SPREAD_CLASSES classes are known
    # worker -> job -> (its class, log(measured / table)), the worker's latest RECENT_JOBS jobs
    ratios: dict[str, dict[str, tuple[str, float]]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)  # worker -> its accelerator type
    # (class, type) -> worker -> its level on the class (the median of its jobs' ratios)
    cells: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    version: int = 0  # grows when a cell appears, loses or gains a worker, or moves (fits are cached on it)
    _medians: dict[tuple[str, str], float] = field(default_factory=dict, repr=False)  # (class, type) -> its median
    _stamped: dict[tuple[str, str], float] = field(default_factory=dict, repr=False)  # its median at the last version
    _fits: dict[tuple[tuple[str, ...], frozenset[str]], tuple[int, Fit | None]] = field(default_factory=dict, repr=False)

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_fits": {}}  # a cache: not worth a snapshot's bytes

    def __setstate__(self, state: dict[str, object]) -> None:
        """A snapshot from before the joint fit (ratios without their classes) learns again."""
        if "cells" not in state:
            state = {"tolerance": state.get("tolerance", 0.1), "assumed_sd": state.get("assumed_sd", 0.3)}
            fresh = Calibration(**state)  # type: ignore[arg-type]
            state = dict(fresh.__dict__)
        self.__dict__.update(state)

    def observe(self, worker_id: str, accelerator_type: str, job_id: str, colocation_class: str, log_ratio: float) -> None:
        """A reference job's (mean) log ratio measured / table on the worker."""
        if not math.isfinite(log_ratio):
            return
        recent = self.ratios.pop(worker_id, {})
        self.ratios[worker_id] = recent  # re-inserted last: the most recently measured in order
        while len(self.ratios) > WORKERS_KEPT:
            gone = next(iter(self.ratios))
            self._forget(gone)
            del self.ratios[gone]
            self.types.pop(gone, None)
        if self.types.get(worker_id, accelerator_type) != accelerator_type:
            self._forget(worker_id)  # it came back as another type: what it measured was that type's
        self.types[worker_id] = accelerator_type
        entry = (colocation_class, log_ratio)
        before = recent.pop(job_id, None)
        recent[job_id] = entry
        touched = {colocation_class} if before != entry else set()
        if before is not None:
            touched.add(before[0])
        while len(recent) > RECENT_JOBS:
            touched.add(recent.pop(next(iter(recent)))[0])
        for name in touched:
            self._relevel(worker_id, accelerator_type, name)

    def _relevel(self, worker_id: str, accelerator_type: str, colocation_class: str) -> None:
        """Recompute the worker's level on the class and the cell's median; a new version when the
        cell's workers changed or its median moved by more than CELL_STEP since the last one (a
        job's mean moves a little with every lease: a refit for each would cost more than it says)."""
        key = (colocation_class, accelerator_type)
        values = [r for c, r in self.ratios.get(worker_id, {}).values() if c == colocation_class]
        levels = self.cells.setdefault(key, {})
        joined = (worker_id in levels) != bool(values)
        if values:
            levels[worker_id] = statistics.median(values)
        else:
            levels.pop(worker_id, None)
        if not levels:
            del self.cells[key]
            self._medians.pop(key, None)
            self._stamped.pop(key, None)
            self.version += 1
            return
        median = self._medians[key] = statistics.median(levels.values())
        if joined or abs(median - self._stamped.get(key, math.inf)) > CELL_STEP:
            self._stamped[key] = median
            self.version += 1

    def _forget(self, worker_id: str) -> None:
        """Take the worker's ratios out of every cell (they stay in ``ratios``, emptied)."""
        accelerator_type = self.types.get(worker_id)
        recent = self.ratios.get(worker_id, {})
        classes = {c for c, _ in recent.values()}
        recent.clear()
        for name in classes:
            if accelerator_type is not None:
                self._relevel(worker_id, accelerator_type, name)

    def fitted(self, types: tuple[str, ...], left_out: Collection[str] = ()) -> Fit | None:
        """The fit from every worker but ``left_out`` (the flagged stragglers, and a worker being
        judged); None when none of them measured a reference job alone (then nothing is known of
        this hardware but the table). Cached until a cell changes."""
        left = frozenset(left_out)
        key = (types, left)
        cached = self._fits.get(key)
        if cached is not None and cached[0] == self.version:
            return cached[1]
        found = self._fit(types, left)
        self._fits.pop(key, None)
        self._fits[key] = (self.version, found)
        while len(self._fits) > FITS_KEPT:
            del self._fits[next(iter(self._fits))]
        return found

    def _fit(self, types: tuple[str, ...], left_out: frozenset[str]) -> Fit | None:
        type_index = {w: k for k, w in enumerate(types)}
        cells: list[tuple[str, int, float]] = []
        for key, levels in self.cells.items():
            k = type_index.get(key[1])
            if k is None:
                continue
            if left_out and not left_out.isdisjoint(levels):
                kept = [v for w, v in levels.items() if w not in left_out]
                if kept:
                    cells.append((key[0], k, statistics.median(kept)))
            else:
                cells.append((key[0], k, self._medians[key]))
        if not cells:
            return None
        classes = tuple(sorted({c for c, _, _ in cells}))
        class_index = {c: j for j, c in enumerate(classes)}
        js = np.array([class_index[c] for c, _, _ in cells])
        ks = np.array([k for _, k, _ in cells])
        arrays = fit_cells(js, ks, np.array([v for _, _, v in cells]), len(classes), len(types), self.tolerance, self.assumed_sd)
        peers = np.zeros(len(types), dtype=bool)
        peers[ks] = True
        return Fit.as_the_table(types, peers) if arrays is None else Fit(types, classes, peers=peers, **arrays)

