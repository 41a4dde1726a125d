"""The invariant checker (mechanism_service/core/invariants.py, `gavel check-journal`) over real
journals: a run through the services keeps I1-I5, and each invariant is caught when the journal
(or the workers' log, or the dead letters) is made to break it. ~2 s: two short runs."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import pathlib
import shutil
import sqlite3
import subprocess
import sys

import pytest

from common.codec import DEFAULT_CODEC
from common.journal import Journal, read_events
from common.messages import WorkerFenced
from mechanism_service.core import audit
from mechanism_service.core.invariants import DeadLetterFact, WorkerLease, check
from mechanism_service.core.settings import preset
from policy_service.service import shipped_context
from sim.driver import simulate_services
from sim.fastpath import RunConfig
from sim.traces import TraceJob, read_trace
from tests.support.data import REFERENCE

CLUSTER = {"v100": 2, "p100": 2, "k80": 2}


def short_trace() -> list[TraceJob]:
    """16 jobs of the reference trace, shortened, every fourth on 2 GPUs, arriving apart."""
    jobs = read_trace(REFERENCE / "static_n32_seed0.trace")[:16]
    return [
        dataclasses.replace(j, total_steps=max(1, j.total_steps // 40), scale_factor=2 if k % 4 == 0 else 1, arrival_time_s=k * 200.0)
        for k, j in enumerate(jobs)
    ]


# the journals are made once a module (two runs): on one xdist worker, not once on each
pytestmark = pytest.mark.xdist_group("invariants-journals")


@pytest.fixture(scope="module", params=["max_min_fairness_perf", "max_min_fairness_packed"])
def journal(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("journal") / "mechanism.sqlite"
    config = RunConfig(request.param, CLUSTER, preset("default", request.param))
    asyncio.run(simulate_services(short_trace(), config, shipped_context(), journal=Journal(path)))
    return path


@pytest.fixture
def rows(journal: pathlib.Path) -> list:
    return list(read_events(journal))


def boundaries(rows: list) -> list[tuple[int, audit.BoundaryRecord]]:
    return [(k, audit.decode_boundary(r[2])) for k, r in enumerate(rows) if r[1] == audit.BOUNDARY]


def replaced(rows: list, k: int, record: audit.BoundaryRecord) -> list:
    out = list(rows)
    seq, kind, _, at_s = rows[k]
    out[k] = (seq, kind, audit.encode_boundary(record), at_s)
    return out


def invariants(report) -> set[str]:  # noqa: ANN001
    return {v.invariant for v in report.violations}


def test_a_run_through_the_services_keeps_every_invariant(rows: list) -> None:
    report = check(rows, finished=True, progress_rounds=40, dead_letters=[])
    assert report.ok, report.violations[:5]
    assert report.checked["I1"] == 16 and not report.skipped
    assert all(report.checked[i] > 0 for i in ("I2", "I3", "I4", "I5"))
    leases = [lease for _, b in boundaries(rows) for lease in b.leases]
    assert any(len(lease.gpus) == 2 for lease in leases)  # the gangs' charges were checked too
    settled = [s for _, b in boundaries(rows) for s in b.settled]
    assert sum(s.steps[0] for s in settled if s.job_ids[0] == "0") > 0


def test_packed_leases_are_charged_a_share_each(request: pytest.FixtureRequest, rows: list) -> None:
    pairs = [s for _, b in boundaries(rows) for s in b.settled if len(s.job_ids) == 2]
    assert bool(pairs) == ("packed" in request.node.callspec.id)
    for s in pairs:
        assert s.charged_gpu_s[0] == pytest.approx(s.charged_gpu_s[1])
    assert check(rows).ok


# -- I1 -------------------------------------------------------------------------------------------


def test_a_job_without_an_end_breaks_i1_only_once_the_run_is_over(rows: list) -> None:
    k = next(k for k, r in enumerate(rows) if r[1] == audit.ENDED)
    job_id = audit.decode_end(rows[k][2]).job_id
    cut = rows[:k] + rows[k + 1:]
    assert check(cut, finished=False).ok  # a live journal: the job may still be running
    report = check(cut, finished=True)
    assert [(v.invariant, v.subject) for v in report.violations] == [("I1", job_id)]
    assert "never reached a terminal state" in report.violations[0].detail


def test_a_second_end_breaks_i1_unless_it_is_the_same_end_after_a_restart(rows: list) -> None:
    seq, kind, body, at_s = next(r for r in rows if r[1] == audit.ENDED)
    end = audit.decode_end(body)
    later = rows[-1][0] + 1

    def with_end(e: audit.EndRecord) -> list:
        return [*rows, (later, kind, audit.encode_end(e), e.at_s)]

    restarted = check(with_end(dataclasses.replace(end, epoch=end.epoch + 1, at_s=end.at_s + 5)), finished=True)
    assert restarted.ok and restarted.notes["ends_absorbed"] == 1
    twice = check(with_end(end), finished=True)  # the same incarnation ended it twice
    assert invariants(twice) == {"I1"}
    other = check(with_end(dataclasses.replace(end, outcome="cancelled", epoch=end.epoch + 1)), finished=True)
    assert invariants(other) == {"I1"} and "second terminal state: cancelled" in other.violations[0].detail


def test_a_refusal_with_no_submission_breaks_i1(rows: list) -> None:
    later = rows[-1][0] + 1
    refusal = audit.EndRecord("late-one", audit.REFUSED, "no such type", 1.0, 1)
    report = check([*rows, (later, audit.ENDED, audit.encode_end(refusal), 1.0)], finished=True)
    assert invariants(report) == {"I1"} and "no submission to refuse" in report.violations[0].detail


def test_a_refused_submission_was_never_accepted(rows: list) -> None:
    seq, kind, body, at_s = next(r for r in rows if r[1] == "submitted")
    later = rows[-1][0] + 1
    job_id = DEFAULT_CODEC.decode(body).message.spec.job_id
    refusal = audit.EndRecord(job_id, audit.REFUSED, "its id is taken", 9.0, 1)
    # submitted again and refused (the same id, another spec): nothing more to end
    report = check([*rows, (later, kind, body, at_s), (later + 1, audit.ENDED, audit.encode_end(refusal), 9.0)], finished=True)
    assert report.ok and report.checked["I1"] == 16


# -- I2 -------------------------------------------------------------------------------------------


def test_a_gpu_in_two_leases_of_a_round_breaks_i2(rows: list) -> None:
    k, record = next((k, b) for k, b in boundaries(rows) if len(b.leases) >= 2)
    first, second, *rest = record.leases
    clash = dataclasses.replace(second, gpus=first.gpus[:1] + second.gpus[1:])
    report = check(replaced(rows, k, dataclasses.replace(record, leases=(first, clash, *rest))))
    assert "I2" in invariants(report)
    assert any(v.invariant == "I2" and "leases it twice" in v.detail for v in report.violations)


def test_overlapping_leases_on_a_workers_gpu_break_i2() -> None:
    apart = [WorkerLease("v100-0", 0, "1:0", 0.0, 360.0), WorkerLease("v100-0", 0, "2:1", 360.0, 720.0)]
    assert check([], worker_leases=apart).ok
    overlap = [*apart, WorkerLease("v100-0", 0, "2:2", 700.0, 800.0)]
    report = check([], worker_leases=overlap)
    assert invariants(report) == {"I2"} and "v100-0/gpu0" == report.violations[0].subject


# -- I3 -------------------------------------------------------------------------------------------


def test_a_gpu_missing_from_the_pool_or_of_no_worker_breaks_i3(rows: list) -> None:
    k, record = next((k, b) for k, b in boundaries(rows) if b.leases and b.pool is not None)
    leased = {g for lease in record.leases for g in lease.gpus}
    free = [g for g in record.pool if g not in leased]
    assert free
    leaked = check(replaced(rows, k, dataclasses.replace(record, pool=tuple(g for g in record.pool if g != free[0]))))
    assert invariants(leaked) == {"I3"} and "leaked" in leaked.violations[0].detail
    ghost = check(replaced(rows, k, dataclasses.replace(record, pool=(*record.pool, ("gone-7", 0)))))
    assert invariants(ghost) == {"I3"} and "no live worker" in ghost.violations[0].detail
    outside = dataclasses.replace(record.leases[0], gpus=(("gone-7", 0),))
    stray = check(replaced(rows, k, dataclasses.replace(record, leases=(outside, *record.leases[1:]))))
    assert any("not in the pool" in v.detail for v in stray.violations)


def test_a_lost_worker_kept_past_its_grace_and_a_round_breaks_i3(rows: list) -> None:
    (k0, first), *rest = boundaries(rows)
    worker_id = first.workers[0][0]
    fence = DEFAULT_CODEC.encode(WorkerFenced(worker_id, 1, "silent"), source="test", sent_at_s=first.at_s)
    # declared lost right after the first boundary, yet every later boundary still counts it
    grace = [(k, dataclasses.replace(b, worker_grace_s=30.0)) for k, b in [(k0, first), *rest]]
    tampered = list(rows)
    for k, b in grace:
        tampered = replaced(tampered, k, b)
    tampered.insert(k0 + 1, (rows[k0][0], "lost", fence, first.at_s))
    report = check(tampered)
    assert "I3" in invariants(report)
    assert any(v.subject == worker_id and "past its grace" in v.detail for v in report.violations)
    held = [WorkerLease(worker_id, 0, "0:0", first.at_s - 10, first.at_s + 30 + first.round_s + 1)]
    assert any("ran 0:0 until" in v.detail for v in check(tampered, worker_leases=held).violations)


# -- I4 -------------------------------------------------------------------------------------------


def test_a_charge_or_credit_the_reports_do_not_account_for_breaks_i4(rows: list) -> None:
    k, record = next((k, b) for k, b in boundaries(rows) if b.settled and b.settled[0].steps[0] > 0)
    s = record.settled[0]
    over = dataclasses.replace(s, charged_gpu_s=(s.charged_gpu_s[0] + 1.0, *s.charged_gpu_s[1:]))
    report = check(replaced(rows, k, dataclasses.replace(record, settled=(over, *record.settled[1:]))))
    assert invariants(report) == {"I4"} and f"lease {s.lease_id} charged" in report.violations[0].detail
    more = dataclasses.replace(s, steps=(s.steps[0] + 1, *s.steps[1:]))
    assert invariants(check(replaced(rows, k, dataclasses.replace(record, settled=(more, *record.settled[1:]))))) == {"I4"}
    unreported = [r for r in rows if not (r[1] == "progress" and DEFAULT_CODEC.decode(r[2]).message.lease_id == s.lease_id)]
    report = check(unreported)
    assert any(v.invariant == "I4" and "say it ran nothing" in v.detail for v in report.violations)


def test_i4_is_not_checked_under_gavels_accounting(rows: list) -> None:
    k, record = boundaries(rows)[0]
    report = check(replaced(rows, k, dataclasses.replace(record, charges_from_previous_end=True)))
    assert "I4" not in report.checked and "previous round's end" in report.skipped["I4"]


# -- I5, I6, unreadable events ----------------------------------------------------------------------


def test_a_job_waiting_longer_than_the_bound_breaks_i5(rows: list) -> None:
    assert check(rows, progress_rounds=40).ok
    leased = collections.Counter(j for _, b in boundaries(rows) for x in b.leases for j in x.job_ids)
    job_id = leased.most_common(1)[0][0]
    assert leased[job_id] > 3
    starved = list(rows)  # the job is never leased: its leases and their settling taken out
    for k, b in boundaries(rows):
        starved = replaced(starved, k, dataclasses.replace(
            b, leases=tuple(x for x in b.leases if job_id not in x.job_ids),
            settled=tuple(x for x in b.settled if job_id not in x.job_ids),
        ))
    report = check(starved, progress_rounds=3)
    assert [(v.invariant, v.subject) for v in report.violations] == [("I5", job_id)]
    assert "waited 4 rounds without progress" in report.violations[0].detail
    last_at_s = boundaries(rows)[-1][1].at_s
    assert check(starved, progress_rounds=3, quiet_from_s=last_at_s + 1).ok  # nothing after the faults stopped


def test_dead_letters_need_a_reason_and_must_be_injected_poison() -> None:
    good = [DeadLetterFact("gavel.mechanism.progress", "undecodable: not msgpack", True)]
    assert check([], dead_letters=good).ok and check([], dead_letters=good).checked["I6"] == 1
    report = check([], dead_letters=[DeadLetterFact("q", "", True), DeadLetterFact("q", "handler failed: KeyError", False)])
    assert [v.invariant for v in report.violations] == ["I6", "I6"]
    assert "without a reason" in report.violations[0].detail and "not injected" in report.violations[1].detail


def test_an_unreadable_event_is_a_violation_not_a_crash(rows: list) -> None:
    seq, _, _, at_s = rows[0]
    report = check([(seq, audit.BOUNDARY, b"\xc1 not msgpack", at_s), *rows[1:]])
    assert any(v.invariant == "journal" and v.subject == f"event {seq}" for v in report.violations)


# -- gavel check-journal ----------------------------------------------------------------------------


def gavel(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.slow  # ~4-7 s a policy: gavel check-journal processes
def test_check_journal_exits_0_when_clean_1_on_a_violation_2_on_bad_input(journal: pathlib.Path, tmp_path: pathlib.Path) -> None:
    done = gavel("check-journal", str(journal), "--finished", "--progress-rounds", "40")
    assert done.returncode == 0, done.stderr
    assert "I4" in done.stdout and "holds" in done.stdout and "not checked" in done.stdout  # I6: no dead letters given

    broken = tmp_path / "broken.sqlite"
    shutil.copy(journal, broken)
    with sqlite3.connect(broken) as db:
        db.execute("DELETE FROM events WHERE seq = (SELECT MIN(seq) FROM events WHERE kind = 'ended')")
    done = gavel("check-journal", str(broken), "--finished", "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 1 and not report["ok"] and report["violations"][0]["invariant"] == "I1"
    assert gavel("check-journal", str(broken)).returncode == 0  # not over: the job may still run

    assert gavel("check-journal", str(tmp_path / "missing.sqlite")).returncode == 2
    bad_log = tmp_path / "workers.jsonl"
    bad_log.write_text('{"worker_id": "v100-0", "gpu_index": 0}\n')
    done = gavel("check-journal", str(journal), "--worker-log", str(bad_log))
    assert done.returncode == 2 and "line 1: no field 'lease_id'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
