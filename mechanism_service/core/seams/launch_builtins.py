"""The built-in launch strategies (the seam: core/seams/launch.py).

    priority        the greedy pick launches as it is: a running entry not picked is preempted
                    (Gavel's; the default, and the mechanism then skips the call)
    non_preemptive  a running entry keeps running: every entry that ran last round is launched
                    again on its type first (its lease extended when its workers are free), then
                    the picked entries in pick order that still fit and share no job with those
                    (Tiresias' and Gandiva's no-preemption baseline)
"""

from __future__ import annotations

from collections.abc import Mapping

from mechanism_service.core.seams.launch import LaunchView


def _no_params(params: Mapping[str, str], name: str) -> None:
    if params:
        raise TypeError(f"{name}: takes no parameters (got {', '.join(sorted(params))})")


class Priority:
    def __init__(self, **params: str) -> None:
        _no_params(params, "priority")

    def launch(self, view: LaunchView) -> dict[str, list[int]]:
        return {w: [c.key for c in candidates if c.picked] for w, candidates in view.candidates.items()}


class NonPreemptive:
    def __init__(self, **params: str) -> None:
        _no_params(params, "non_preemptive")

    def launch(self, view: LaunchView) -> dict[str, list[int]]:
        chosen: dict[str, list[int]] = {w: [] for w in view.candidates}
        left = dict(view.free_gpus)
        jobs: set[str] = set()
        for w, candidates in view.candidates.items():  # every running entry first, on every type
            for c in candidates:
                if c.running and c.gpus <= left.get(w, 0) and jobs.isdisjoint(c.job_ids):
                    chosen[w].append(c.key)
                    left[w] -= c.gpus
                    jobs.update(c.job_ids)
        for w, candidates in view.candidates.items():
            for c in candidates:
                if c.picked and c.key not in chosen[w] and c.gpus <= left.get(w, 0) and jobs.isdisjoint(c.job_ids):
                    chosen[w].append(c.key)
                    left[w] -= c.gpus
                    jobs.update(c.job_ids)
        return chosen


LAUNCH_BUILTINS = {"priority": Priority, "non_preemptive": NonPreemptive}
DEFAULT_LAUNCH = "priority"
