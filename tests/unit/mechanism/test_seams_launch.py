"""The launch seam (core/seams/launch.py): the candidates a strategy sees, non_preemptive keeping
a running job on its GPUs where the pick would preempt it, and a bad answer launching the pick."""

from __future__ import annotations

import pytest

from mechanism_service.core.model import Placement
from mechanism_service.core.rounds import open_round
from mechanism_service.core.seams.chosen import Chosen
from mechanism_service.core.seams.launch import Candidate, LaunchView, answer_problem
from mechanism_service.core.seams.launch_builtins import NonPreemptive, Priority
from tests.unit.mechanism.builders import GAVEL, no_shuffle, state


def _preempting():
    """One k80. j0 ran on it last round and has had its share; j1 waits with a high priority: the
    pick gives the GPU to j1 (j0 is preempted)."""
    return (
        state(k80=1).job("a").job("a")
        .allocate((0,), k80=0.5).allocate((1,), k80=0.5)
        .type_time(k80=720.0).received((0,), k80=540.0).received((1,), k80=180.0)
        .ran((0,), "k80", 0)
        .build()
    )


class Recording:
    def __init__(self):
        self.views = []

    def launch(self, view):
        self.views.append(view)
        return Priority().launch(view)


def test_the_pick_preempts_and_the_strategy_sees_both_candidates():
    recording = Recording()
    default = open_round(_preempting(), 360.0, GAVEL, no_shuffle)
    plan = open_round(_preempting(), 360.0, GAVEL, no_shuffle, chosen=Chosen(launch=recording))
    assert default.assignment == plan.assignment == {(1,): Placement("k80", (0,))}
    (view,) = recording.views
    assert view == LaunchView(
        {"k80": 1},
        {"k80": (Candidate(0, ("j1",), 1, "k80", picked=True, running=False),
                 Candidate(1, ("j0",), 1, "k80", picked=False, running=True))},
    )


def test_non_preemptive_keeps_the_running_job_on_its_gpus():
    plan = open_round(_preempting(), 360.0, GAVEL, no_shuffle, chosen=Chosen(launch=NonPreemptive()))
    assert plan.assignment == {(0,): Placement("k80", (0,))}
    assert plan.kept == frozenset({(0,)}) and plan.seam_errors == ()


class Lazy:
    """NonPreemptive's answer with each type's keys as a generator: read once."""

    def launch(self, view):
        return {w: iter(keys) for w, keys in NonPreemptive().launch(view).items()}


def test_an_answer_of_generators_launches_as_the_same_lists():
    """Checked and used as the same values (the check used the generators up, and the round then
    launched nothing on the type, with no seam error)."""
    plan = open_round(_preempting(), 360.0, GAVEL, no_shuffle, chosen=Chosen(launch=Lazy(), launch_name="lazy"))
    assert plan.assignment == {(0,): Placement("k80", (0,))} and plan.seam_errors == ()


class TooMany:
    def launch(self, view):
        return {w: [c.key for c in cs] for w, cs in view.candidates.items()}


class Raising:
    def launch(self, view):
        raise KeyError("x")


@pytest.mark.parametrize(("strategy", "error"), [(TooMany(), "k80: 2 GPUs launched, 1 free"), (Raising(), "raised KeyError: 'x'")])
def test_a_bad_answer_launches_the_pick_as_it_is(strategy, error):
    plan = open_round(_preempting(), 360.0, GAVEL, no_shuffle, chosen=Chosen(launch=strategy, launch_name="bad"))
    assert plan.assignment == {(1,): Placement("k80", (0,))}
    assert plan.seam_errors == (("launch", error),)


def test_an_answer_is_checked():
    view = LaunchView({"k80": 1}, {"k80": (Candidate(0, ("j1",), 1, "k80", True, False),)})
    assert answer_problem(view, {"k80": [0]}) == ""
    assert answer_problem(view, {"k80": [5]}) == "k80: 5 is not a candidate there"
    assert answer_problem(view, {"v100": [0]}) == "no candidates on 'v100'"
    assert answer_problem(view, [0]) == "not a mapping of type -> candidate keys (a list)"
