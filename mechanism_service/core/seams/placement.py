"""The placement seam: which free workers of one accelerator type each gang takes this round
(step 4 of a round's plan, after the greedy pick chose the gangs: core/planning/placement.py).

Writing one (docs/extending.md walks through a whole package):

    class LastServerFirst:
        def __init__(self, **params: str) -> None:      # --placement-param KEY=VALUE, as strings
            if params:
                raise TypeError(f"unknown parameters: {', '.join(params)}")

        def place(self, request: PlacementRequest) -> list[tuple[int, ...]]:
            free = [list(s) for s in reversed(request.free)]
            out = []
            for gang in request.gangs:
                workers = [w for server in free for w in server][: gang.gpus]
                for server in free:
                    server[:] = [w for w in server if w not in workers]
                out.append(tuple(workers))
            return out

The name given to ``--placement`` (a built-in, an entry point of group ``gavel.placement``, or
``package.module:Name``) names a callable, usually a class, called once at start with the
parameters as keyword arguments (strings); it returns the strategy.

The contract:

- ``place`` is called once per accelerator type per round, for the gangs placed afresh on it.
  Lease extensions are not its business: a gang that ran on this type last round and whose
  workers are all still free keeps them (no checkpoint, no restore) before it is called, and
  its workers are not among the free ones.
- It returns one sequence of worker ids per gang, in the order of ``request.gangs``: exactly
  ``gang.gpus`` distinct ids, each free (in ``request.free``), no id given to two gangs. The
  greedy pick made sure they fit in number, so an answer always exists.
- It must be a pure function of the request (a restarted mechanism builds a new strategy; the
  simulator's two engines must make the same schedule), and fast: it runs in every round.
- If it raises, or answers what breaks a rule above, the mechanism places the whole round with
  ``consolidated`` (Gavel's) and logs one error line naming the strategy; the cluster goes on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Gang:
    """A picked entry to place: one job, or a packed pair whose two jobs share the same GPUs."""

    job_ids: tuple[str, ...]
    gpus: int  # workers it takes (a pair takes its gang size once: both jobs run on each)
    # Where it ran last (its checkpoint is on those servers): the type and the workers of its
    # last lease (a pair: its own last lease, else its first job's); None and () if it never ran
    # or that was forgotten.
    last_type: str | None = None
    last_workers: tuple[int, ...] = ()

    @property
    def packed(self) -> bool:
        return len(self.job_ids) > 1


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    accelerator_type: str
    servers: tuple[tuple[int, ...], ...]  # every worker of the type, by server (ids ascending)
    free: tuple[tuple[int, ...], ...]  # the free ones, same server indexing (lease extensions taken out)
    gangs: tuple[Gang, ...]  # to place, largest first (ties: in the pick's order)

    def server_of(self, worker_id: int) -> int | None:
        """The index of the server holding ``worker_id`` (None: not a worker of this type)."""
        for k, server in enumerate(self.servers):
            if worker_id in server:
                return k
        return None


@runtime_checkable
class PlacementStrategy(Protocol):
    def place(self, request: PlacementRequest) -> Sequence[Sequence[int]]:
        """Worker ids per gang, in the order of ``request.gangs`` (see the module's contract)."""
        ...


def answer_problem(request: PlacementRequest, answer: object) -> str:
    """Why ``answer`` is not a placement of ``request`` ("" when it is): one per gang, each
    exactly its GPUs, free, distinct."""
    try:
        placed = [tuple(workers) for workers in answer]  # type: ignore[attr-defined]
    except TypeError:
        return f"not a sequence of worker ids per gang (a {type(answer).__name__})"
    if len(placed) != len(request.gangs):
        return f"{len(placed)} placements for {len(request.gangs)} gangs"
    free = {w for server in request.free for w in server}
    taken: set[object] = set()
    for gang, workers in zip(request.gangs, placed):
        name = "+".join(gang.job_ids)
        if len(workers) != gang.gpus:
            return f"{name}: {len(workers)} workers for a gang of {gang.gpus}"
        for w in workers:
            if isinstance(w, bool) or not isinstance(w, int) or w not in free:
                return f"{name}: worker {w!r} is not free on {request.accelerator_type}"
            if w in taken:
                return f"{name}: worker {w} given twice"
            taken.add(w)
    return ""
