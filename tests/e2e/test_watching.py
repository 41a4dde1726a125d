"""`gavel events` and `gavel top` on a running cluster of service processes over RabbitMQ (issue 25,
items 3 and 5): the recent events and the stream (`--follow`, each event once, a restarted
mechanism's too, Ctrl-C ends it with exit 0), a job's own events, one frame of `gavel top` without escape codes, and `gavel top`
drawn in a real terminal (tmux) at 80x30 and 200x50, where no line wraps and the rows are the
cluster's jobs. One cluster: the policy, the mechanism and a fleet of 2 V100s and 2 K80s in one
`gavel up` process, on a scaled clock (--time-scale 120: a 360 s round lasts 3 wall seconds)."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.processes import ROOT, Cluster
from tests.support.waiting import eventually

pytestmark = pytest.mark.broker

TMUX = "/usr/bin/tmux"


def follow(cluster: Cluster, out: Path, *args: str) -> subprocess.Popen[bytes]:
    """`gavel events --follow ...` writing to ``out``, as a user leaves it running (one of the
    cluster's processes: stopped with them if the test ends early)."""
    with out.open("wb") as stdout, (out.with_suffix(".err")).open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "events", "--follow", *args], cwd=ROOT, env=cluster.env,
            stdout=stdout, stderr=stderr,
        )
    cluster.processes[f"events {out.name}"] = process
    return process


def json_lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def interrupt(process: subprocess.Popen[bytes]) -> int:
    """Ctrl-C, as a user stops it."""
    process.send_signal(signal.SIGINT)
    return process.wait(timeout=30)


class Tmux:
    """A terminal of a given size on a tmux server of the test's own (its own socket)."""

    def __init__(self, workdir: Path) -> None:
        self.socket = str(workdir / f"tmux-{uuid.uuid4().hex[:6]}")

    def run(self, *args: str) -> str:
        return subprocess.run([TMUX, "-S", self.socket, *args], capture_output=True, text=True, check=True, timeout=30).stdout

    def start(self, name: str, width: int, height: int, command: str) -> None:
        self.run("new-session", "-d", "-s", name, "-x", str(width), "-y", str(height), command)

    def screen(self, name: str) -> list[str]:
        """The lines as they show, a line the terminal wrapped joined again (-J): a frame that
        wraps has lines wider than the terminal here (-J keeps trailing spaces: stripped)."""
        return [line.rstrip() for line in self.run("capture-pane", "-p", "-J", "-t", name).rstrip("\n").split("\n")]

    def kill(self) -> None:
        subprocess.run([TMUX, "-S", self.socket, "kill-server"], capture_output=True, timeout=30)


@pytest.mark.slow  # ~20 s: a cluster of services in one process (started twice), jobs over a few 3 s rounds, two terminals
async def test_events_and_top_on_a_running_cluster(cluster: Cluster, tmp_path: Path) -> None:
    health = tmp_path / "up.health"
    up_args = (
        "up", "--bus", "amqp", "--services", "policy,mechanism,fleet", "--cluster", "v100=2,k80=2",
        "--time-scale", "120", "--no-journal", "--solving", "inline", "--health-file", str(health),
    )
    cluster.start("up", *up_args)
    await eventually(lambda: cluster.gavel("health", str(health)).returncode == 0, timeout_s=60, poll_s=0.3)
    everything = follow(cluster, tmp_path / "all.jsonl", "--json")
    only_long = follow(cluster, tmp_path / "long.txt", "--job", "long")
    # the streams are there before the jobs are (their queues bound: the recent events printed)
    await eventually(lambda: any(e["kind"] == "mechanism_started" for e in json_lines(tmp_path / "all.jsonl")), timeout_s=30)
    await eventually(lambda: (tmp_path / "long.err").exists(), timeout_s=30)
    for job_id, kind, steps in (("long", "ResNet-50 (batch size 64)", "500000"), ("short", "ResNet-18 (batch size 64)", "3000")):
        cluster.run("submit", "--job-type", kind, "--steps", steps, "--job-id", job_id)

    def short_done_and_a_round_after() -> bool:
        events = json_lines(tmp_path / "all.jsonl")
        done = [k for k, e in enumerate(events) if e["kind"] == "completed" and e["job_id"] == "short"]
        return bool(done) and any(e["kind"] == "round_started" for e in events[done[0]:])

    await eventually(short_done_and_a_round_after, timeout_s=90, poll_s=0.3)

    # the recent events the mechanism keeps: the stream's, in the same order
    recent = [json.loads(line) for line in cluster.run("events", "--json").splitlines()]
    streamed = json_lines(tmp_path / "all.jsonl")
    assert len({e["id"] for e in streamed}) == len(streamed)  # each once
    assert [e["id"] for e in streamed[: len(recent)]] == [e["id"] for e in recent][: len(streamed)]
    kinds = [e["kind"] for e in recent]
    assert kinds[0] == "mechanism_started" and kinds.count("worker_joined") == 4
    assert {"round_started", "round_ended", "placed", "completed"} <= set(kinds)
    joined = sorted(e["worker_id"] for e in recent if e["kind"] == "worker_joined")
    assert joined == ["k80-0", "k80-1", "v100-0", "v100-1"]
    short = [e for e in recent if e["job_id"] == "short"]
    assert [e["kind"] for e in short][0] == "placed" and short[-1]["kind"] == "completed"
    assert all(isinstance(e["time_s"], float) for e in recent)

    # one job's events, for people: a line each, its placement first
    lines = cluster.run("events", "--job", "short").splitlines()
    assert lines and all(" short" in line for line in lines)
    assert " placed " in lines[0] and "started on" in lines[0] and " completed " in lines[-1]
    assert all(line[:4].isdigit() and line[4] == "-" for line in lines)  # a local date first: the clock is tied to the wall
    none = cluster.gavel("events", "--job", "no-such-job")  # nothing to show is said, not silence
    assert (none.returncode, none.stdout) == (0, "") and "no events of job 'no-such-job'" in none.stderr

    # one frame, for a pipe: no escape codes, the cluster's types and jobs
    frame = cluster.run("top", "--once")
    assert "\x1b" not in frame
    rows = frame.splitlines()
    assert rows[0].startswith("gavel top") and {"GPUs", "Events"} <= set(rows)
    assert any(r.startswith("Jobs: 1 running") for r in rows)
    assert [r.split()[0] for r in rows if r.startswith(("k80 ", "v100 "))] == ["k80", "v100"]
    assert any(r.startswith("long ") and " running " in r for r in rows)
    assert not any(r.startswith("short ") for r in rows)  # completed: not running or waiting

    # `gavel top` in a real terminal, at 80x30 and 200x50
    tmux = Tmux(tmp_path)
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in cluster.env.items() if k.startswith(("GAVEL_", "XDG_", "PATH", "LANG", "LC_")))
    # after it, the shell says how it exited, and the window stays to be read
    command = f"cd {shlex.quote(str(ROOT))} && env {env} {shlex.quote(sys.executable)} -m services.cli top; echo top-exited=$?; sleep 600"
    try:
        for name, width, height in (("narrow", 80, 30), ("wide", 200, 50)):
            tmux.start(name, width, height, command)

            def drawn(name: str = name) -> bool:
                screen = tmux.screen(name)
                return any(line.startswith("long ") for line in screen) and any(line == "Events" for line in screen)

            await eventually(drawn, timeout_s=30, poll_s=0.2)
            screen = tmux.screen(name)
            assert max(map(len, screen)) <= width, "\n".join(screen)
            assert len(screen) <= height
            assert screen[0].startswith("gavel top") and "running" in screen[0]
            heading = next(line for line in screen if line.startswith("id "))
            assert heading.split()[:5] == ["id", "state", "on", "share", "ETA"]
            if width == 200:  # every column, the job's type last
                assert heading.split() == ["id", "state", "on", "share", "ETA", "done", "why", "share", "by", "type", "type"]
            below = screen[screen.index(heading) + 1 :]
            job_rows = [line.split()[0] for line in below[: below.index("")]]
            assert job_rows == ["long"]  # the cluster's one job running or waiting
            gpu_rows = [line.split()[:2] for line in screen if line.startswith(("k80 ", "v100 "))]
            assert gpu_rows == [["k80", "2"], ["v100", "2"]]
            # Ctrl-C: exit 0, the terminal's own screen back, no traceback
            tmux.run("send-keys", "-t", name, "C-c")
            await eventually(lambda name=name: any(line.startswith("top-exited=") for line in tmux.screen(name)), timeout_s=30)
            after = tmux.screen(name)
            assert "top-exited=0" in after and not any("Traceback" in line for line in after), "\n".join(after)
            assert not any(line.startswith("gavel top") for line in after)  # the frame was on the alternate screen
    finally:
        tmux.kill()

    # the mechanism again, without a journal (its rounds and epoch numbered from the start again):
    # the stream says its new start and its events, though their ids repeat the first one's
    cluster.stop("up")
    health.unlink()
    cluster.start("up", *up_args)

    # Every worker joins again. A registration the stopped process sent may still wait in the
    # mechanism's durable queue: that worker joins under the old process first and the new one
    # takes its place (a worker_lost, then its join), so count the workers, not the joins.
    def started_again() -> bool:
        events = json_lines(tmp_path / "all.jsonl")
        starts = [k for k, e in enumerate(events) if e["kind"] == "mechanism_started"]
        if len(starts) != 2:
            return False
        latest = {e["worker_id"]: e["id"].split(":")[2] for e in events[starts[1]:] if e["kind"] == "worker_joined"}
        return sorted(latest) == ["k80-0", "k80-1", "v100-0", "v100-1"] and len(set(latest.values())) == 1

    await eventually(started_again, timeout_s=60, poll_s=0.3)

    # Ctrl-C: exit 0, no traceback
    for process, err in ((everything, tmp_path / "all.err"), (only_long, tmp_path / "long.err")):
        assert interrupt(process) == 0
        assert "Traceback" not in err.read_text()
    long_lines = (tmp_path / "long.txt").read_text().splitlines()
    assert long_lines and all(" long" in line for line in long_lines) and " placed " in long_lines[0]
