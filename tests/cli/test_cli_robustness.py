"""A new user's walk-through of `gavel`, as real processes without a broker: bad journals, bad
flag values and unwritable output directories are one line with exit 2; `gavel up` says when
its bus is private; health says when a service stopped; `serve` waits for a broker that is not
up yet, for a bounded time; the mechanism keeps a journal by default; status reads for people.
(The same walk-through against RabbitMQ: tests/e2e/test_startup.py.)"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from services.cli.status_cmd import Table, describe
from tests.support.cli import gavel
from tests.support.processes import ROOT, the_line
from tests.support.waiting import eventually


def dead_url() -> str:
    """An AMQP URL nobody answers at (the port was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"amqp://guest:guest@127.0.0.1:{s.getsockname()[1]}/"


def offline_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No broker, no waiting for one, JSON events, and state kept under tmp_path (never ~)."""
    return {
        "GAVEL_AMQP_URL": dead_url(),
        "GAVEL_BROKER_WAIT_S": "0",
        "GAVEL_LOG_FORMAT": "json",
        "XDG_STATE_HOME": str(tmp_path / "state"),
        **extra,
    }


def events(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def run_all(cases: list[tuple[str, ...]], env: dict[str, str], timeout_s: float = 30) -> list[subprocess.CompletedProcess[str]]:
    """Each case a process, four at a time (each pays 0.2-2 s of start-up)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda argv: gavel(*argv, env=env, timeout_s=timeout_s), cases))


class Background:
    """A `gavel` process left running, its stderr (events) in a file."""

    def __init__(self, tmp_path: Path, name: str, *args: str, env: dict[str, str]) -> None:
        self.log = tmp_path / f"{name}.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("GAVEL_")}
        full_env.update(env)
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "services.cli", *args], cwd=ROOT, env=full_env, stdout=subprocess.DEVNULL, stderr=log
            )

    def events(self) -> list[dict[str, object]]:
        return events(self.log.read_text())

    def logged(self, event: str) -> bool:
        return any(e.get("event") == event for e in self.events())

    def stop(self, timeout_s: float = 20) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout_s)


# -- A. a journal that cannot be opened: one line, exit 2 ------------------------------------------


def test_a_journal_that_cannot_be_opened_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "a-directory").mkdir()
    (tmp_path / "notes.txt").write_text("not a database\n")
    (tmp_path / "a-file").write_text("")
    foreign = tmp_path / "other-app.sqlite"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE users (name TEXT)")
    cases = {
        ("--journal", str(tmp_path / "a-directory")): f"--journal: {tmp_path / 'a-directory'} is a directory",
        ("--journal", str(tmp_path / "notes.txt")): f"--journal: {tmp_path / 'notes.txt'} is not an SQLite database",
        ("--journal", str(tmp_path / "a-file" / "x.sqlite")): f"{tmp_path / 'a-file'} exists and is not a directory",
        ("--journal", "/proc/gavel-no-such/x.sqlite"): "--journal: /proc/gavel-no-such/x.sqlite: cannot create the directory",
        ("--journal", str(foreign)): f"--journal: {foreign} is an SQLite database but not a mechanism journal",
    }
    runs = run_all([("serve", "mechanism", *flags) for flags in cases], offline_env(tmp_path))
    for (flags, message), out in zip(cases.items(), runs, strict=True):
        assert out.returncode == 2, (flags, out.stderr)
        line = the_line(out.stderr)
        assert line.startswith("gavel: ") and message in line, (flags, line)
        assert "Traceback" not in out.stderr
    with sqlite3.connect(foreign) as db:  # another application's database is left as it was
        assert [r[0] for r in db.execute("SELECT name FROM sqlite_master")] == ["users"]


def test_a_bad_journal_path_from_the_environment_names_the_variable(tmp_path):
    out = gavel("serve", "mechanism", env=offline_env(tmp_path, GAVEL_JOURNAL_PATH=str(tmp_path)))
    assert out.returncode == 2, out.stderr
    assert the_line(out.stderr).startswith(f"gavel: GAVEL_JOURNAL_PATH: {tmp_path} is a directory")


# -- A. simulate: the output directory is checked before the simulation ---------------------------


def test_simulate_refuses_an_output_path_it_cannot_write_before_simulating(tmp_path):
    existing = tmp_path / "results.txt"
    existing.write_text("keep me\n")
    cases = {
        str(existing): f"gavel: --out: {existing} exists and is not a directory",
        str(existing / "run"): f"gavel: --out: cannot create {existing / 'run'}: {existing} exists and is not a directory",
    }
    base = ("simulate", "--jobs", "4", "--static", "--cluster", "1:1:1", "--policy", "fifo")
    runs = run_all([(*base, "--out", out) for out in cases], env={}, timeout_s=120)
    for (out_dir, message), out in zip(cases.items(), runs, strict=True):
        assert (out.returncode, out.stdout) == (2, ""), (out_dir, out.stdout, out.stderr)  # nothing was simulated
        assert out.stderr.strip() == message
    assert existing.read_text() == "keep me\n"


# -- B. flag values: refused at parse time, naming the flag ----------------------------------------


@pytest.mark.slow  # ~5-8 s: a gavel process per flag
def test_bad_numbers_are_refused_at_parse_time_naming_the_flag(tmp_path):
    health = tmp_path / "health.json"
    cases = [
        (("up", "--cluster", "1:1:1", "--round-s", "-1"), "--round-s", "-1"),
        (("up", "--cluster", "1:1:1", "--round-s", "0"), "--round-s", "0"),
        (("up", "--cluster", "1:1:1", "--time-scale", "0"), "--time-scale", "0"),
        (("up", "--cluster", "1:1:1", "--time-scale", "nan"), "--time-scale", "nan"),
        (("serve", "mechanism", "--time-scale", "-5"), "--time-scale", "-5"),
        (("serve", "fleet", "--cluster", "1:1:1", "--time-scale", "inf"), "--time-scale", "inf"),
        (("up", "--cluster", "1:1:1", "--gpus-per-server", "0"), "--gpus-per-server", "0"),
        (("serve", "mechanism", "--expect-gpus", "0"), "--expect-gpus", "0"),
        (("serve", "policy", "--broker-wait-s", "-1"), "--broker-wait-s", "-1"),
        (("jobs", "--timeout-s", "-1"), "--timeout-s", "-1"),
        (("cluster", "--timeout-s", "0"), "--timeout-s", "0"),
        (("health", str(health), "--max-age-s", "-1"), "--max-age-s", "-1"),
    ]
    # Before the flags were checked, `up --round-s -1` ran forever: the timeout bounds that.
    runs = run_all([argv for argv, _, _ in cases], offline_env(tmp_path), timeout_s=20)
    for (argv, flag, value), out in zip(cases, runs, strict=True):
        assert out.returncode == 2, (argv, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1, (argv, lines)  # no usage block: one line, like every error
        assert f": argument {flag}: must be " in lines[0] and repr(value) in lines[0], (argv, lines)
        assert "Traceback" not in out.stderr


# -- C. `gavel up` on the in-memory bus says that nothing outside can reach it --------------------


def test_up_help_says_the_in_memory_bus_is_private_to_the_process():
    out = gavel("up", "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())  # argparse wraps lines
    description, options = text.split("options:", 1)
    bus_help = options.split("--bus {memory,amqp}", 1)[1].split(" --amqp URL", 1)[0]
    for part in (description, bus_help):
        assert "gavel submit" in part and "cannot reach" in part and "--bus amqp" in part, part


@pytest.fixture(scope="module")
def memory_up(tmp_path_factory) -> dict[str, object]:
    """`gavel up` on the in-memory bus with a mechanism, run until ready then stopped with
    SIGTERM: what it logged, and what `gavel health` said before and after (about 4 s)."""
    tmp_path = tmp_path_factory.mktemp("memory-up")
    health = tmp_path / "health.json"
    env = offline_env(tmp_path)
    up = Background(tmp_path, "up", "up", "--services", "mechanism,estimator", "--health-file", str(health), env=env)
    try:
        asyncio.run(eventually(lambda: health.exists() and json.loads(health.read_text())["ready"], timeout_s=30))
        while_running = gavel("health", str(health))
    finally:
        code = up.stop()
    return {
        "events": up.events(), "exit_code": code, "state": tmp_path / "state", "health": health,
        "while_running": while_running, "after_stop": gavel("health", str(health)),
    }


@pytest.mark.xdist_group("memory-up")  # one `gavel up` a module (memory_up), on one xdist worker
def test_up_on_the_in_memory_bus_warns_that_nothing_outside_can_reach_it(memory_up):
    warnings = [e for e in memory_up["events"] if e.get("event") == "memory_bus_only"]
    assert len(warnings) == 1 and warnings[0]["level"] == "warning", memory_up["events"]
    said = json.dumps(warnings[0])
    assert "gavel submit" in said and "gavel jobs" in said and "--bus amqp" in said


# -- D. health after the service stopped -----------------------------------------------------------


@pytest.mark.xdist_group("memory-up")  # one `gavel up` a module (memory_up), on one xdist worker
def test_health_says_stopped_once_the_service_stopped(memory_up):
    assert memory_up["while_running"].returncode == 0 and memory_up["while_running"].stdout.strip() == "ready"
    assert memory_up["exit_code"] == 0
    body = json.loads(memory_up["health"].read_text())
    assert (body["ready"], body["stopped"]) == (False, True) and body["stopped_at"] > 0
    after = memory_up["after_stop"]
    assert after.returncode == 1
    assert the_line(after.stderr).startswith("gavel: the service stopped at "), after.stderr


def test_health_says_stopped_after_a_failed_start(tmp_path):
    health = tmp_path / "health.json"
    out = gavel("serve", "estimator", "--health-file", str(health), env=offline_env(tmp_path))
    assert out.returncode == 1, out.stderr
    check = gavel("health", str(health))
    assert check.returncode == 1
    line = the_line(check.stderr)
    assert line.startswith("gavel: the service stopped at ") and "cannot connect to RabbitMQ" in line, line


# -- E. serve waits for the broker, for a bounded time; clients do not ----------------------------


def test_serve_retries_an_unreachable_broker_then_gives_up_with_one_line(tmp_path):
    out = gavel("serve", "estimator", "--broker-wait-s", "2", env=offline_env(tmp_path), timeout_s=30)
    assert out.returncode == 1, out.stderr
    line = the_line(out.stderr)
    assert line.startswith("gavel: cannot connect to RabbitMQ at amqp://guest:***@127.0.0.1:") and "gave up after" in line
    retries = [e for e in events(out.stderr) if e.get("event") == "broker_unreachable"]
    # attempts at 0, 0.5 and 1.5 s, then the bound shortens the wait (which attempt is the last
    # depends on how long each took)
    assert [e["attempt"] for e in retries][:2] == [1, 2] and [e["retry_in_s"] for e in retries][:2] == [0.5, 1.0], retries
    assert all(e["level"] == "warning" and "Connect call failed" in str(e["error"]) for e in retries)


def test_a_stop_while_waiting_for_the_broker_stops_at_once(tmp_path):
    serve = Background(tmp_path, "serve", "serve", "estimator", env=offline_env(tmp_path, GAVEL_BROKER_WAIT_S="60"))
    try:
        asyncio.run(eventually(lambda: serve.logged("broker_unreachable"), timeout_s=15))
    finally:
        code = serve.stop(timeout_s=10)
    assert code == 0
    assert not serve.logged("host_ready")


def test_client_commands_do_not_wait_for_the_broker(tmp_path):
    """Only `serve` and `up` wait: a user's command fails at once (the process timeout is the
    bound; GAVEL_BROKER_WAIT_S would otherwise keep it a minute)."""
    out = gavel("jobs", env=offline_env(tmp_path, GAVEL_BROKER_WAIT_S="60"), timeout_s=15)
    assert out.returncode == 1
    assert the_line(out.stderr).startswith("gavel: cannot connect to RabbitMQ at ")
    assert "broker_unreachable" not in out.stderr


# -- H. the mechanism keeps a journal unless told not to -------------------------------------------


@pytest.mark.parametrize(
    "argv", [("serve", "mechanism"), ("up", "--bus", "amqp", "--services", "mechanism")], ids=["serve", "up-amqp"]
)
def test_the_mechanism_keeps_a_journal_by_default(tmp_path, argv):
    env = offline_env(tmp_path, GAVEL_EXCHANGE="staging")
    out = gavel(*argv, env=env)
    assert out.returncode == 1, out.stderr  # no broker here: the journal is opened before connecting
    port = env["GAVEL_AMQP_URL"].rsplit(":", 1)[1].rstrip("/")
    journal = tmp_path / "state" / "gavel" / f"mechanism-staging@127.0.0.1_{port}.sqlite"  # the cluster's own
    opened = [e for e in events(out.stderr) if e.get("event") == "journal_opened"]
    assert [e["path"] for e in opened] == [str(journal)], out.stderr
    assert journal.is_file()


def test_no_journal_opts_out_with_a_warning(tmp_path):
    out = gavel("serve", "mechanism", "--no-journal", env=offline_env(tmp_path))
    assert out.returncode == 1, out.stderr
    disabled = [e for e in events(out.stderr) if e.get("event") == "journal_disabled"]
    assert len(disabled) == 1 and disabled[0]["level"] == "warning" and "restart" in json.dumps(disabled[0])
    assert not any(e.get("event") == "journal_opened" for e in events(out.stderr))
    assert not (tmp_path / "state").exists()


@pytest.mark.xdist_group("memory-up")  # one `gavel up` a module (memory_up), on one xdist worker
def test_up_on_the_in_memory_bus_keeps_no_journal(memory_up):
    assert not any(e.get("event") == "journal_opened" for e in memory_up["events"])
    assert not memory_up["state"].exists()


# -- G. `gavel cluster` and `gavel job` for people -------------------------------------------------


def test_a_report_reads_as_aligned_fields_with_nested_values_flattened():
    lines, tables = describe({
        "time_s": 1234.5, "policy": "max_min_fairness_perf", "capacity_gpus": {"k80": 2, "v100": 10},
        "in_use_gpus": {}, "last_solve_s": None, "healthy": True, "tags": ["a", "b"],
        "nested": {"deeper": {"x": 0.000125}}, "a_field_added_later": 7,
    })
    assert lines == [
        "time_s:               1234.5",
        "policy:               max_min_fairness_perf",
        "capacity_gpus.k80:    2",
        "capacity_gpus.v100:   10",
        "in_use_gpus:          -",
        "last_solve_s:         -",
        "healthy:              yes",
        "tags:                 a, b",
        "nested.deeper.x:      0.000125",
        "a_field_added_later:  7",
    ]
    assert tables == []


def test_a_job_reads_as_its_fields_then_its_placements_as_a_table():
    job = {
        "id": "12", "state": "running", "steps_done": 300, "allocation_share": {"v100": 0.5},
        "placements": [
            {"first_round": 1, "last_round": 4, "from_s": 360.0, "accelerator_type": "v100", "workers": [0, 1],
             "packed_with": []},
            {"first_round": 7, "last_round": 7, "from_s": 2520.0, "accelerator_type": "k80", "workers": [3],
             "packed_with": ["9"], "new_column": True},
        ],
    }  # fmt: skip
    lines, tables = describe(job)
    assert lines == [
        "id:                     12",
        "state:                  running",
        "steps_done:             300",
        "allocation_share.v100:  0.5",
    ]
    assert tables == [
        Table(
            "placements",
            ("first_round", "last_round", "from_s", "accelerator_type", "workers", "packed_with", "new_column"),
            (("1", "4", "360", "v100", "0, 1", "-", ""), ("7", "7", "2520", "k80", "3", "9", "yes")),
        )
    ]
    assert describe({"id": "12", "placements": []}) == (["id:          12", "placements:  -"], [])
