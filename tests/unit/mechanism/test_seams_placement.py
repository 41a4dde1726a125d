"""The placement seam (core/seams/placement.py): each built-in strategy on one hand-made type, the
mechanism's side (extensions kept whatever the strategy, the answer checked), and a strategy that
raises or answers wrong giving its round to consolidated with the reason."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from mechanism_service.core.model import Placement
from mechanism_service.core.rounds import open_round
from mechanism_service.core.seams.chosen import Chosen
from mechanism_service.core.seams.placement import (
    Gang,
    PlacementRequest,
    answer_problem,
)
from mechanism_service.core.seams.placement_builtins import (
    PLACEMENT_BUILTINS,
    CheckpointLocal,
    Consolidated,
    PackingAware,
    Spread,
)
from tests.unit.mechanism.builders import GAVEL, no_shuffle, state

# One v100 type of three 4-GPU servers; some workers busy (lease extensions): free are
# server 0: 3; server 1: 4 5 6 7; server 2: 10 11.
SERVERS = ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11))
FREE = ((3,), (4, 5, 6, 7), (10, 11))
GANGS = (
    Gang(("p", "q"), 2),  # a packed pair on 2 GPUs
    Gang(("x",), 2),
    Gang(("y",), 1, last_type="v100", last_workers=(10,)),  # its checkpoint is on server 2
)
REQUEST = PlacementRequest("v100", SERVERS, FREE, GANGS)


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        # the lowest free workers, gang after gang: the pair straddles servers 0 and 1
        (Consolidated(), [(3, 4), (5, 6), (7,)]),
        # a worker at a time from the server with most free (ties: the lowest): free counts
        # 1/4/2 -> the pair takes 4 then 5 (1/2/2) -> x takes 6 (tie, server 1) then 10 -> y takes 3
        (Spread(), [(4, 5), (6, 10), (3,)]),
        # the pair first on the best fit (fewest free that holds 2: server 2), then x (only
        # server 1 holds 2), then y on the fullest server with room (server 0)
        (PackingAware(), [(10, 11), (4, 5), (3,)]),
        # y first, on its old worker 10; the others consolidated around it
        (CheckpointLocal(), [(3, 4), (5, 6), (10,)]),
    ],
)
def test_each_builtin_places_the_hand_made_type(strategy, expected):
    answer = [tuple(w) for w in strategy.place(REQUEST)]
    assert answer == expected
    assert answer_problem(REQUEST, answer) == ""


def test_checkpoint_local_prefers_the_old_server_when_the_old_worker_is_taken():
    """z ran on worker 9 (server 2), now busy: its checkpoint's server still has 10 and 11."""
    request = PlacementRequest("v100", SERVERS, FREE, (Gang(("z",), 2, "v100", (9, 8)),))
    assert [tuple(w) for w in CheckpointLocal().place(request)] == [(10, 11)]
    elsewhere = PlacementRequest("v100", SERVERS, FREE, (Gang(("z",), 2, "k80", (10, 11)),))  # ran on another type
    assert [tuple(w) for w in CheckpointLocal().place(elsewhere)] == [(3, 4)]


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ([(3, 4), (5, 6)], "2 placements for 3 gangs"),
        ([(3,), (5, 6), (7,)], "p+q: 1 workers for a gang of 2"),
        ([(3, 4), (4, 6), (7,)], "x: worker 4 given twice"),
        ([(3, 4), (5, 6), (0,)], "y: worker 0 is not free on v100"),
        ([(3, 4), (5, "6"), (7,)], "x: worker '6' is not free on v100"),
        (7, "not a sequence of worker ids per gang (a int)"),
    ],
)
def test_an_answer_is_checked(answer, problem):
    assert answer_problem(REQUEST, answer) == problem


class Raising:
    def place(self, request):
        raise RuntimeError("boom")


class Exiting:
    def place(self, request):
        sys.exit(3)  # a plug-in's bug: it must cost the round's placement, not the mechanism


class Overlapping:
    """Gives every gang the first free workers: two gangs share them."""

    def place(self, request):
        first = [w for server in request.free for w in server]
        return [first[: g.gpus] for g in request.gangs]


def _two_servers():
    """k80: two 2-GPU servers (workers 0 1 | 2 3); j0 ran on worker 3 last round; j1 and j2 new."""
    return (
        state(gpus_per_server=2, k80=4)
        .job("a").job("a", scale_factor=2).job("a")
        .allocate((0,), k80=0.5).allocate((1,), k80=0.5).allocate((2,), k80=0.5)
        .type_time(k80=360.0)
        .ran((0,), "k80", 3)
        .build()
    )


def test_a_strategy_never_moves_a_lease_extension_and_places_the_rest():
    plan = open_round(_two_servers(), 360.0, GAVEL, no_shuffle, chosen=Chosen(placement=Spread(), placement_name="spread"))
    assert plan.assignment[(0,)] == Placement("k80", (3,))  # kept: its workers are free
    # free: server 0 has 0 1, server 1 has 2; the 2-GPU gang takes 0 (the most free), then 1 (a
    # tie at one each: the lower server); j2 takes what is left
    assert plan.assignment[(1,)] == Placement("k80", (0, 1))
    assert plan.assignment[(2,)] == Placement("k80", (2,))
    assert plan.seam_errors == ()


@pytest.mark.parametrize("strategy", [Raising(), Exiting(), Overlapping()])
def test_a_strategy_that_raises_or_answers_wrong_gives_the_round_to_consolidated(strategy):
    default = open_round(_two_servers(), 360.0, GAVEL, no_shuffle)
    plan = open_round(_two_servers(), 360.0, GAVEL, no_shuffle, chosen=Chosen(placement=strategy, placement_name="bad"))
    assert plan.assignment == default.assignment  # the round goes on, placed as Gavel places it
    assert [seam for seam, _ in plan.seam_errors] == ["placement"]
    reason = plan.seam_errors[0][1]
    expected = {Raising: "k80: raised RuntimeError: boom", Exiting: "k80: raised SystemExit: 3"}.get(type(strategy))
    assert reason == expected if expected else "given twice" in reason


class Lazy:
    """Spread's answer as generators, a gang's workers too: a Sequence in spirit, read once."""

    def place(self, request):
        return (iter(workers) for workers in Spread().place(request))


def test_a_strategy_answering_with_generators_places_as_with_lists():
    """The answer is read once: checked and used as the same values (a generator passed the
    check, which used it up, and then placed no gang)."""
    lists = open_round(_two_servers(), 360.0, GAVEL, no_shuffle, chosen=Chosen(placement=Spread(), placement_name="spread"))
    lazy = open_round(_two_servers(), 360.0, GAVEL, no_shuffle, chosen=Chosen(placement=Lazy(), placement_name="lazy"))
    assert lazy.assignment == lists.assignment and lazy.seam_errors == ()


def test_consolidated_as_a_strategy_places_as_gavels_own_code():
    """Extensions first (the default preset's order), then the lowest free workers: the built-in
    through the seam and the mechanism's own placement agree."""
    settings = dataclasses.replace(GAVEL, extensions_first=True)
    own = open_round(_two_servers(), 360.0, settings, no_shuffle)
    through = open_round(_two_servers(), 360.0, settings, no_shuffle, chosen=Chosen(placement=Consolidated()))
    assert through.assignment == own.assignment


def test_the_builtins_are_named_as_the_flags_name_them():
    assert sorted(PLACEMENT_BUILTINS) == ["checkpoint_local", "consolidated", "packing_aware", "spread"]
    with pytest.raises(TypeError, match="spread: takes no parameters"):
        Spread(x="1")
