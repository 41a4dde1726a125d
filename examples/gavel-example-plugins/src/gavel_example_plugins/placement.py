"""A placement plug-in: each gang on as few servers as it can, without fragmenting the others.

Gavel's consolidation (the gavel preset) takes the lowest free workers, so a 4-GPU gang facing
servers with 2, 3 and 4 free workers spans two servers (2 + 2) although one holds it whole; the
default preset takes the first server that holds a gang whole (first fit), which can break up an
empty server while a fuller one had room. Here each gang, largest first, goes whole to the server
with the fewest free workers that still holds it (best fit: the emptier servers stay whole for
the next large gang); a gang no server holds takes the servers with the most free workers first,
so it spans as few as it can.
"""

from __future__ import annotations

from mechanism_service.core.seams.placement import PlacementRequest


class FewestServers:
    """Best fit on one server, else the fewest servers: the ones with the most free workers."""

    def __init__(self, **params: str) -> None:
        if params:
            raise TypeError(f"fewest_servers takes no parameters (got {', '.join(sorted(params))})")

    def place(self, request: PlacementRequest) -> list[tuple[int, ...]]:
        free = [list(server) for server in request.free]
        placed = []
        for gang in request.gangs:  # largest first, as the mechanism orders them
            fits = [(len(server), k) for k, server in enumerate(free) if len(server) >= gang.gpus]
            if fits:
                order = [min(fits)[1]]  # the fullest server that holds it (ties: the lower)
            else:
                order = sorted(range(len(free)), key=lambda k: (-len(free[k]), k))
            workers: list[int] = []
            for k in order:
                wanted = gang.gpus - len(workers)
                workers += free[k][:wanted]
                free[k] = free[k][wanted:]
                if len(workers) == gang.gpus:
                    break
            placed.append(tuple(workers))
        return placed
