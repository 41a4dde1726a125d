"""The worker's decisions without a process: what it launches, with which environment, and what
it reports for each way a lease can end (worker_service/core.py)."""

from __future__ import annotations

from common.messages import ExtendLease, RunJobs
from worker_service.core import (
    Observed,
    Rendezvous,
    WorkerConfig,
    crash_reason,
    launches,
    lease_report,
    lease_terms,
    packed_with,
    safe_name,
    stale_epoch,
)

CONFIG = WorkerConfig(
    worker_id="w1", accelerator_type="v100", gpus=4, device="cpu", checkpoint_dir="/ckpt", work_dir="/work",
    run_dir="/run/w1", python="/usr/bin/python3", emulate_speed={"A3C": 0.5}, default_speed=1.0,
    workload_args=("--size", "small"),
)


def run(**kw) -> RunJobs:
    base = dict(
        worker_id="w1", round_id=7, lease_id="7:3", epoch=2, job_ids=("t/j1",), gpu_ids=(2,), lease_duration_s=30.0,
        max_steps=(500,), job_types=("ResNet-18 (batch size 32)",), resume_steps=(120,),
    )
    return RunJobs(**{**base, **kw})


def test_a_catalog_job_runs_its_workload_with_the_lease_in_its_environment() -> None:
    [launch] = launches(CONFIG, run(), 1000.0, None, {"PATH": "/bin"})
    assert launch.argv == ("/usr/bin/python3", "-m", "worker_service.workloads", "--job-type", "ResNet-18 (batch size 32)", "--size", "small")
    env = launch.env
    assert env["PATH"] == "/usr/bin:/bin"  # the worker's interpreter first: `python` in a command is it
    assert env["GAVEL_JOB_ID"] == "t/j1" and env["GAVEL_ROUND_ID"] == "7" and env["GAVEL_LEASE_ID"] == "7:3"
    assert float(env["GAVEL_LEASE_END_UNIX_S"]) == 1030.0 and env["GAVEL_STEP_BUDGET"] == "500"
    assert env["GAVEL_CHECKPOINT_DIR"] == "/ckpt/t_j1"  # one path component per job id
    assert env["GAVEL_RESUME_STEP"] == "120" and env["GAVEL_EMULATE_SPEED"] == "1.0"
    assert "CUDA_VISIBLE_DEVICES" not in env and "WORLD_SIZE" not in env
    assert launch.cwd == "/work" and launch.reports and launch.rank == 0


def test_cuda_sees_only_its_leased_gpus_and_speeds_follow_the_job_type() -> None:
    config = WorkerConfig(**{**{f: getattr(CONFIG, f) for f in CONFIG.__dataclass_fields__}, "device": "cuda"})
    [launch] = launches(config, run(gpu_ids=(1, 3), job_types=("A3C",)), 0.0, None, {})
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "1,3" and launch.env["GAVEL_EMULATE_SPEED"] == "0.5"


def test_a_users_command_runs_through_the_shell_in_its_working_directory() -> None:
    [launch] = launches(CONFIG, run(commands=("python train.py --lr 0.1",), working_dirs=("/home/u/exp",)), 0.0, None, {})
    assert launch.argv == ("/bin/sh", "-c", "exec python train.py --lr 0.1") and launch.cwd == "/home/u/exp"
    [compound] = launches(CONFIG, run(commands=("cd sub && python train.py",)), 0.0, None, {})
    assert compound.argv[2] == "cd sub && python train.py"  # a compound command keeps its shell


def test_a_packed_pair_is_two_processes_on_the_same_gpus() -> None:
    command = run(job_ids=("a", "b"), job_types=("A3C", "LM (batch size 5)"), max_steps=(10, 20), resume_steps=(0, 5))
    first, second = launches(CONFIG, command, 0.0, None, {})
    assert (first.job_id, second.job_id) == ("a", "b")
    assert first.env["GAVEL_GPU_IDS"] == second.env["GAVEL_GPU_IDS"] == "2"
    assert (first.env["GAVEL_STEP_BUDGET"], second.env["GAVEL_STEP_BUDGET"]) == ("10", "20")
    assert first.progress_file != second.progress_file


def test_a_gang_runs_one_rank_per_gpu_numbered_across_workers() -> None:
    command = run(gpu_ids=(0, 1), scale_factor=4, gang_workers=("w0", "w1"), first_rank=2)
    ranks = launches(CONFIG, command, 0.0, Rendezvous("10.0.0.5", 29500), {})
    assert [(r.rank, r.local_rank) for r in ranks] == [(2, 0), (3, 1)]
    for r in ranks:
        assert r.env["MASTER_ADDR"] == "10.0.0.5" and r.env["MASTER_PORT"] == "29500" and r.env["WORLD_SIZE"] == "4"
        assert r.env["RANK"] == str(r.rank) and r.env["LOCAL_RANK"] == str(r.local_rank)
        assert not r.reports  # rank 0 is on w0: that worker reports the gang
    assert ranks[0].env["GAVEL_GPU_IDS"] == "0" and ranks[1].env["GAVEL_GPU_IDS"] == "1"


def test_an_extension_to_a_restarted_worker_launches_from_its_fields() -> None:
    extend = ExtendLease("w1", 8, "8:3", 2, 30.0, ("j",), (400,), ("A3C",), 1, gpu_ids=(0,), resume_steps=(100,))
    [launch] = launches(CONFIG, extend, 0.0, None, {})
    assert launch.env["GAVEL_RESUME_STEP"] == "100" and launch.env["GAVEL_GPU_IDS"] == "0"
    assert lease_terms(extend, 0, 50.0).lease_end_unix_s == 80.0


def test_stale_epochs_are_refused() -> None:
    assert stale_epoch(1, 2) and not stale_epoch(2, 2) and not stale_epoch(3, 2)


def test_safe_names_are_one_path_component() -> None:
    assert safe_name("trace-abc123/42") == "trace-abc123_42"
    assert safe_name("../..") == "job" and "/" not in safe_name("a/b/../c")


def report(seen: Observed, partners: tuple[str, ...] = ()):
    return lease_report(
        job_id="j", worker_id="w1", lease_id="7:3", round_id=7, seen=seen, elapsed_s=31.0, accelerator_type="v100",
        packed_with=partners,
    )


def progress(**kw):
    return {"lease_id": "7:3", "state": "paused", "lease_steps": 40, "stepping_s": 20.0, "startup_s": 2.5,
            "restore_s": 0.5, "checkpoint_s": 0.2, "done": False, **kw}


def test_a_paused_lease_reports_its_checkpointed_steps_and_the_time_split() -> None:
    r = report(Observed(progress(), None))
    assert r is not None and r.outcome == "lease_end" and r.steps_done == 40 and not r.finished
    assert r.throughput_steps_per_s == 2.0  # 40 steps over 20 s of stepping: start-up and restore excluded
    assert (r.startup_s, r.restore_s, r.stepping_s, r.checkpoint_s, r.elapsed_s) == (2.5, 0.5, 20.0, 0.2, 31.0)
    assert (r.accelerator_type, r.packed_with) == ("v100", ())  # what the estimator learns from: where, and alone


def test_every_report_names_its_type_and_the_job_that_shared_its_gpus() -> None:
    """The estimator reads a packed run's steps/s as the pair's slowdown, not as a slower type:
    each job of a pair names the other, whichever way its lease ended."""
    pair = run(job_ids=("a", "b"), job_types=("A3C", "LM (batch size 5)"), max_steps=(10, 20), resume_steps=(0, 5))
    assert (packed_with(pair, "a"), packed_with(pair, "b"), packed_with(run(), "t/j1")) == (("b",), ("a",), ())
    for seen in (Observed(progress(), None), Observed(progress(state="running"), 1, "boom"), Observed(None, -9, killed=True)):
        r = report(seen, ("b",))
        assert r is not None and (r.accelerator_type, r.packed_with) == ("v100", ("b",)), seen


def test_a_finished_job_reports_finished() -> None:
    r = report(Observed(progress(state="exited", done=True), 0))
    assert r is not None and r.finished and r.outcome == "finished"


def test_nothing_to_report_while_it_runs() -> None:
    assert report(Observed(progress(state="running"), None)) is None
    assert report(Observed(progress(lease_id="6:3"), None)) is None  # the pause of the lease before


def test_a_crash_reports_no_steps_with_its_exit_code_and_stderr() -> None:
    r = report(Observed(progress(state="running", lease_steps=12), 1, "Traceback...\nValueError: bad lr\n"))
    assert r is not None and r.outcome == "crashed" and r.steps_done == 0 and r.exit_code == 1
    assert r.error.startswith("exit code 1: ") and r.error.endswith("ValueError: bad lr")


def test_killed_before_a_checkpoint_reports_no_steps_but_not_a_crash() -> None:
    r = report(Observed(None, -9, "", killed=True))
    assert r is not None and r.outcome == "killed" and r.steps_done == 0
    r = report(Observed(progress(state="exited"), 0, killed=True))
    assert r is not None and r.outcome == "killed" and r.steps_done == 40  # it checkpointed: its steps count


def test_a_script_that_never_uses_the_iterator_is_told_so() -> None:
    assert "LeaseIterator" in crash_reason(0, "")
    assert crash_reason(-11, "") == "killed by signal 11"
