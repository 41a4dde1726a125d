"""The launch seam: which entries launch this round, and so which running ones are preempted.

The greedy pick (core/planning/picking.py) chooses, per type, the entries the allocation's
priorities rank first; an entry that ran last round and is not chosen is preempted (it
checkpoints; its lease is not extended). A launch strategy sits between the pick and the
placement and may change that choice: keep a running entry on its GPUs instead of the one
that would displace it (no preemption), let only some of the picked start, or reorder who
comes first. It cannot change the allocation, the priorities, or where a gang is placed
(that is the placement seam), and profiling runs are always launched ahead of it.

Contract, as for the other seams (core/seams/admission.py): a callable named by
``MechanismSettings.launch`` (``--launch``) is called once at start with its parameters as
keyword arguments (strings) and returns the strategy; ``launch(view)`` returns, per type, the
keys of the candidates to launch there, in launch order. Each key must name a candidate of that
type; a job may launch once in all; a type's launched gangs must fit in its free GPUs. An
invalid answer or an exception launches the pick as it is (``priority``) for that round, with
one error line naming the strategy. It must be pure and fast.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Candidate:
    """An entry that may launch on ``accelerator_type`` this round."""

    key: int  # how the answer names it
    job_ids: tuple[str, ...]  # one job, or a packed pair
    gpus: int
    accelerator_type: str
    picked: bool  # the greedy pick chose it on this type
    running: bool  # it ran on this type last round (launched again: a lease extension if placed on its GPUs)


@dataclass(frozen=True, slots=True)
class LaunchView:
    free_gpus: Mapping[str, int]  # per type, the GPUs this round may give (profiling runs taken out)
    # per type: the picked entries in pick order, then the entries that ran there last round and
    # were not picked (they would be preempted), in last round's order
    candidates: Mapping[str, tuple[Candidate, ...]]


@runtime_checkable
class LaunchStrategy(Protocol):
    def launch(self, view: LaunchView) -> Mapping[str, Sequence[int]]:
        """Per type, the keys of the candidates to launch there (see the module's contract)."""
        ...


def answer_problem(view: LaunchView, answer: object) -> str:
    """Why ``answer`` cannot be launched ("" when it can)."""
    if not isinstance(answer, Mapping):
        return f"not a mapping of type -> candidate keys (a {type(answer).__name__})"
    seen_jobs: set[str] = set()
    for w, keys in answer.items():
        if w not in view.candidates:
            return f"no candidates on {w!r}"
        by_key = {c.key: c for c in view.candidates[w]}
        gpus = 0
        try:
            chosen = list(keys)
        except TypeError:
            return f"{w}: not a sequence of keys"
        for key in chosen:
            candidate = by_key.get(key) if isinstance(key, int) and not isinstance(key, bool) else None
            if candidate is None:
                return f"{w}: {key!r} is not a candidate there"
            if seen_jobs & set(candidate.job_ids):
                return f"{w}: {'+'.join(candidate.job_ids)} launched twice"
            seen_jobs.update(candidate.job_ids)
            gpus += candidate.gpus
        if gpus > view.free_gpus.get(w, 0):
            return f"{w}: {gpus} GPUs launched, {view.free_gpus.get(w, 0)} free"
    return ""
