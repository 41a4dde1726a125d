"""How fast the simulated hardware runs a job its throughput table has no figure for (issue 23): a
user's own job type (`gavel submit --job-type my-model`), or a size the table lacks (`--scale-factor
3`). A live cluster accepts both (they are scheduled from estimates); the fake fleet must then run
them at some stated speed, or every lease of theirs would fail. The rule, for a job of type J on n
GPUs (its scale factor) of accelerator type W:

1. the table's figure for (J, n, W) where it has one: every figure of the table stays the truth,
   bit for bit (and `gavel simulate` refuses a trace the table cannot size, so its runs only ever
   take this branch);
2. else the submitter's own figure for W (``JobSpec.throughput_estimate_steps_per_s``, `gavel
   submit --throughput W=...`: the gang's steps/s alone), taken as the truth;
3. else the job's reference row, scaled by what the submitter said of the types they gave: the
   reference on W times the geometric mean, over the types W' they gave a figure > 0 for and the
   reference has > 0, of (their figure on W') / (the reference on W');
4. else the reference on W itself.

The reference of (J, n) on W: the table's own figure for J on W at the nearest size s it has
there (nearest by ratio, n/s or s/n; the smaller at a tie), else the typical job of the nearest
size the table has at all (the geometric mean of its types of that size on W, as
``ThroughputTable.typical_isolated``), times (n/s)^0.75. Gavel's table grows so with the gang's
size: the median exponent over its 666 pairs of sizes of one type on one accelerator type is 0.74,
and each of its figures predicted so from its nearest other size is off by 14% (median), against
22% at the same rate per GPU and 42% unscaled (bench/derived_rates.py).

Packed, two jobs on the same GPUs: two jobs the table has at n on W take the table's pair (0 and 0
where it has no pair: they never progress packed, as before). A pair with a member beyond the table
runs each member at its rate alone (1-4) times the typical fraction the table's pairs keep on W at
the nearest size it packs there: the geometric mean of every member's packed steps/s over its
steps/s alone, counting the pairs that progress (Gavel's table: 0.53 on k80, 0.58 on p100, 0.60 on
v100 for one GPU; its gangs never progress packed, so 0 from 2 GPUs up); 0 where the table packs
nothing on W. The mechanism packs such a job only on the estimator's word (a colocation prior from
the reference set), and the estimator learns the truth from the first packed report.

A 0 (the table's, or the submitter's "W=0", or a reference that is 0 there: the job does not fit)
is a job that cannot run there: its leases make no progress, as a 0 of the table always did, and
the estimator learns it from its reports. Nothing else is unrunnable: every accelerator type a
fleet has is one of its table's (`--cluster` refuses others), so every job has a reference.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from common.throughputs import ThroughputTable, geometric_mean
from sim.physics import true_rates

# Gavel's table: a gang's steps/s grow as about the 0.75th power of its GPUs (module docstring).
SIZE_EXPONENT = 0.75

Estimate = Mapping[str, float]  # accelerator type -> the submitter's steps/s for the gang


@dataclass(frozen=True)
class TableReference:
    """What the rule reads of a table, worked out once per table (lazily: a fleet whose jobs are all
    in its table never builds any of it). ``typical`` and ``fractions`` fill as sizes are asked."""

    table: ThroughputTable
    _typical: dict[int, dict[str, float]] = field(default_factory=dict, compare=False, repr=False)
    _fractions: dict[tuple[int, str], float] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def sizes(self) -> tuple[int, ...]:
        """Every size (scale factor) the table has a figure for."""
        return tuple(sorted({sf for _, sf in self.table.job_keys}))

    @cached_property
    def sizes_on(self) -> Mapping[tuple[str, str], tuple[int, ...]]:
        """(job type, accelerator type) -> the sizes the table has a figure for there."""
        out: dict[tuple[str, str], set[int]] = {}
        for job_type, sf, w in self.table.isolated_steps_per_s:
            out.setdefault((job_type, w), set()).add(sf)
        return {key: tuple(sorted(sizes)) for key, sizes in out.items()}

    @cached_property
    def pair_sizes_on(self) -> Mapping[str, tuple[int, ...]]:
        """Accelerator type -> the sizes the table has pairs of there."""
        out: dict[str, set[int]] = {}
        for _, _, sf, w in self.table.pair_steps_per_s:
            out.setdefault(w, set()).add(sf)
        return {w: tuple(sorted(sizes)) for w, sizes in out.items()}

    def typical(self, size: int, accelerator_type: str) -> float:
        """The typical job of a size the table has, on the type (0 where nothing of it runs)."""
        if size not in self._typical:
            self._typical[size] = self.table.typical_isolated(size)
        return self._typical[size].get(accelerator_type, 0.0)

    def packed_fraction(self, size: int, accelerator_type: str) -> float:
        """The geometric mean of the fractions of their rate alone that the members of the table's
        pairs of this size keep on the type, over those that progress (0 if none does)."""
        key = (size, accelerator_type)
        if key not in self._fractions:
            alone = self.table.isolated_steps_per_s
            fractions = []
            for (a, b, sf, w), (rate_a, rate_b) in self.table.pair_steps_per_s.items():
                if sf == size and w == accelerator_type:
                    for job_type, rate in ((a, rate_a), (b, rate_b)):
                        base = alone.get((job_type, sf, w), 0.0)
                        if base > 0 and rate > 0:
                            fractions.append(rate / base)
            self._fractions[key] = geometric_mean(fractions)
        return self._fractions[key]


def nearest_size(sizes: Sequence[int], n: int) -> int:
    """The size nearest n by ratio (n/s or s/n), the smaller at a tie. ``sizes`` is not empty."""
    return min(sizes, key=lambda s: (abs(math.log(n / s)), s))


def size_rule_errors(reference: TableReference, exponent: float) -> list[float]:
    """|predicted / actual - 1| of each positive figure of the table predicted from its nearest
    other size for its type on its accelerator type as ``base * (n / s) ** exponent`` (how well
    SIZE_EXPONENT was chosen: tests/sim/test_derived_rates.py, bench/derived_rates.py)."""
    table = reference.table
    errors = []
    for (job_type, sf, w), actual in table.isolated_steps_per_s.items():
        others = [s for s in reference.sizes_on[(job_type, w)] if s != sf]
        if actual <= 0 or not others:
            continue
        s = nearest_size(others, sf)
        base = table.isolated_steps_per_s[(job_type, s, w)]
        if base > 0:
            errors.append(abs(base * (sf / s) ** exponent / actual - 1))
    return errors


def reference_rate(reference: TableReference, job_type: str, scale_factor: int, accelerator_type: str) -> float:
    """The job's reference on the type (module docstring): the table's figure for its type at the
    nearest size it has there, else the typical job of the nearest size, scaled to its size."""
    own = reference.sizes_on.get((job_type, accelerator_type))
    if own:
        s = nearest_size(own, scale_factor)
        base = reference.table.isolated_steps_per_s[(job_type, s, accelerator_type)]
    elif reference.sizes:
        s = nearest_size(reference.sizes, scale_factor)
        base = reference.typical(s, accelerator_type)
    else:
        return 0.0
    return base if s == scale_factor else base * (scale_factor / s) ** SIZE_EXPONENT


def alone_rate(
    reference: TableReference, job_type: str, scale_factor: int, accelerator_type: str, estimate: Estimate | None = None
) -> float:
    """Steps/s of the job's gang alone on the type: rules 1-4 of the module docstring."""
    known = reference.table.isolated_steps_per_s.get((job_type, scale_factor, accelerator_type))
    if known is not None:
        return known
    if estimate and accelerator_type in estimate:
        return float(estimate[accelerator_type])
    own = reference_rate(reference, job_type, scale_factor, accelerator_type)
    ratios = []
    for w, given in (estimate or {}).items():
        if given > 0:
            base = reference_rate(reference, job_type, scale_factor, w)
            if base > 0:
                ratios.append(given / base)
    return own * geometric_mean(ratios) if ratios else own


def lease_rates(
    reference: TableReference,
    job_types: Sequence[str],
    scale_factor: int,
    accelerator_type: str,
    estimates: Sequence[Estimate] = (),
) -> tuple[float, ...]:
    """What the hardware does: each member's steps/s, alone or in its pair (``estimates``: per
    member, what its submitter said, {} or () for nothing). The table's figures where it has every
    member (``physics.true_rates``, unchanged), else the module docstring's rule."""
    table = reference.table
    if all((t, scale_factor, accelerator_type) in table.isolated_steps_per_s for t in job_types):
        return true_rates(table, job_types, scale_factor, accelerator_type)
    said = list(estimates) or [{}] * len(job_types)
    alone = tuple(alone_rate(reference, t, scale_factor, accelerator_type, e) for t, e in zip(job_types, said, strict=True))
    if len(alone) == 1:
        return alone
    sizes = reference.pair_sizes_on.get(accelerator_type)
    fraction = reference.packed_fraction(nearest_size(sizes, scale_factor), accelerator_type) if sizes else 0.0
    return tuple(rate * fraction for rate in alone)
