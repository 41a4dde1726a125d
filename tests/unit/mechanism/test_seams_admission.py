"""The admission seam (core/seams/admission.py): load-based admission and quotas in normalised
compute on hand-checked cases, the mechanism's side (admit_through: the queue offered again,
feasibility first), a policy that raises or answers wrong admitting everyone, and `--why`.

The builders' job type ``a`` runs 1 step/s on a k80 and 4 on a v100 (tests/unit/mechanism/builders.py):
14,400 steps on one GPU are one V100-hour of work (3,600 s on a v100, 14,400 s on a k80)."""

from __future__ import annotations

import sys

import pytest

from mechanism_service.core.admission import NewJob
from mechanism_service.core.memory import Memory
from mechanism_service.core.rounds import admit_through
from mechanism_service.core.seams.admission import (
    AdmissionDecision,
    AdmissionView,
    WaitingJob,
)
from mechanism_service.core.seams.admission_builtins import (
    ADMISSION_BUILTINS,
    LoadAdmission,
    QuotaAdmission,
)
from mechanism_service.core.seams.admitting import entity_usage, view_of
from mechanism_service.core.why import ADMISSION, explain, reason_codes
from tests.unit.mechanism.builders import GAVEL, RATES, state

V100_HOUR_STEPS = 14_400  # type a on 1 GPU


def waiting(job_id: str, gpus: int, entity: str | None = None) -> WaitingJob:
    return WaitingJob(job_id, entity, "a", gpus, 0.0, 1000, 0.0, 0.0)


def load_view(scheduled_gpus: int, scheduled_jobs: int, *jobs: WaitingJob) -> AdmissionView:
    return AdmissionView(0.0, jobs, {"v100": 4}, scheduled_jobs, scheduled_gpus, scheduled_jobs)


def test_load_admits_in_arrival_order_while_the_demand_stays_within_the_bound():
    view = load_view(3, 2, waiting("w1", 1), waiting("w2", 2), waiting("w3", 1))
    # bound 1.0 x 4 GPUs: 3 + 1 = 4 fits, 4 + 2 = 6 does not, and w3 waits behind w2 (FIFO)
    assert LoadAdmission().admit(view).admit == ("w1",)
    # bound 1.5 x 4 = 6: w1 (4), w2 (6); w3 would make 7
    decision = LoadAdmission(max_load="1.5").admit(view)
    assert decision.admit == ("w1", "w2")
    assert decision.reason_for("w3") == (
        "load-based admission: the scheduled jobs demand 6 GPUs of 4 (load 1.50); jobs join in arrival order "
        "while the load with them stays at most 1.5"
    )
    assert LoadAdmission(max_load="9", max_jobs="3").admit(view).admit == ("w1",)  # 2 scheduled + 1


def test_load_admits_a_gang_larger_than_the_bound_when_nothing_is_scheduled():
    view = load_view(0, 0, waiting("big", 8), waiting("small", 1))
    assert LoadAdmission(max_load="0.5").admit(view).admit == ("big",)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"max_load": "x"}, "max_load='x': not a number"),
        ({"max_load": "0"}, "max_load='0': must be a number above 0"),
        ({"max_lod": "1"}, "load: unknown parameter max_lod"),
    ],
)
def test_load_refuses_a_bad_parameter(params, message):
    with pytest.raises((TypeError, ValueError)) as error:
        LoadAdmission(**params)
    assert str(error.value) == message


def _two_teams():
    """v100 and k80, one GPU each. Team A's job j0 and team B's j1: one V100-hour of work each,
    half done; A's half ran on the v100 (1,800 GPU-s), B's on the k80 (7,200 GPU-s). Waiting:
    A's w_a and B's w_b, one V100-hour each."""
    s = (
        state(v100=1, k80=1)
        .job("a", steps=V100_HOUR_STEPS, entity="A")
        .job("a", steps=V100_HOUR_STEPS, entity="B")
        .done(0, V100_HOUR_STEPS // 2, gpu_seconds_by_type={"v100": 1800.0, "k80": 0.0})
        .done(1, V100_HOUR_STEPS // 2, gpu_seconds_by_type={"v100": 0.0, "k80": 7200.0})
        .build()
    )
    jobs = [NewJob("w_a", "a", 1, V100_HOUR_STEPS, 10.0, entity="A"), NewJob("w_b", "a", 1, V100_HOUR_STEPS, 10.0, entity="B")]
    return s, jobs


def test_usage_in_normalised_compute_is_the_same_work_on_either_type():
    s, jobs = _two_teams()
    usage = entity_usage(s, RATES)
    # work done: 7,200 steps / 4 steps/s on a v100 = 1,800 V100-s for both, wherever it ran
    assert (usage["A"].used_v100_s, usage["B"].used_v100_s) == (1800.0, 1800.0)
    assert (usage["A"].used_gpu_s, usage["B"].used_gpu_s) == (1800.0, 7200.0)  # device time differs 4x
    assert (usage["A"].committed_v100_s, usage["A"].committed_gpu_s) == (1800.0, 1800.0)
    view = view_of(s, jobs, RATES, 10.0)
    assert [(j.work_v100_s, j.work_gpu_s) for j in view.waiting] == [(3600.0, 3600.0), (3600.0, 3600.0)]
    assert (view.scheduled_jobs, view.scheduled_gpus, view.cluster_gpus) == (2, 2, 2)


def test_a_quota_in_v100_hours_gives_both_teams_the_same_work_where_device_hours_would_not():
    """Quota 2 hours each. In V100-hours both teams hold 1 (done 0.5 + left 0.5), so each may
    add one more V100-hour job: 2 and 2. In device-hours A holds 0.5 + 0.5 = 1 but B 2 + 0.5 =
    2.5 (its half ran on the k80, 4x slower): B's job waits, and B gets half A's work."""
    s, jobs = _two_teams()
    in_v100 = QuotaAdmission(hours="2").admit(view_of(s, jobs, RATES, 10.0))
    assert in_v100.admit == ("w_a", "w_b")
    in_gpu = QuotaAdmission(hours="2", unit="gpu").admit(view_of(s, jobs, RATES, 10.0))
    assert in_gpu.admit == ("w_a",)
    assert in_gpu.reason_for("w_b") == (
        "quota: entity 'B' has 2.5 GPU-hours of work scheduled; with this job's 1 it would pass its quota of 2"
    )
    # per-entity quotas: B's own 1.5 V100-hours leave no room (1 + 1 > 1.5)
    assert QuotaAdmission(hours="2", entities="B:1.5").admit(view_of(s, jobs, RATES, 10.0)).admit == ("w_a",)


def test_a_quota_stops_only_the_entity_over_it_and_admits_an_entitys_first_job_whatever_its_size():
    view = AdmissionView(
        0.0,
        (
            WaitingJob("a1", "A", "a", 1, 0.0, 1, 3 * 3600.0, 0.0),  # 3 V100-hours: over A's quota alone
            WaitingJob("a2", "A", "a", 1, 0.0, 1, 600.0, 0.0),  # would fit, but waits behind a1
            WaitingJob("b1", "B", "a", 1, 0.0, 1, 3600.0, 0.0),
            WaitingJob("b2", "B", "a", 1, 0.0, 1, 3600.0, 0.0),
        ),
        {"v100": 2}, 0, 0, 0,
    )
    assert QuotaAdmission(hours="1").admit(view).admit == ("a1", "b1")


def test_quota_parameters_are_checked():
    with pytest.raises(ValueError, match="entities='B': give ENTITY:HOURS"):
        QuotaAdmission(entities="B")
    with pytest.raises(ValueError, match="unit='tpu': v100 or gpu"):
        QuotaAdmission(unit="tpu")
    # No quota at all: a quota policy that admits everything, a forgotten parameter.
    with pytest.raises(ValueError, match="quota: give hours=H .* or entities=a:H1,b:H2"):
        QuotaAdmission()
    with pytest.raises(ValueError, match="quota: give hours=H"):
        QuotaAdmission(unit="gpu")
    # An entity given two quotas is a typo, not "the last one wins".
    with pytest.raises(ValueError, match="entities: 'a' given twice"):
        QuotaAdmission(entities="a:1,b:2,a:3")


class Raising:
    def admit(self, view):
        raise RuntimeError("boom")


class Exiting:
    def admit(self, view):
        sys.exit("no")  # a plug-in's bug: it must cost this boundary's admission, not the mechanism


class Unknown:
    def admit(self, view):
        return AdmissionDecision(("nobody",))


class ObjectReason:
    def admit(self, view):
        return AdmissionDecision((), reasons={j.job_id: {"busy"} for j in view.waiting})  # a set: no JSON


def test_admit_through_offers_the_queue_first_and_keeps_the_rest_with_why():
    s = state(v100=1).build()
    queue = [NewJob("q0", "a", 1, 100, 0.0)]
    arrivals = [NewJob("n1", "a", 1, 100, 5.0), NewJob("huge", "a", 4, 100, 5.0)]
    out = admit_through(s, LoadAdmission(), queue, arrivals, GAVEL, RATES, 7.0)
    assert [j.job_id for j in s.jobs.values()] == ["q0"]  # 1 GPU: only the first fits the bound
    assert s.admitted_at_s == {0: 7.0}
    assert [(j.job_id, why.startswith("load-based admission")) for j, why in out.queued] == [("n1", True)]
    assert [(j.job_id, v.verdict) for j, v in out.others] == [("huge", "refuse")]  # feasibility comes first
    assert out.error == ""


@pytest.mark.parametrize(
    ("policy", "error"),
    [
        (Raising(), "raised RuntimeError: boom"),
        (Exiting(), "raised SystemExit: no"),
        (Unknown(), "admits 'nobody', which is not waiting"),
        # a reason gavel jobs could not send (the status reply carries the queue's reasons)
        (ObjectReason(), "a reason that is not a str"),
    ],
)
def test_a_policy_that_raises_or_answers_wrong_admits_every_feasible_job(policy, error):
    s = state(v100=1).build()
    out = admit_through(s, policy, [], [NewJob("n0", "a", 1, 100, 0.0), NewJob("n1", "a", 1, 100, 0.0)], GAVEL, RATES, 0.0)
    assert [j.job_id for j in s.jobs.values()] == ["n0", "n1"]
    assert (out.queued, out.error) == ([], error)


class Lazy:
    """Admits the first waiting job, its ids as a generator (read once)."""

    def admit(self, view):
        return AdmissionDecision((j.job_id for j in view.waiting[:1]), reason="one at a time")


def test_a_decision_of_a_generator_admits_the_jobs_it_names():
    """Checked and used as the same values (the check used the generator up, and every job
    then waited in the admission queue, with no error)."""
    s = state(v100=1).build()
    out = admit_through(s, Lazy(), [], [NewJob("n0", "a", 1, 100, 0.0), NewJob("n1", "a", 1, 100, 0.0)], GAVEL, RATES, 0.0)
    assert [j.job_id for j in s.jobs.values()] == ["n0"]
    assert ([(j.job_id, why) for j, why in out.queued], out.error) == ([("n1", "one at a time")], "")


def test_why_names_the_admission_queue():
    memory = Memory(state=state(v100=1).build())
    memory.queued = [(NewJob("w0", "a", 1, 100, 3.0), "load-based admission: ..."), (NewJob("w1", "a", 2, 100, 4.0), "quota: ...")]
    assert reason_codes(memory) == {"w0": ADMISSION, "w1": ADMISSION}
    assert explain(memory, "w1", 10.0) == {
        "code": "Admission", "reason": "in the admission queue: quota: ...", "gang_gpus": 2, "arrival_s": 4.0,
        "admission_queue_position": 2, "admission_queue_length": 2,
    }


def test_the_builtins_are_named_as_the_flags_name_them():
    assert sorted(ADMISSION_BUILTINS) == ["accept_all", "load", "quota"]
