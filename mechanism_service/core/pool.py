"""The workers the mechanism holds: who may join and why not, a join, a loss. Pure: each function
changes the memory and returns what the shell must say or send (docs/mechanism.md, "Workers that
fail, jobs that crash")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.messages import KillJobs, WorkerIdInUse, WorkerRegistered
from mechanism_service.core import membership
from mechanism_service.core.leases import round_complete, workers_of
from mechanism_service.core.model import MechanismState, new_state
from mechanism_service.core.rates import Rates
from mechanism_service.core.servers import add_server, remove_server
from mechanism_service.core.settings import MechanismSettings

if TYPE_CHECKING:
    from mechanism_service.core.memory import Memory

MAX_WORKER_GPUS = 1024
ANOTHER_PROCESS = " (another process, on "  # workers_refused: "<id> (another process, on <host>)"


def held(memory: Memory, worker_id: str) -> membership.Held | None:
    """The worker joined under this id (None: none, or it was declared lost)."""
    for accelerator_type, servers in memory.servers.items():
        for known, gpus in servers:
            if known == worker_id:
                return membership.Held(accelerator_type, gpus, memory.instances.get(worker_id, ""))
    return None


def worker_problem(w: WorkerRegistered, gpus_per_server: int, clock_name: str) -> str:
    """Why this worker cannot join ("" when it can). ``clock_name``: the clock the mechanism's
    rounds run on ("": not checked, virtual time in one process)."""
    if not w.worker_id or not w.accelerator_type:
        return "a worker needs an id and an accelerator type"
    if not 1 <= w.gpu_count <= MAX_WORKER_GPUS or w.gpu_count % gpus_per_server:
        return (
            f"worker {w.worker_id!r} has {w.gpu_count} GPUs; this mechanism places gangs on servers of "
            f"{gpus_per_server} GPU(s) (--gpus-per-server), so a worker needs a positive multiple of that"
        )
    if w.clock and clock_name and w.clock != clock_name:
        return (
            f"worker {w.worker_id!r} runs on the {w.clock} clock and this mechanism on the {clock_name} "
            "clock, so its leases would never end when rounds do: start both with the same --time-scale "
            "(or both with --lockstep, or neither)"
        )
    return ""


def note_id_in_use(memory: Memory, w: WorkerIdInUse) -> bool:
    """A second process tried to start as a live worker and was refused at the broker: listed
    under workers_refused, once per host and shape. Whether it is new (the shell says so)."""
    key = f"{w.worker_id}{ANOTHER_PROCESS}{w.host or 'an unknown host'})"
    why = f"{w.accelerator_type} with {w.gpu_count} GPU(s): {w.reason}"
    if memory.refused_workers.get(key) == why:
        return False
    memory.refused_workers[key] = why
    return True


def forget_id_conflicts(memory: Memory, worker_id: str) -> None:
    """A second process's attempt on an id is moot once the id's holder is another process
    (a restart) or gone: `gavel workers` stops listing it."""
    refused = memory.refused_workers
    for key in [k for k in refused if k.startswith(f"{worker_id}{ANOTHER_PROCESS}")]:
        del refused[key]


def join(memory: Memory, w: WorkerRegistered, settings: MechanismSettings, rates: Rates) -> str:
    """The worker joins: "worker_joined" or "worker_rejoined" (a lost worker back, as a new
    server) when it joined a running cluster, "" before the first boundary (the state is made
    then, from every worker registered)."""
    memory.servers[w.accelerator_type].append((w.worker_id, w.gpu_count))
    memory.instances[w.worker_id] = w.instance
    forget_id_conflicts(memory, w.worker_id)
    rejoined = memory.lost_workers.pop(w.worker_id, None) is not None
    if memory.state is None:
        return ""
    ids = add_server(memory.state, w.accelerator_type, w.gpu_count, settings, rates)
    memory.worker_of.update({gpu: (w.worker_id, k) for k, gpu in enumerate(ids)})
    return "worker_rejoined" if rejoined else "worker_joined"


@dataclass(frozen=True, slots=True)
class Loss:
    """What a worker's loss did: its GPUs, the running round's leases it ended, the kills for
    the other workers of their gangs, and whether the round waited only for it."""

    gpus: int
    ended: tuple[str, ...]
    kills: tuple[KillJobs, ...]
    round_complete: bool


def lose(memory: Memory, worker_id: str, reason: str, now_s: float) -> Loss | None:
    """The worker's GPUs leave (core/servers.remove_server); its leases in the running round end
    now, with what they reported so far; the allocation is solved again at the next boundary.
    None: it is not registered (lost already)."""
    found = next(((w, count) for w, servers in memory.servers.items() for known, count in servers if known == worker_id), None)
    if found is None:
        return None
    accelerator_type, gpus = found
    memory.servers[accelerator_type].remove((worker_id, gpus))
    memory.last_heard_s.pop(worker_id, None)
    memory.instances.pop(worker_id, None)
    forget_id_conflicts(memory, worker_id)
    memory.lost_workers[worker_id] = {"accelerator_type": accelerator_type, "gpus": gpus, "lost_at_s": now_s, "reason": reason}
    gone = sorted(g for g, (known, _) in memory.worker_of.items() if known == worker_id)
    ended: list[str] = []
    kills: list[KillJobs] = []
    for lease_id, lease in memory.expected.items():
        if lease_id in memory.ended_leases or not set(gone).intersection(lease.placement.worker_ids):
            continue
        if len(memory.reports.get(lease_id, [])) >= len(lease.entry):
            continue  # reported in full before the loss: settled as it is
        memory.ended_leases[lease_id] = f"worker {worker_id} lost: {reason}"
        ended.append(lease_id)
        kills += [
            KillJobs(other, memory.round_id - 1, lease_id, memory.epoch, f"worker {worker_id} of this gang was lost")
            for other, _ in workers_of(memory.worker_of, lease.placement)
            if other != worker_id
        ]
    if memory.state is not None and gone:
        remove_server(memory.state, accelerator_type, gone)
        memory.resolve_now = True
    for gpu in gone:
        del memory.worker_of[gpu]
    return Loss(gpus, tuple(ended), tuple(kills), bool(memory.expected) and round_complete(memory))


def gpus_by_type(memory: Memory) -> dict[str, int]:
    """The GPUs registered, per type (a type whose workers all left: 0)."""
    return {w: sum(g for _, g in servers) for w, servers in memory.servers.items()}


def types_here(memory: Memory, elastic_types: tuple[str, ...]) -> tuple[str, ...]:
    """The types a job may run on: those here, and any that may join."""
    servers = (w for w, registered in memory.servers.items() if registered)
    return tuple(dict.fromkeys([*servers, *elastic_types]))


def ensure_state(memory: Memory, gpus_per_server: int) -> tuple[MechanismState, bool]:
    """The state, made at the first boundary from the workers registered (and whether it was
    made now): GPU ids as new_state numbers them, types in sorted order, servers as registered."""
    if memory.state is not None:
        return memory.state, False
    gpus = {w: sum(g for _, g in servers) for w, servers in memory.servers.items() if servers}
    state = memory.state = new_state(gpus, gpus_per_server)
    for w in state.gpus:
        gpu_ids = (i for server in state.servers[w] for i in server)
        for worker_id, count in memory.servers[w]:
            for k in range(count):
                memory.worker_of[next(gpu_ids)] = (worker_id, k)
    return state, True
