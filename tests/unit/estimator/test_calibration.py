"""Hardware slower than the table is a calibration the estimator learns, not a straggler (issue 23,
item 3): the CPU test cluster of docs/worker.md, real workers declared as `--type v100` and `k80`
running the catalog's jobs at a tenth to a quarter of the table's figures."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from common.messages import JobProgress, JobSpec, JobThroughput, Provenance, ThroughputEstimated
from estimator_service.core.calibration import NO_SHIFT, Calibration, TypeCalibration
from estimator_service.core.cell_fit import fit_cells
from estimator_service.core.estimator import Estimator
from estimator_service.core.reference import reference_set
from estimator_service.core.settings import EstimatorSettings
from policy_service.service import shipped_context

TABLE = shipped_context().table
# (job type, measured / table on the CPU "v100", on the CPU "k80"): the catalog's jobs slow down
# by different factors on a CPU
CATALOG = (
    ("LM (batch size 20)", 0.25, 0.09),
    ("ResNet-18 (batch size 32)", 0.10, 0.07),
    ("Transformer (batch size 32)", 0.18, 0.12),
    ("ResNet-50 (batch size 16)", 0.14, 0.08),
)
LEASES = iter(range(10**9))


def report(job_id: str, worker: str, accelerator_type: str, steps_per_s: float) -> JobProgress:
    return JobProgress(job_id, worker, f"lease-{next(LEASES)}", 0, 100, 360.0, steps_per_s, accelerator_type=accelerator_type)


def table(job_type: str, accelerator_type: str) -> float:
    return TABLE.isolated(job_type, 1, accelerator_type)


def figure(e: Estimator, job_id: str, accelerator_type: str) -> tuple[float, float, Provenance]:
    row = next(j for j in e.everything().jobs if j.job_id == job_id)
    return (
        row.throughputs_steps_per_s[accelerator_type], row.confidence[accelerator_type], row.provenance[accelerator_type]
    )


def cpu_cluster() -> tuple[Estimator, list[ThroughputEstimated]]:
    """The catalog's jobs, one lease each on the CPU "v100" and the CPU "k80"."""
    e = Estimator(reference_set(TABLE), EstimatorSettings())
    out = []
    for job_type, on_v100, on_k80 in CATALOG:
        e.submitted(JobSpec(job_type, job_type, 10_000))
        out.append(e.progress(report(job_type, "cpu-v100", "v100", on_v100 * table(job_type, "v100"))))
        out.append(e.progress(report(job_type, "cpu-k80", "k80", on_k80 * table(job_type, "k80"))))
    return e, [o for o in out if o is not None]


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def test_hardware_slower_than_the_table_without_peers_is_no_straggler():
    e, out = cpu_cluster()
    assert not [f for o in out for f in o.stragglers] and not e.stragglers.flagged  # no peer, no call
    fit = e.calibration.fitted(e.types)
    assert fit is not None
    # every class ran on both types: a class never measured runs at the classes' mean ratio there
    assert fit.typical("v100").factor == pytest.approx(geometric_mean([v for _, v, _ in CATALOG]), rel=1e-3)
    assert fit.typical("k80").factor == pytest.approx(geometric_mean([k for _, _, k in CATALOG]), rel=1e-3)


def test_a_new_type_converges_to_what_is_measured_within_a_few_leases():
    """The user guessed 30-100 steps/s; the job runs ~2,000 steps/s on the CPU "v100"."""
    e, _ = cpu_cluster()
    guess = {"v100": 100.0, "p100": 60.0, "k80": 30.0}
    e.submitted(JobSpec("mine", "my-model", 10**6, throughput_estimate_steps_per_s=guess))
    value, confidence, provenance = figure(e, "mine", "v100")
    assert value == pytest.approx(100.0, rel=0.01) and confidence < 0.05 and provenance is Provenance.USER
    for lease, steps_per_s in enumerate((1980.0, 2040.0, 2010.0), start=1):
        e.progress(report("mine", "cpu-v100", "v100", steps_per_s))
        value, confidence, provenance = figure(e, "mine", "v100")
        assert abs(value / steps_per_s - 1) < 0.10, f"lease {lease}: {value} steps/s against {steps_per_s} measured"
        assert provenance in (Provenance.MEASURED, Provenance.PROFILED)
    assert value == pytest.approx(2010.0, rel=0.02) and confidence > 0.85  # known within ~4%
    assert not e.stragglers.flagged


def test_a_new_types_speed_on_another_type_takes_the_hardwares_difference_between_the_types():
    """Never measured on the CPU "k80": the matched reference's ratio between the types, times the
    hardware's difference between them learned from the classes measured on both (the job runs on
    a CPU there too), not the table's ratio alone."""
    calibrated, _ = cpu_cluster()
    as_the_table = Estimator(reference_set(TABLE), EstimatorSettings())
    figures = []
    for e in (calibrated, as_the_table):
        e.submitted(JobSpec("mine", "my-model", 10**6, throughput_estimate_steps_per_s={"v100": 100.0}))
        e.progress(report("mine", "cpu-v100", "v100", 2000.0))
        figures.append(figure(e, "mine", "k80")[0])
    ratio = geometric_mean([k / v for _, v, k in CATALOG])  # the classes' k80 / v100, over the table's
    assert figures[0] / figures[1] == pytest.approx(ratio, rel=0.01)  # (the hardware's prior shrinks it by 0.2%)


def test_a_catalog_jobs_measured_figure_is_kept_and_its_peers_start_from_the_calibrated_table():
    e, _ = cpu_cluster()
    lm = CATALOG[0][0]
    for _ in range(2):
        e.progress(report(lm, "cpu-v100", "v100", 0.25 * table(lm, "v100")))
    value, confidence, _ = figure(e, lm, "v100")
    assert value == pytest.approx(0.25 * table(lm, "v100"), rel=0.03)  # not back to the table's
    assert confidence > 0.8
    # a catalog job never measured on this hardware: the table's figure times the classes' mean ratio
    e.submitted(JobSpec("new-lm", "LM (batch size 40)", 10_000))
    value, confidence, provenance = figure(e, "new-lm", "v100")
    assert provenance is Provenance.REFERENCE
    lm_on_v100 = (0.25 * 0.25 * 0.25) ** (1 / 3)  # LM's ratio moved to 0.25 over its three leases
    ratios = [lm_on_v100, *(v for _, v, _ in CATALOG[1:])]
    assert value / table("LM (batch size 40)", "v100") == pytest.approx(geometric_mean(ratios), rel=0.01)
    assert confidence < 0.5  # the catalog's jobs slow down by 0.1-0.25: a calibrated figure says so


TYPES = ("v100", "p100", "k80")


def test_a_cluster_within_the_tolerance_keeps_the_table_as_it_is():
    c = Calibration(tolerance=0.1)
    for n, ratio in enumerate((1.05, 0.97, 1.08, 0.95)):
        c.observe(f"w{n % 2}", "v100", f"j{n}", f"class-{n % 3}", math.log(ratio))
    c.observe("w2", "k80", "j0", "class-0", math.log(1.02))
    fit = c.fitted(TYPES)
    assert fit is not None
    for w in TYPES:  # p100, which no class links to the others, too
        assert fit.typical(w) == NO_SHIFT
        assert all(fit.reference(f"class-{n}", w) == NO_SHIFT for n in range(3))
    assert fit.has_peers("v100") and fit.has_peers("k80") and not fit.has_peers("p100")
    assert c.fitted(TYPES, left_out={"w0", "w1", "w2"}) is None


def test_the_median_worker_sets_a_classs_level_and_a_slow_one_does_not_drag_it():
    c = Calibration(tolerance=0.1)
    for worker, ratios in {"a": (0.5, 0.5, 0.5), "b": (0.4, 0.6, 0.5), "slow": (0.1, 0.1, 0.1)}.items():
        for n, ratio in enumerate(ratios):
            c.observe(worker, "v100", f"{worker}-{n}", "lm", math.log(ratio))
    fit = c.fitted(TYPES)
    assert fit is not None and fit.typical("v100").factor == pytest.approx(0.5, rel=1e-3)
    assert fit.typical("v100").variance > 0.3**2  # one class: the classes' spread is assumed


def test_the_classes_spread_is_the_uncertainty_of_a_class_measured_nowhere():
    c = Calibration(tolerance=0.1)
    for n, ratio in enumerate((0.2, 0.25, 4.0, 2.0, 0.5)):  # a CPU: LMs slow, Transformers fast
        c.observe("cpu", "v100", f"j{n}", f"class-{n}", math.log(ratio))
    fit = c.fitted(TYPES)
    assert fit is not None
    typical = fit.typical("v100")
    assert typical.factor == pytest.approx(geometric_mean([0.2, 0.25, 4.0, 2.0, 0.5]), rel=1e-3)
    assert math.sqrt(typical.variance) > 1.0  # a factor of e either way: it is a guess
    assert fit.reference("class-0", "v100").variance == typical.variance  # measured there: its own figures say the rest


def test_a_hardware_difference_no_class_links_is_left_at_the_tables_ratio():
    """fit_cells alone: classes of 20-fold different levels, each type running its own; then one
    class measured on both types links them."""
    js, ks = np.array([0, 1, 2]), np.array([0, 1, 1])
    r = np.log([0.2, 4.0, 4.0])  # type 0 ran class 0, type 1 classes 1 and 2
    apart = fit_cells(js, ks, r, 4, 2, 0.1, 0.3)
    assert np.allclose(apart["hardware"], 0.0, atol=1e-3)  # which classes a type ran is no hardware
    assert np.allclose(apart["between_log"], 0.0)
    assert apart["between_var"][0, 1] > 1.0  # and what the hardware's difference is, is not known
    # class 3 measured on both, at half the speed on type 1
    linked = fit_cells(np.array([0, 1, 2, 3, 3]), np.array([0, 1, 1, 0, 1]), np.log([0.2, 4.0, 4.0, 1.0, 0.5]), 4, 2, 0.1, 0.3)
    assert linked["between_log"][1, 0] == pytest.approx(math.log(0.5), rel=0.01)
    assert linked["between_var"][1, 0] < 0.2**2  # one class, a cell's noise (sd 0.1) on each side
    # class 0 on type 1: its own level and the link's difference
    assert linked["reference_log"][0, 1] == pytest.approx(math.log(0.2 * 0.5), rel=0.01)
    # a difference within twice its standard error (one class: ~0.14) is the table's
    close = fit_cells(np.array([0, 1, 2, 3, 3]), np.array([0, 1, 1, 0, 1]), np.log([0.2, 4.0, 4.0, 1.0, 0.75]), 4, 2, 0.1, 0.3)
    assert close["between_log"][1, 0] == 0.0


def test_an_estimator_snapshot_from_before_calibration_loads_and_learns():
    """The state file pickles the model: one written before calibration existed has no
    calibration and left stragglers out (``_excluded``); its settings lack the new fields."""
    e, _ = cpu_cluster()
    state = dict(e.__dict__)
    for name in ("calibration", "_calibrated", "_slow"):
        del state[name]
    state["_excluded"] = frozenset()
    old_settings = object.__new__(EstimatorSettings)
    for name in ("mode", "completion", "measurement_sd", "user_sd", "straggler_ratio", "pooled_jobs"):
        object.__setattr__(old_settings, name, getattr(e.settings, name))
    state["settings"] = old_settings
    loaded = object.__new__(Estimator)
    loaded.__setstate__(state)
    assert loaded.settings.calibration_tolerance == EstimatorSettings().calibration_tolerance
    assert loaded.calibration.fitted(loaded.types) is None  # nothing calibrated yet: it learns again
    lm = CATALOG[0][0]
    loaded.progress(report(lm, "cpu-v100", "v100", 0.25 * table(lm, "v100")))
    assert loaded.calibration.fitted(loaded.types) is not None
    assert pickle.loads(pickle.dumps(loaded)).calibration.cells == loaded.calibration.cells


def test_an_estimator_snapshot_with_a_calibration_per_type_loads_and_learns_again():
    """Before the joint fit a snapshot held each worker's ratios without their classes and a
    TypeCalibration applied per type: it loads, and calibrates from what comes next."""
    e, _ = cpu_cluster()
    old = object.__new__(Calibration)
    old.__dict__.update(tolerance=0.1, assumed_sd=0.3, ratios={"cpu-v100": {"j": -1.6}}, types={"cpu-v100": "v100"}, levels={"cpu-v100": -1.6})
    state = {**e.__dict__, "calibration": old, "_calibrated": {"v100": TypeCalibration(-1.6, 0.3, 1, 4)}}
    loaded = pickle.loads(pickle.dumps(state))  # through pickle, as the state file holds it
    estimator = object.__new__(Estimator)
    estimator.__setstate__(loaded)
    assert estimator.calibration.fitted(estimator.types) is None
    lm = CATALOG[0][0]
    estimator.progress(report(lm, "cpu-v100", "v100", 0.25 * table(lm, "v100")))
    fit = estimator.calibration.fitted(estimator.types)
    assert fit is not None and fit.typical("v100").factor == pytest.approx(0.25, rel=1e-3)


# The CPU cluster of docs/worker.md as a new user ran it (issue 23, item 3): a "v100" worker on the
# raw CPU, a "k80" one with --emulate-speed table (each step stretched to the k80's share of the
# job's fastest type). The CPU runs each job at its own multiple of the table's v100 figure.
CPU_OVER_TABLE = {
    "LM (batch size 20)": 0.2, "LM (batch size 40)": 0.25,
    "Transformer (batch size 16)": 4.0, "Transformer (batch size 32)": 3.5, "A3C": 4.0,
    "ResNet-50 (batch size 16)": 1.0, "ResNet-18 (batch size 32)": 0.8,
}


def cpu_speed(job_type: str, accelerator_type: str) -> float:
    """What the worker of the type measures (every one of these jobs is fastest on the raw CPU)."""
    raw = CPU_OVER_TABLE[job_type] * table(job_type, "v100")
    if accelerator_type == "v100":
        return raw
    return raw * table(job_type, "k80") / max(table(job_type, w) for w in ("v100", "p100", "k80"))


def test_which_jobs_each_type_ran_first_does_not_order_the_types_against_what_was_measured():
    """The LMs ran on the "v100", the Transformers and A3C on the "k80" (ratios to the table 20-fold
    apart): per-type medians made the k80 look 5x faster than the v100 for every job not yet run
    on a type. Then one job runs on both and links the two types' hardware."""
    e = Estimator(reference_set(TABLE), EstimatorSettings())
    for job_type in CPU_OVER_TABLE:
        e.submitted(JobSpec(job_type, job_type, 10**6))
    first = {"v100": ("LM (batch size 20)", "LM (batch size 40)"), "k80": ("Transformer (batch size 16)", "Transformer (batch size 32)", "A3C")}
    for w, job_types in first.items():
        for job_type in job_types:
            e.progress(report(job_type, f"cpu-{w}", w, cpu_speed(job_type, w)))

    def check_order() -> dict[str, JobThroughput]:
        rows = {r.job_id: r for r in e.everything().jobs}
        for job_type, row in rows.items():
            v100, k80 = (row.throughputs_steps_per_s[w] for w in ("v100", "k80"))
            assert v100 > k80, f"{job_type}: k80 {k80:.2f} steps/s above v100 {v100:.2f}"
        return rows

    rows = check_order()
    for w, job_types in first.items():
        other = "k80" if w == "v100" else "v100"
        for job_type in job_types:
            # nothing links the types yet: the job's own level, the table's ratio between the types,
            # and a confidence that says the hardware's difference is a guess
            row = rows[job_type]
            expected = cpu_speed(job_type, w) * table(job_type, other) / table(job_type, w)
            assert row.throughputs_steps_per_s[other] == pytest.approx(expected, rel=0.01)
            assert row.confidence[other] < 0.05
    # ResNet-50 (batch size 16) on both: the k80 runs it at what the emulation gives, the types' relation
    link = "ResNet-50 (batch size 16)"
    for w in ("v100", "k80"):
        e.progress(report(link, f"cpu-{w}", w, cpu_speed(link, w)))
    relation = (cpu_speed(link, "k80") / table(link, "k80")) / (cpu_speed(link, "v100") / table(link, "v100"))
    rows = check_order()
    for w, job_types in first.items():
        other = "k80" if w == "v100" else "v100"
        for job_type in job_types:
            row = rows[job_type]
            learned = relation if other == "k80" else 1 / relation
            expected = cpu_speed(job_type, w) * table(job_type, other) / table(job_type, w) * learned
            assert row.throughputs_steps_per_s[other] == pytest.approx(expected, rel=0.02)
            # (these jobs are fastest on a v100 in the table, as ResNet-50 is: the relation is exact)
            assert row.throughputs_steps_per_s[other] == pytest.approx(cpu_speed(job_type, other), rel=0.02)
            assert row.confidence[other] > 0.1  # within ~30%: one class links the types
    never = rows["ResNet-18 (batch size 32)"]  # never measured: the classes' mean level, a guess
    assert never.provenance["v100"] is Provenance.REFERENCE and never.confidence["v100"] < 0.05


def test_a_worker_that_comes_back_as_another_type_measures_that_type():
    c = Calibration(tolerance=0.1)
    c.observe("w", "v100", "j0", "lm", math.log(0.2))
    c.observe("w", "k80", "j1", "lm", math.log(0.5))
    fit = c.fitted(TYPES)
    assert fit is not None and not fit.has_peers("v100") and fit.has_peers("k80")
    assert c.ratios["w"] == {"j1": ("lm", math.log(0.5))}
    assert fit.typical("k80").factor == pytest.approx(0.5, rel=1e-3)


def test_the_calibration_is_applied_again_only_when_a_shift_moved_by_more_than_the_step():
    c = Calibration(tolerance=0.1)
    for n, ratio in enumerate((0.2, 0.25, 4.0)):
        c.observe("cpu", "v100", f"j{n}", f"class-{n}", math.log(ratio))
    before = c.fitted(TYPES)
    c.observe("cpu", "v100", "j0", "class-0", math.log(0.2 * 1.001))  # a cell moved by 0.1%
    assert c.fitted(TYPES) is before  # (within CELL_STEP: the same fit, no solve)
    c.observe("cpu", "v100", "j3", "class-3", math.log(1.5))  # a new class: the typical moves
    after = c.fitted(TYPES)
    assert before is not None and after is not None
    assert after.moved(before, 0.01) and not after.moved(after, 0.0)
    # a class the earlier fit lacked is compared with its typical shift, as it applied it
    assert after.reference("class-3", "p100") != before.reference("class-3", "p100") == before.typical("p100")
