"""The built-in placement strategies (the seam: core/seams/placement.py; docs/mechanism.md, "Seams").
Each takes one type's free workers by server and the gangs to place, largest first.

    consolidated      Gavel's (the default; the mechanism then runs core/planning/placement.py
                      itself, bit for bit): each gang takes the lowest free workers, filling a
                      server before the next
    spread            each gang's workers one at a time from the server with the most free
                      workers (ties: the lowest server): jobs on different servers, each server's
                      host (CPU, PCIe, memory) shared by as few jobs as possible
    packing_aware     packed pairs first, each on the server with the fewest free workers that
                      holds its gang whole (best fit), so a pair's two jobs never straddle servers
                      and whole servers stay free for the next pair; then single jobs, each on
                      the best-fitting server the same way (servers already partly used first,
                      keeping whole ones for pairs), else consolidated
    checkpoint_local  gangs that ran before first, each taking its previous workers still free,
                      then other free workers on the servers it ran on (its checkpoint is
                      there: no copy over the network), then consolidated; the others
                      consolidated. A gang that ran on another type gets no preference

None takes parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

from mechanism_service.core.seams.placement import Gang, PlacementRequest


def _no_params(params: dict[str, str], name: str) -> None:
    if params:
        raise TypeError(f"{name}: takes no parameters (got {', '.join(sorted(params))})")


class _Free:
    """The free workers of one type, by server, as gangs take them."""

    def __init__(self, request: PlacementRequest) -> None:
        self.servers = [list(s) for s in request.free]

    def take(self, k: int, count: int) -> list[int]:
        taken, self.servers[k] = self.servers[k][:count], self.servers[k][count:]
        return taken

    def take_worker(self, worker: int) -> bool:
        for server in self.servers:
            if worker in server:
                server.remove(worker)
                return True
        return False

    def lowest(self, count: int) -> list[int]:
        """``count`` workers, lowest server first: Gavel's consolidation."""
        workers: list[int] = []
        for k in range(len(self.servers)):
            if len(workers) == count:
                break
            workers += self.take(k, count - len(workers))
        return workers

    def best_fit(self, count: int) -> int | None:
        """The server with the fewest free workers that still holds ``count`` (ties: lowest)."""
        fits = [(len(s), k) for k, s in enumerate(self.servers) if len(s) >= count]
        return min(fits)[1] if fits else None


class Consolidated:
    """Gavel's consolidation: each gang, largest first, takes the lowest free workers."""

    def __init__(self, **params: str) -> None:
        _no_params(params, "consolidated")

    def place(self, request: PlacementRequest) -> list[tuple[int, ...]]:
        free = _Free(request)
        return [tuple(free.lowest(gang.gpus)) for gang in request.gangs]


class Spread:
    """Each gang takes one worker at a time from the server with the most free workers."""

    def __init__(self, **params: str) -> None:
        _no_params(params, "spread")

    def place(self, request: PlacementRequest) -> list[tuple[int, ...]]:
        free = _Free(request)
        out = []
        for gang in request.gangs:
            workers = []
            for _ in range(gang.gpus):
                k = max(range(len(free.servers)), key=lambda j: (len(free.servers[j]), -j))
                workers += free.take(k, 1)
            out.append(tuple(workers))
        return out


class PackingAware:
    """Pairs first, each whole on its best-fitting server; then singles the same way."""

    def __init__(self, **params: str) -> None:
        _no_params(params, "packing_aware")

    def place(self, request: PlacementRequest) -> list[tuple[int, ...]]:
        free = _Free(request)
        out: dict[int, tuple[int, ...]] = {}
        order = sorted(range(len(request.gangs)), key=lambda g: not request.gangs[g].packed)  # stable: pairs first
        for g in order:
            gpus = request.gangs[g].gpus
            k = free.best_fit(gpus)
            out[g] = tuple(free.take(k, gpus) if k is not None else free.lowest(gpus))
        return [out[g] for g in range(len(request.gangs))]


class CheckpointLocal:
    """Gangs that ran on this type first: their old workers, then their old servers."""

    def __init__(self, **params: str) -> None:
        _no_params(params, "checkpoint_local")

    def place(self, request: PlacementRequest) -> list[tuple[int, ...]]:
        free = _Free(request)
        out: dict[int, tuple[int, ...]] = {}
        gangs = request.gangs
        local = [g for g in range(len(gangs)) if gangs[g].last_type == request.accelerator_type and gangs[g].last_workers]
        for g in local:
            out[g] = tuple(self._near(request, free, gangs[g]))
        for g in range(len(gangs)):
            if g not in out:
                out[g] = tuple(free.lowest(gangs[g].gpus))
        return [out[g] for g in range(len(gangs))]

    @staticmethod
    def _near(request: PlacementRequest, free: _Free, gang: Gang) -> Sequence[int]:
        workers: list[int] = []
        for w in gang.last_workers:
            if len(workers) < gang.gpus and free.take_worker(w):
                workers.append(w)
        servers = dict.fromkeys(k for w in gang.last_workers if (k := request.server_of(w)) is not None)
        for k in servers:
            if len(workers) < gang.gpus:
                workers += free.take(k, gang.gpus - len(workers))
        if len(workers) < gang.gpus:
            workers += free.lowest(gang.gpus - len(workers))
        return workers


PLACEMENT_BUILTINS = {
    "consolidated": Consolidated,
    "spread": Spread,
    "packing_aware": PackingAware,
    "checkpoint_local": CheckpointLocal,
}
DEFAULT_PLACEMENT = "consolidated"
