"""What the mechanism makes of a registration under a worker id it may already hold (issue 23)."""

from __future__ import annotations

import pytest

from mechanism_service.core.membership import Held, Verdict, beats_for, refusal, replacement, verdict

K80 = Held("k80", 1, "i1")
LEGACY = Held("k80", 1, "")


@pytest.mark.parametrize(
    ("held", "shape", "instance", "expected"),
    [
        (None, ("v100", 1), "i9", Verdict.JOIN),  # never joined, or lost
        (None, ("v100", 1), "", Verdict.JOIN),
        (K80, ("k80", 1), "i1", Verdict.REPEAT),  # its own re-announcement
        (K80, ("k80", 1), "i2", Verdict.REPLACE),  # a restart: it holds the claim, the old one is gone
        (K80, ("v100", 4), "i2", Verdict.REPLACE),  # a restart as another shape holds the claim too
        (LEGACY, ("k80", 1), "", Verdict.REPEAT),  # workers before instances, as they always were
        (LEGACY, ("v100", 1), "", Verdict.REFUSE),  # the phantom of the issue: no second server
        (K80, ("k80", 1), "", Verdict.REFUSE),  # cannot show it holds the claim
        (LEGACY, ("k80", 1), "i2", Verdict.REPLACE),  # an upgraded worker restarted
    ],
)
def test_verdicts(held: Held | None, shape: tuple[str, int], instance: str, expected: Verdict) -> None:
    assert verdict(held, *shape, instance) is expected


def test_only_the_held_process_keeps_a_worker_alive() -> None:
    assert beats_for(K80, "i1")
    assert not beats_for(K80, "i2")  # a second process's heartbeats keep nothing alive
    assert not beats_for(K80, "")
    assert beats_for(LEGACY, "")
    assert not beats_for(None, "i1")


def test_reasons_name_both_shapes() -> None:
    assert refusal("k80-0", K80, "v100", 1) == (
        "worker id 'k80-0' is held by a k80 worker with 1 GPU(s); a registration as v100 with 1 GPU(s) that does not "
        "say which process it is (a worker from before instances) cannot take it while that one is alive: give it its "
        "own --worker-id, or stop the other and wait until it is declared lost (--worker-grace-s)"
    )
    assert replacement(K80, "k80", 1, "i2") == "a new process of this worker (instance i2) took its place"
    assert replacement(K80, "v100", 2, "i2") == (
        "a new process of this worker (instance i2) took its place, now as v100 with 2 GPU(s) (was k80 with 1)"
    )
