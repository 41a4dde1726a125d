"""A placement plug-in: each gang on as few servers as it can.

Gavel's consolidation takes the lowest free workers, so a 4-GPU gang facing servers with 2, 3
and 4 free workers spans two servers (2 + 2) although one holds it whole. Here each gang, largest
first, takes the servers with the most free workers first (ties: the lower server), filling each
before the next: that gang gets the third server alone, and its all-reduce stays inside one
machine. Small jobs then land on the servers already partly used.
"""

from __future__ import annotations

from mechanism_service.core.seams.placement import PlacementRequest


class FewestServers:
    """Each gang on the servers with the most free workers, filled one after another."""

    def __init__(self, **params: str) -> None:
        if params:
            raise TypeError(f"fewest_servers takes no parameters (got {', '.join(sorted(params))})")

    def place(self, request: PlacementRequest) -> list[tuple[int, ...]]:
        free = [list(server) for server in request.free]
        placed = []
        for gang in request.gangs:  # largest first, as the mechanism orders them
            workers: list[int] = []
            for k in sorted(range(len(free)), key=lambda k: (-len(free[k]), k)):
                if len(workers) == gang.gpus:
                    break
                taken, free[k] = free[k][: gang.gpus - len(workers)], free[k][gang.gpus - len(workers):]
                workers += taken
            placed.append(tuple(workers))
        return placed
