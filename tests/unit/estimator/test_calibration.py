"""Hardware slower than the table is a calibration the estimator learns, not a straggler (issue 23,
item 3): the CPU test cluster of docs/worker.md, real workers declared as `--type v100` and `k80`
running the catalog's jobs at a tenth to a quarter of the table's figures."""

from __future__ import annotations

import math
import pickle

import pytest

from common.messages import JobProgress, JobSpec, Provenance, ThroughputEstimated
from estimator_service.core.calibration import Calibration
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


def test_hardware_slower_than_the_table_without_peers_is_no_straggler():
    e, out = cpu_cluster()
    assert not [f for o in out for f in o.stragglers] and not e.stragglers.flagged  # no peer, no call
    v100, k80 = e.calibration.of("v100"), e.calibration.of("k80")
    assert v100 is not None and k80 is not None
    assert math.exp(v100.log_shift) == pytest.approx(math.sqrt(0.14 * 0.18), rel=1e-6)  # the median of 4 jobs
    assert math.exp(k80.log_shift) == pytest.approx(math.sqrt(0.08 * 0.09), rel=1e-6)


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


def test_a_new_types_speed_on_another_type_takes_both_types_calibrations():
    """Never measured on the CPU "k80": the matched reference's ratio between the types, times the
    ratio of their calibrations (the job runs on a CPU there too), not the table's ratio alone."""
    calibrated, _ = cpu_cluster()
    as_the_table = Estimator(reference_set(TABLE), EstimatorSettings())
    figures = []
    for e in (calibrated, as_the_table):
        e.submitted(JobSpec("mine", "my-model", 10**6, throughput_estimate_steps_per_s={"v100": 100.0}))
        e.progress(report("mine", "cpu-v100", "v100", 2000.0))
        figures.append(figure(e, "mine", "k80")[0])
    ratio = math.sqrt(0.08 * 0.09) / math.sqrt(0.14 * 0.18)  # the k80's calibration over the v100's
    assert figures[0] / figures[1] == pytest.approx(ratio, rel=1e-4)


def test_a_catalog_jobs_measured_figure_is_kept_and_its_peers_start_from_the_calibrated_table():
    e, _ = cpu_cluster()
    lm = CATALOG[0][0]
    for _ in range(2):
        e.progress(report(lm, "cpu-v100", "v100", 0.25 * table(lm, "v100")))
    value, confidence, _ = figure(e, lm, "v100")
    assert value == pytest.approx(0.25 * table(lm, "v100"), rel=0.03)  # not back to the table's
    assert confidence > 0.8
    # a catalog job never measured on this hardware: the table's figure times the type's calibration
    e.submitted(JobSpec("new-lm", "LM (batch size 40)", 10_000))
    value, confidence, provenance = figure(e, "new-lm", "v100")
    assert provenance is Provenance.REFERENCE
    assert value / table("LM (batch size 40)", "v100") == pytest.approx(math.sqrt(0.14 * 0.18), rel=0.2)
    assert confidence < 0.5  # the catalog's jobs slow down by 0.1-0.25: a calibrated figure says so


def test_a_type_within_the_tolerance_keeps_the_table_as_it_is():
    c = Calibration(tolerance=0.1)
    for n, ratio in enumerate((1.05, 0.97, 1.08, 0.95)):
        c.observe(f"w{n % 2}", "v100", f"j{n}", math.log(ratio))
    found = c.of("v100")
    assert found is not None and found.log_shift == 0.0 and found.variance == 0.0 and found.jobs == 4
    assert c.of("k80") is None and c.of("v100", left_out={"w0", "w1"}) is None


def test_the_median_worker_sets_the_calibration_and_the_spread_its_variance():
    c = Calibration(tolerance=0.1)
    for worker, ratios in {"a": (0.5, 0.5, 0.5), "b": (0.4, 0.6, 0.5), "slow": (0.1, 0.1, 0.1)}.items():
        for n, ratio in enumerate(ratios):
            c.observe(worker, "v100", f"{worker}-{n}", math.log(ratio))
    found = c.of("v100")
    assert found is not None and math.exp(found.log_shift) == pytest.approx(0.5)  # the slow one does not drag it
    assert found.workers == 3 and found.jobs == 9
    assert 0 < found.variance < 1.0
    without = c.of("v100", left_out={"slow"})
    assert without is not None and without.variance < found.variance


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
    assert loaded.calibration.of("v100") is None  # nothing calibrated yet: it learns again
    lm = CATALOG[0][0]
    loaded.progress(report(lm, "cpu-v100", "v100", 0.25 * table(lm, "v100")))
    assert loaded.calibration.of("v100") is not None
    assert pickle.loads(pickle.dumps(loaded)).calibration.levels == loaded.calibration.levels
