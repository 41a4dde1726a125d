"""sim/derived_rates.py: the simulated hardware's speed for a job its table lacks, in numbers, on
Gavel's table (issue 23: the README's `--job-type my-model --throughput v100=12.5,k80=3.1`, and a
known type on a size the table lacks)."""

from __future__ import annotations

import math
import statistics

import pytest

from common.throughputs import throughput_table_from_json
from policy_service.service import shipped_context
from sim.derived_rates import SIZE_EXPONENT, TableReference, alone_rate, lease_rates, nearest_size, size_rule_errors
from sim.physics import true_rates

TABLE = shipped_context().table
assert TABLE is not None
REFERENCE = TableReference(TABLE)
RESNET = "ResNet-50 (batch size 64)"
README_ESTIMATE = {"v100": 12.5, "k80": 3.1}  # the README's --throughput


def test_every_figure_of_the_table_is_the_tables_own_alone_and_packed() -> None:
    """Every simulation keeps its schedule to the bit: where the table has every member, the rates
    are physics.true_rates' (a pair the table lacks between two types it has stays 0 and 0), and
    what a submitter said changes nothing."""
    said = {"v100": 1.0, "p100": 1.0, "k80": 1.0}
    for job_type, sf, w in TABLE.isolated_steps_per_s:
        assert lease_rates(REFERENCE, (job_type,), sf, w, (said,)) == true_rates(TABLE, (job_type,), sf, w)
    for a, b, sf, w in list(TABLE.pair_steps_per_s)[::7]:
        assert lease_rates(REFERENCE, (a, b), sf, w, (said, said)) == true_rates(TABLE, (a, b), sf, w)
    # Gavel's table measured every pair: a table that did not (two types, no pair) packs them at 0
    small = throughput_table_from_json({"v100": {"('A', 1)": {"null": 2.0}, "('B', 1)": {"null": 3.0}}})
    assert lease_rates(TableReference(small), ("A", "B"), 1, "v100") == (0.0, 0.0)
    assert lease_rates(TableReference(small), ("A", "mine"), 1, "v100") == (0.0, 0.0)  # and nothing to derive from


def test_the_readme_job_runs_at_its_submitters_figures_and_derived_ones_elsewhere() -> None:
    """`--throughput v100=12.5,k80=3.1`: 12.5 and 3.1 where given; on the p100 the typical job's
    11.61 steps/s times the geometric mean of 12.5/12.31 (v100) and 3.1/3.66 (k80): 10.77."""
    typical = TABLE.typical_isolated(1)
    assert (typical["v100"], typical["k80"], typical["p100"]) == pytest.approx((12.3114, 3.6589, 11.6094), abs=1e-4)
    assert lease_rates(REFERENCE, ("my-model",), 1, "v100", (README_ESTIMATE,)) == (12.5,)
    assert lease_rates(REFERENCE, ("my-model",), 1, "k80", (README_ESTIMATE,)) == (3.1,)
    scale = math.sqrt(12.5 / typical["v100"] * 3.1 / typical["k80"])
    assert lease_rates(REFERENCE, ("my-model",), 1, "p100", (README_ESTIMATE,)) == pytest.approx((typical["p100"] * scale,))
    assert lease_rates(REFERENCE, ("my-model",), 1, "p100", (README_ESTIMATE,))[0] == pytest.approx(10.7676, abs=1e-4)


def test_a_type_nobody_gave_a_figure_for_runs_as_the_typical_job_of_its_size() -> None:
    assert lease_rates(REFERENCE, ("my-model",), 1, "p100") == (TABLE.typical_isolated(1)["p100"],)
    assert lease_rates(REFERENCE, ("my-model",), 4, "k80", ({},)) == (TABLE.typical_isolated(4)["k80"],)
    # 3 GPUs, a size the table lacks: the typical job of 4 (nearer by ratio than 2), scaled
    assert lease_rates(REFERENCE, ("my-model",), 3, "v100") == pytest.approx((TABLE.typical_isolated(4)["v100"] * 0.75**0.75,))


def test_a_size_the_table_lacks_comes_from_the_nearest_size_it_has_scaled_by_the_075th_power() -> None:
    """ResNet-50 (batch size 64) on the v100: 4.39 (1 GPU), 7.92 (2), 9.45 (4), 17.3 (8)."""
    at = {sf: TABLE.isolated_steps_per_s[(RESNET, sf, "v100")] for sf in (1, 2, 4, 8)}
    assert alone_rate(REFERENCE, RESNET, 3, "v100") == pytest.approx(at[4] * (3 / 4) ** 0.75)  # 7.62
    assert alone_rate(REFERENCE, RESNET, 6, "v100") == pytest.approx(at[8] * (6 / 8) ** 0.75)
    assert alone_rate(REFERENCE, RESNET, 16, "v100") == pytest.approx(at[8] * 2**0.75)  # 29.1
    # the submitter's figure for the type wins over the derivation, and scales the other types
    said = {"k80": 2.0}
    assert alone_rate(REFERENCE, RESNET, 3, "k80", said) == 2.0
    k80_ref = TABLE.isolated_steps_per_s[(RESNET, 4, "k80")] * (3 / 4) ** 0.75
    assert alone_rate(REFERENCE, RESNET, 3, "v100", said) == pytest.approx(at[4] * (3 / 4) ** 0.75 * 2.0 / k80_ref)


def test_nearest_size_is_by_ratio_and_the_smaller_at_a_tie() -> None:
    assert [nearest_size((1, 2, 4, 8), n) for n in (1, 3, 5, 6, 7, 12, 16)] == [1, 4, 4, 8, 8, 8, 8]
    assert nearest_size((1, 4), 2) == 1


def test_a_zero_means_it_cannot_run_there() -> None:
    """The submitter's W=0, and a reference of 0 (the table's type does not fit there at the
    nearest size): the lease makes no progress, as the table's own zeros do."""
    assert lease_rates(REFERENCE, ("my-model",), 1, "p100", ({"p100": 0.0, "v100": 10.0},)) == (0.0,)
    assert TABLE.isolated_steps_per_s[("ResNet-50 (batch size 128)", 4, "k80")] == 0.0
    assert alone_rate(REFERENCE, "ResNet-50 (batch size 128)", 3, "k80") == 0.0
    # a zero given elsewhere says nothing of the speed: the reference stands
    assert alone_rate(REFERENCE, "my-model", 1, "p100", {"k80": 0.0}) == TABLE.typical_isolated(1)["p100"]


def test_a_pair_with_a_member_beyond_the_table_runs_each_at_the_tables_typical_packed_fraction() -> None:
    """One GPU: each member at its rate alone times the geometric mean of what the table's pairs
    keep there (0.60 on a v100); gangs: the table never packs them with progress, so 0."""
    fraction = REFERENCE.packed_fraction(1, "v100")
    assert fraction == pytest.approx(0.5998, abs=1e-4)
    assert (REFERENCE.packed_fraction(1, "k80"), REFERENCE.packed_fraction(1, "p100")) == pytest.approx((0.5248, 0.5801), abs=1e-4)
    alone = TABLE.isolated_steps_per_s[(RESNET, 1, "v100")]
    assert lease_rates(REFERENCE, (RESNET, "my-model"), 1, "v100", ({}, README_ESTIMATE)) == pytest.approx(
        (alone * fraction, 12.5 * fraction)
    )
    assert lease_rates(REFERENCE, (RESNET, "my-model"), 2, "v100") == (0.0, 0.0)
    assert lease_rates(REFERENCE, (RESNET, RESNET), 3, "v100") == (0.0, 0.0)  # 2 and 4 GPUs: never packed


def test_the_size_exponent_fits_gavels_table_better_than_per_gpu_or_unscaled() -> None:
    """Each figure of the table predicted from its nearest other size for its type on its
    accelerator type: the rule's exponent errs less (median) than the same rate per GPU, which errs
    less than the nearest size unscaled (bench/derived_rates.py prints the figures)."""

    def median_error(exponent: float) -> float:
        return statistics.median(size_rule_errors(REFERENCE, exponent))

    assert median_error(SIZE_EXPONENT) < median_error(1.0) < median_error(0.0)
