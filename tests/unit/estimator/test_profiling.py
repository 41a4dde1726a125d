"""What the estimator asks to be measured, and in what order (estimator_service/core/profiling.py):
runs alone before anyone's packed runs, a new class packed with itself, reference cells spread over
every type."""

from __future__ import annotations

import math

from common.messages import JobProgress, JobSpec, ProfileCell
from estimator_service.core.estimator import Estimator
from estimator_service.core.reference import class_of, reference_set
from estimator_service.core.settings import EstimatorSettings
from policy_service.service import shipped_context

TABLE = shipped_context().table
NEW = ("ResNet-50 (batch size 64)", "Transformer (batch size 32)")  # left out of the reference set
TYPES = ("k80", "p100", "v100")
LEASES = iter(range(10**9))


def estimator() -> Estimator:
    return Estimator(reference_set(TABLE, exclude=list(NEW)), EstimatorSettings(profiling_percentage=0.25))


def measured(job_id: str, job_type: str, accelerator_type: str, partner: str = "") -> JobProgress:
    return JobProgress(
        job_id, f"{accelerator_type}-0", f"lease-{next(LEASES)}", 0, 100, 360.0, TABLE.isolated(job_type, 1, accelerator_type),
        accelerator_type=accelerator_type, packed_with=(partner,) if partner else (),
    )


def requests(e: Estimator) -> dict[str, tuple[ProfileCell, ...]]:
    return {r.job_id: r.cells for r in e.everything().profiling}


def packed(cells: tuple[ProfileCell, ...]) -> list[ProfileCell]:
    return [c for c in cells if c.partner_class]


def test_packed_runs_wait_until_no_new_class_lacks_a_run_alone():
    e = estimator()
    e.submitted(JobSpec("a", NEW[0], 1000))
    e.submitted(JobSpec("b", NEW[1], 1000))
    for w in TYPES:  # workers of every type have reported; class a is measured alone everywhere
        e.progress(measured("a", NEW[0], w))
    asked = requests(e)
    assert "a" not in asked and asked["b"] == tuple(ProfileCell(w) for w in TYPES)  # nothing for a: b runs alone first
    for w in TYPES:
        out = e.progress(measured("b", NEW[1], w))
    changed = {r.job_id: r for r in out.profiling}  # the last run alone opens every class's packed cells
    assert set(changed) == {"a", "b"} and all(packed(r.cells) and r.packed_wanted for r in changed.values())


def test_a_run_alone_that_cannot_be_served_holds_no_one_back():
    """Nobody has reported from a p100: b's run alone there may never be served (the cluster may
    have none), and must not stop a's packed runs for ever."""
    e = estimator()
    e.submitted(JobSpec("a", NEW[0], 1000))
    e.submitted(JobSpec("b", NEW[1], 1000))
    for w in ("k80", "v100"):
        e.progress(measured("a", NEW[0], w))
        e.progress(measured("b", NEW[1], w))
    asked = requests(e)
    assert asked["b"][0] == ProfileCell("p100") and packed(asked["a"]) and packed(asked["b"])


def test_the_reference_cells_cover_every_type_and_a_class_is_packed_with_itself():
    e = estimator()
    e.submitted(JobSpec("a", NEW[0], 1000))
    e.submitted(JobSpec("a2", NEW[0], 1000))
    for w in TYPES:
        e.progress(measured("a", NEW[0], w))
    (request,) = e.everything().profiling
    itself, references = request.cells[: len(TYPES)], request.cells[len(TYPES) :]
    assert itself == tuple(ProfileCell(w, class_of(NEW[0], 1)) for w in TYPES)
    assert {c.accelerator_type for c in references[: len(TYPES)]} == set(TYPES)  # one reference, every type
    num_references = len(e.references.group(1).classes)
    assert request.packed_wanted == len(TYPES) + math.ceil(0.25 * len(TYPES) * num_references)
    # measured packed with itself on the v100 (both jobs report): that cell is no longer asked
    e.progress(measured("a", NEW[0], "v100", partner="a2"))
    e.progress(measured("a2", NEW[0], "v100", partner="a"))
    (request,) = e.everything().profiling
    assert ProfileCell("v100", class_of(NEW[0], 1)) not in request.cells
    assert ProfileCell("k80", class_of(NEW[0], 1)) in request.cells
