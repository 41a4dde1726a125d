"""Which workers are lost: a pure function of when each was last heard, the grace and now.

A worker is watched once it has sent a heartbeat (WorkerHeartbeat); simulated fleets only
re-announce their registration and are never watched. The decision depends on time, so the shell
journals it as an input: a replay applies the journaled decision instead of deciding again.
"""

from __future__ import annotations

from collections.abc import Mapping

# The watchdog wakes this fraction of the grace after the earliest deadline, so that the worker
# due then is silent for *longer* than the grace when it looks (and a float tie cannot spin it).
WAKE_MARGIN = 0.01


def silent_workers(last_heard_s: Mapping[str, float], grace_s: float, now_s: float) -> list[str]:
    """The watched workers silent for longer than ``grace_s`` at ``now_s``: longest silent first,
    ties by id (the order they are declared lost in, and journaled)."""
    return sorted((w for w, heard_s in last_heard_s.items() if now_s - heard_s > grace_s), key=lambda w: (last_heard_s[w], w))


def next_check_s(last_heard_s: Mapping[str, float], grace_s: float, now_s: float) -> float:
    """How long the watchdog may sleep: until just after the earliest deadline, or a grace when
    nobody is watched. A heartbeat only moves deadlines later, and a worker first heard now is due
    after every other, so no deadline can come before this."""
    margin_s = grace_s * WAKE_MARGIN
    if not last_heard_s:
        return grace_s + margin_s
    earliest_s = min(last_heard_s.values()) + grace_s
    return max(earliest_s - now_s, 0.0) + margin_s


def silence_reason(heard_s: float, grace_s: float, now_s: float) -> str:
    return f"no heartbeat for {now_s - heard_s:.1f} s (grace {grace_s:g} s)"
