"""A live mechanism forgets finished jobs under its retention rule (core/retention.py), with
everything it kept about them, and a restart from the journal forgets the same: memory and
snapshot stay bounded on a cluster that runs for ever. In one process on the in-memory bus,
with the real policy service and a scripted worker; time is a clock the test moves."""

from __future__ import annotations

import pathlib

import pytest

from common.journal import read_events
from common.messages import JobCompleted, JobRejected, JobSpec
from mechanism_service.core.invariants import check
from mechanism_service.core.retention import LIVE, Retention
from services.cli.status_cmd import ask_on
from tests.support.waiting import eventually
from tests.support.world import RESNET, World, kill, world

RULE = Retention(finished_s=1000.0, finished_jobs=None, rounds=2, lost_workers=None)


def completions(w: World, job_id: str) -> int:
    return sum(isinstance(m, JobCompleted) and m.job_id == job_id for m in w.events.messages)


def remembered(w: World, job_id: str) -> list[str]:
    """Where the mechanism still holds something of ``job_id``."""
    memory, obs = w.memory, w.memory.observations
    places = {
        "completed": any(j.job_id == job_id for j in memory.state.completed),
        "ended_at_s": job_id in memory.ended_at_s, "known": job_id in memory.intake.known,
        "ended_jobs": job_id in memory.ended_jobs, "history": job_id in obs.history, "attempts": job_id in obs.attempts,
        "measured": job_id in obs.measured,
    }
    return [name for name, held in places.items() if held]


async def finish(w: World, spec: JobSpec, times: int = 1) -> None:
    await w.submit(spec)
    await w.events.wait_until(lambda: completions(w, spec.job_id) == times)


async def test_a_finished_job_is_forgotten_after_its_time_and_its_id_is_free_again(tmp_path: pathlib.Path) -> None:
    w = await world(tmp_path / "mechanism.sqlite", retention=RULE)
    a = await w.worker("a", "v100")
    a.answer = lambda command: {"steps": 10**6}  # every lease runs its job to the end
    await finish(w, JobSpec("old", RESNET, 100))
    assert remembered(w, "old") == ["completed", "ended_at_s", "known", "ended_jobs", "history", "attempts", "measured"]
    assert (await ask_on(w.bus, "job", job_id="old", timeout_s=10))["state"] == "completed"  # type: ignore[index]

    w.clock.advance(999.0)  # younger than the rule: kept through the next boundary
    await finish(w, JobSpec("young", RESNET, 100))
    assert "completed" in remembered(w, "old")
    w.clock.advance(2.0)  # "old" ended 1,001 s ago
    await finish(w, JobSpec("next", RESNET, 100))
    assert remembered(w, "old") == [] and remembered(w, "young")

    answer = await ask_on(w.bus, "job", job_id="old", timeout_s=10)
    assert "no job 'old'" in answer["error"] and "forgotten" in answer["error"]  # type: ignore[index]
    cluster = await ask_on(w.bus, "cluster", timeout_s=10)
    assert cluster["jobs_forgotten"] == 1 and cluster["jobs_completed"] == 2  # type: ignore[index]
    assert len(w.memory.round_reports) == 2 and w.memory.rounds_forgotten >= 1  # the newest rounds only
    round_ids = [r.round_id for r in w.memory.round_reports]
    assert round_ids == list(range(w.memory.rounds_forgotten, w.memory.rounds_forgotten + 2))

    # The id is free again: another job under it is a new job (not a conflict), and runs
    await finish(w, JobSpec("old", RESNET, 300), times=2)
    assert not any(isinstance(m, JobRejected) for m in w.events.messages)

    # A restart from the journal forgets what was forgotten, and keeps what was kept (the second
    # "old" completes again if the kill came before its boundary was written)
    await kill(w)
    again = await world(tmp_path / "mechanism.sqlite", retention=RULE)
    assert again.memory.observations.forgotten_jobs == 1
    b = await again.worker("b", "v100")
    b.answer = lambda command: {"steps": 10**6}
    await eventually(lambda: {j.job_id: j.total_steps for j in again.memory.state.completed} == {"young": 100, "next": 100, "old": 300})
    await again.mechanism.stop()
    # The id's two lives are two jobs to the invariants: each accepted once and ended once
    report = check(read_events(tmp_path / "mechanism.sqlite"), finished=True)
    assert report.ok, report.violations
    assert report.checked["I1"] == 4


async def test_the_newest_jobs_are_kept_up_to_the_count_whatever_their_age() -> None:
    w = await world(retention=Retention(finished_s=None, finished_jobs=2, rounds=None, lost_workers=None))
    a = await w.worker("a", "v100")
    a.answer = lambda command: {"steps": 10**6}
    for k in range(5):
        await finish(w, JobSpec(f"j{k}", RESNET, 100))
    await eventually(lambda: len(w.memory.ended_at_s) <= 3)  # forgotten at the boundary after each end
    kept = [j.job_id for j in w.memory.state.completed]
    assert kept[-2:] == ["j3", "j4"] and set(kept) <= {"j2", "j3", "j4"}
    assert w.memory.observations.forgotten_jobs == 5 - len(kept)
    assert not {"j0", "j1"} & set(w.memory.intake.known)
    await w.mechanism.stop()


@pytest.mark.parametrize(
    ("flags", "rule"),
    [
        ([], LIVE),
        (["--keep-finished-s", "none", "--keep-finished-jobs", "5", "--keep-rounds", "7"], Retention(None, 5, 7, LIVE.lost_workers)),
        (["--keep-finished-s", "60", "--keep-finished-jobs", "NONE", "--keep-rounds", "0"], Retention(60.0, None, 0, LIVE.lost_workers)),
        # wall seconds, as the worker grace: at x1000 an hour of the mechanism's time is 3.6 s
        (["--time-scale", "1000"], Retention(3_600_000.0, LIVE.finished_jobs, LIVE.rounds, LIVE.lost_workers)),
        (["--lockstep"], Retention(None, LIVE.finished_jobs, LIVE.rounds, LIVE.lost_workers)),  # trace time: the count
    ],
)
def test_gavel_serve_mechanism_forgets_under_the_rule_its_flags_give(flags: list[str], rule: Retention) -> None:
    from common.config import Settings
    from services.cli import build_parser
    from services.cli.serve_cmd import build_services

    args = build_parser().parse_args(["serve", "mechanism", "--no-journal", *flags])
    (mechanism,) = build_services(["mechanism"], args, Settings.from_env({}), "amqp")
    assert mechanism.config.retention == rule  # type: ignore[attr-defined]


@pytest.mark.parametrize(("flag", "value"), [("--keep-finished-s", "-1"), ("--keep-finished-jobs", "1.5"), ("--keep-rounds", "all")])
def test_a_bad_retention_flag_is_refused_saying_what_it_takes(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    from services.cli import build_parser

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", "mechanism", flag, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: must be" in err and f"(or none), got '{value}'" in err
