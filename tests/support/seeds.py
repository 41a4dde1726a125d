"""How many seeds a seed sweep runs (tests/README.md, "Two tiers"): under `make test` the first
`quick` of them, a representative subset; under `make test-deep` (GAVEL_DEEP_TESTS=1) all `full`.
A sweep's test carries the `deep` mark, so that `make test-deep` finds it; its coverage checks
("both ways were taken") are written per seed run (`len(seeds)`), so they hold in both tiers."""

from __future__ import annotations

import os

DEEP_ENV = "GAVEL_DEEP_TESTS"


def deep() -> bool:
    """Whether the full sweeps run (`make test-deep`, or GAVEL_DEEP_TESTS=1 with any command)."""
    return os.environ.get(DEEP_ENV, "") == "1"


def sweep(full: int, quick: int) -> range:
    """The seeds of a sweep: range(full) in the deep tier, range(quick) otherwise."""
    assert 0 < quick <= full
    return range(full if deep() else quick)
