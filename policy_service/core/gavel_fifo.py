"""Gavel's heterogeneity-agnostic FIFO exactly as its simulator runs it (commit c4fa400), for the
`gavel` preset (docs/gavel-semantics.md section 9.2). It is stateful and has a bug, and the
recorded results depend on both:

- assignments persist between solves; a job keeps its type until it completes, and the job at
  the head of the queue inherits the type of each job that completed (if it fits there);
- new assignments draw a random candidate type but then use the stale loop variable, the last
  type (by name) of those that still had free GPUs when the pass began; and when a type's free
  count reaches exactly 0 it is the *drawn* candidate that leaves the list, so the real target
  can go negative and soak up the rest of the queue.

The state (assignments, the order jobs were first seen, and the Mersenne Twister's state, since
Gavel draws from Python's ``random.Random(seed)``) travels as ``policy_state`` JSON, so the policy
service stays stateless and a run matches Gavel draw for draw.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import numpy as np

from policy_service.core.problem import Problem


@dataclass
class _State:
    order: list[str]  # every job ever seen, first-seen (= Gavel's id) order
    assigned: dict[str, str]  # job id -> worker type
    rng: random.Random

    @staticmethod
    def load(text: str | None, seed: int) -> _State:
        if not text:
            return _State([], {}, random.Random(seed))
        data = json.loads(text)
        rng = random.Random()
        version, internal, gauss = data["rng"]
        rng.setstate((version, tuple(internal), gauss))
        return _State(list(data["order"]), dict(data["assigned"]), rng)

    def dump(self) -> str:
        version, internal, gauss = self.rng.getstate()
        return json.dumps({"order": self.order, "assigned": self.assigned, "rng": [version, list(internal), gauss]})


def gavel_fifo_fractions(problem: Problem, seed: int) -> tuple[np.ndarray, str]:
    """((n, K) fractions: 1.0 on each assigned job's type, new policy_state)."""
    state = _State.load(problem.policy_state, seed)
    types = list(problem.worker_types)
    column = {w: k for k, w in enumerate(types)}
    row_of = {job_id: j for j, job_id in enumerate(problem.job_ids)}
    known = set(state.order)
    state.order += [job_id for job_id in problem.job_ids if job_id not in known]
    scale = {job_id: int(problem.scale_factors[j]) for job_id, j in row_of.items()}
    tput = problem.throughputs_steps_per_s
    free = {w: int(problem.worker_counts[k]) for k, w in enumerate(types)}

    queue = [job_id for job_id in state.order if job_id in row_of and job_id not in state.assigned]
    for job_id in [j for j in state.order if j in state.assigned]:
        w = state.assigned[job_id]
        if job_id in row_of:
            free[w] -= scale[job_id]
            continue
        # Completed: the head of the queue inherits its type if it fits and can run there.
        if queue:
            head = queue[0]
            if scale[head] <= free[w] and tput[row_of[head], column[w]] > 0:
                queue.pop(0)
                state.assigned[head] = w
                free[w] -= scale[head]
        del state.assigned[job_id]

    open_types = sorted(w for w in free if free[w] > 0)
    while queue and open_types:
        job_id = queue.pop(0)
        candidates = [i for i, w in enumerate(open_types) if free[w] >= scale[job_id]]
        if not candidates:
            break
        drawn = state.rng.randrange(len(candidates))
        w = open_types[-1]  # Gavel's stale loop variable, not the drawn type
        if tput[row_of[job_id], column[w]] > 0:
            state.assigned[job_id] = w
            free[w] -= scale[job_id]
            if free[w] == 0:
                open_types.pop(candidates[drawn])

    fractions = np.zeros((problem.num_jobs, len(types)))
    for job_id, w in state.assigned.items():
        if job_id in row_of:
            fractions[row_of[job_id], column[w]] = 1.0
    state.order = [job_id for job_id in state.order if job_id in row_of or job_id in state.assigned]
    return fractions, state.dump()
