"""Gandiva as Gavel's simulator runs it (commit c4fa400), for the `gavel` preset
(docs/gavel-semantics.md section 9.2): pairs persist between solves while both jobs remain and
the pair's normalised throughput (packed / alone, summed over both jobs and every type) is at
least 1; when the cluster is oversubscribed the unpaired jobs are paired at random, Python's
``random.Random(seed).sample`` deciding, and every combination gets an equal share.

Assignments and the Mersenne Twister's state travel as ``policy_state`` JSON, so the service
stays stateless and a run matches Gavel draw for draw.
"""

from __future__ import annotations

import json
import random

import numpy as np

from policy_service.core.problem import Problem


def _normalised(problem: Problem, a: int, b: int) -> float:
    index, packed = problem.colocation.job_pair_throughputs(np.array([a]), np.array([b]))
    if index[0] < 0:
        return 0.0
    total = 0.0
    for k in range(problem.num_types):
        for member, job in enumerate((a, b)):
            rate = packed[0, k, member]
            if rate <= 0.0:
                return 0.0
            total += rate / problem.throughputs_steps_per_s[job, k]
    return total


def gavel_gandiva(problem: Problem, seed: int) -> tuple[np.ndarray, list[tuple[int, int]], np.ndarray, str]:
    """(single fractions (n, K), chosen pairs as row pairs, their fractions (P, K), new state)."""
    rng = random.Random(seed)
    partner_of: dict[str, str | None] = {}  # job -> partner (None: alone), in assignment order
    if problem.policy_state:
        data = json.loads(problem.policy_state)
        version, internal, gauss = data["rng"]
        rng.setstate((version, tuple(internal), gauss))
        partner_of = {job: partner for job, partner in data["assigned"]}
    row = {job_id: j for j, job_id in enumerate(problem.job_ids)}
    n, num_types = problem.num_jobs, problem.num_types

    # Drop assignments whose job or partner left, and every pair that no longer pays off (a job
    # alone scores 0, so singles are always re-decided).
    drop: list[str] = []
    for job, partner in partner_of.items():
        if job not in row or (partner is not None and partner not in row):
            drop += [job, partner] if partner is not None else [job]
        elif partner is None or _normalised(problem, row[job], row[partner]) < 1.0:
            drop += [job, partner] if partner is not None else [job]
    for job in drop:
        partner_of.pop(job, None)

    counts = problem.worker_counts.astype(float)
    singles = np.zeros((n, num_types))
    pairs: list[tuple[int, int]] = []
    if problem.scale_factors.sum() <= counts.sum():
        combos: list[tuple[int, ...]] = [(j,) for j in range(n)]
    else:
        waiting = [job_id for job_id in problem.job_ids if job_id not in partner_of]
        for _ in range(len(waiting)):
            if len(waiting) < 2:
                break
            a, b = rng.sample(waiting, 2)
            if problem.scale_factors[row[a]] != problem.scale_factors[row[b]]:
                continue
            waiting.remove(a)
            waiting.remove(b)
            partner_of[a], partner_of[b] = b, a
        for job in waiting:
            partner_of[job] = None
        seen: set[tuple[int, ...]] = set()
        combos = []
        for job, partner in partner_of.items():
            combo = (row[job],) if partner is None else tuple(sorted((row[job], row[partner])))
            if combo not in seen:
                seen.add(combo)
                combos.append(combo)
    share = counts / len(combos) if combos else counts
    pair_rows = []
    for combo in combos:
        x = share / problem.scale_factors[combo[0]]
        x = x / max(1.0, x.sum())
        if len(combo) == 1:
            singles[combo[0]] = x
        else:
            pairs.append(combo)  # type: ignore[arg-type]
            pair_rows.append(x)
    version, internal, gauss = rng.getstate()
    state = json.dumps({"assigned": list(partner_of.items()), "rng": [version, list(internal), gauss]})
    return singles, pairs, np.asarray(pair_rows).reshape(len(pairs), num_types), state
