"""`gavel whatif` as a user runs it (in-process through services.cli.main) on the journal of a
run of the real services (tests/support/whatif.py): what it prints and writes, and one line with
exit 2 for each bad input."""

from __future__ import annotations

import csv
import json

import pytest

from common.codec import DEFAULT_CODEC
from common.journal import Journal
from common.messages import JobSpec, JobSubmitted
from services.cli import main
from tests.support.whatif import POLICY, arriving_trace, journal_of_run


@pytest.fixture(scope="module")
def journal(tmp_path_factory):
    """The journal of 12 arriving jobs under max_min_fairness_perf (~2 s)."""
    path = tmp_path_factory.mktemp("whatif") / "mechanism.sqlite"
    journal_of_run(path, arriving_trace())
    return path


def gavel(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_comparison_as_json_replays_the_policy_it_ran_and_the_candidates(journal, tmp_path, capsys):
    out = tmp_path / "cmp"
    code, stdout, _ = gavel(
        capsys, "whatif", "--journal", str(journal), "--policies", "fifo,max_min_fairness", "--json", "--no-plots",
        "--out", str(out),
    )
    assert code == 0
    report = json.loads(stdout)
    runs = {r["label"]: r for r in report["runs"]}
    assert list(runs) == ["real run", POLICY, "fifo", "max_min_fairness"]  # the policy it ran first
    assert runs[POLICY]["avg_jct_vs_real"] == pytest.approx(1.0, abs=1e-9)
    assert runs[POLICY]["p99_jct_s"] == pytest.approx(runs["real run"]["p99_jct_s"], abs=1e-6)
    assert runs["fifo"]["avg_jct_s"] > runs[POLICY]["avg_jct_s"]  # FIFO queues short jobs behind long ones
    assert all(r["jobs_completed"] == 12 for r in runs.values())
    assert report["real_run"] == {
        "policy": POLICY, "preset": "default", "round_s": 360.0, "cluster": {"k80": 2, "p100": 2, "v100": 2},
        "gpus_per_server": 1, "origin_s": 0.0, "jobs_measured": 12, "jobs_replayed": 12, "clocks": [],
        "boundary_lag_s": 0.0,
        "fleets": [{"at_s": 0.0, "gpus": {"k80": 2, "p100": 2, "v100": 2}}],
    }
    assert report["cells"]["measured"] + report["cells"]["assumed"] == 36 and report["cells"]["measured"] > 0
    written = json.loads((out / "comparison.json").read_text())
    assert written == {k: v for k, v in report.items() if k != "files"}
    assert report["files"] == [str(out / name) for name in ("comparison.json", "comparison.txt", "jobs.csv")]
    with (out / "jobs.csv").open() as f:
        jobs = list(csv.DictReader(f))
    assert len(jobs) == 12 and all(row[f"jct_s {POLICY}"] == row["jct_s real run"] for row in jobs)
    assert all(float(row["jct_s fifo"]) > 0 for row in jobs)


def test_the_table_names_the_real_run_and_each_policy(journal, tmp_path, capsys):
    code, stdout, _ = gavel(
        capsys, "whatif", "--journal", str(journal), "--policies", "fifo", "--no-plots", "--out", str(tmp_path / "t"),
    )
    assert code == 0
    lines = stdout.splitlines()
    assert lines[1] == f"real run: {POLICY}, preset default, rounds of 360 s, 2 k80, 2 p100, 2 v100"
    rows = {line.split()[0]: line.split() for line in lines if line.startswith(("real run", POLICY, "fifo "))}
    assert rows[POLICY][3] == "+0.0%" and rows["fifo"][3].startswith("+")
    assert (tmp_path / "t" / "comparison.txt").read_text().splitlines()[1].startswith("real run")


@pytest.mark.slow  # ~3-5 s: matplotlib imported, two figures drawn
def test_plots_are_written(journal, tmp_path, capsys):
    out = tmp_path / "plots"
    code, _, _ = gavel(capsys, "whatif", "--journal", str(journal), "--policies", "fifo", "--out", str(out))
    assert code == 0
    assert {p.name for p in out.iterdir()} == {"comparison.json", "comparison.txt", "jobs.csv", "jct_cdf.png", "summary.png"}
    assert all((out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for name in ("jct_cdf.png", "summary.png"))


def _no_finished_job(path):
    journal = Journal(path)
    body = DEFAULT_CODEC.encode(JobSubmitted(JobSpec("a", "ResNet-18 (batch size 64)", 100)), source="t", sent_at_s=0.0)
    journal.append("submitted", body, 0.0)
    journal.close()


@pytest.mark.parametrize(
    ("case", "argv", "says"),
    [
        ("missing", ["--journal", "{tmp}/none.sqlite", "--policies", "fifo"], "--journal: {tmp}/none.sqlite: no such journal"),
        ("corrupt", ["--journal", "{tmp}/bad.sqlite", "--policies", "fifo"], "--journal: {tmp}/bad.sqlite is not an SQLite database"),
        ("unfinished", ["--journal", "{tmp}/open.sqlite", "--policies", "fifo"], "--journal {tmp}/open.sqlite: no job finished"),
        ("unknown policy", ["--journal", "{journal}", "--policies", "fifo,nope"], "--policies: unknown policy 'nope'"),
        ("late --from", ["--journal", "{journal}", "--policies", "fifo", "--from", "30d"], "--from 2.592e+06: after the last arrival"),
        ("bad --from", ["--journal", "{journal}", "--policies", "fifo", "--from", "soon"], "argument --from: expected a duration"),
        ("bad --admission", ["--journal", "{journal}", "--policies", "fifo", "--admission", "lod"], "--admission: admission plug-in 'lod': unknown"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(journal, tmp_path, capsys, case, argv, says):
    (tmp_path / "bad.sqlite").write_text("not a database")
    _no_finished_job(tmp_path / "open.sqlite")
    argv = [a.format(tmp=tmp_path, journal=journal) for a in argv]
    try:
        code, stdout, stderr = gavel(capsys, "whatif", *argv, "--out", str(tmp_path / "out"), "--no-plots")
    except SystemExit as e:  # a flag argparse refuses
        code, stdout, stderr = e.code, *capsys.readouterr()
    assert code == 2, case
    assert stdout == "" and len(stderr.strip().splitlines()) == 1, stderr
    assert says.format(tmp=tmp_path) in stderr
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_the_seams_the_mechanism_ran_with_are_given_by_their_flags_and_apply_to_every_replay(journal, tmp_path, capsys):
    """The journal does not record the mechanism's admission, placement and launch: the operator
    names them. Load-based admission at a quarter of the cluster holds jobs the real run (which
    admitted every one) started at once, so the policy it ran no longer reproduces it."""
    runs = {}
    for label, seams in (("as ran", ()), ("load", ("--admission", "load", "--admission-param", "max_load=0.25"))):
        code, stdout, _ = gavel(
            capsys, "whatif", "--journal", str(journal), "--policies", "fifo", "--json", "--no-plots",
            "--out", str(tmp_path / label), *seams,
        )
        assert code == 0
        runs[label] = json.loads(stdout)
    assert runs["as ran"]["seams"]["admission"] == {"name": "accept_all", "params": {}}
    assert runs["load"]["seams"]["admission"] == {"name": "load", "params": {"max_load": "0.25"}}
    as_ran = {r["label"]: r for r in runs["as ran"]["runs"]}
    held = {r["label"]: r for r in runs["load"]["runs"]}
    assert as_ran[POLICY]["avg_jct_vs_real"] == pytest.approx(1.0, abs=1e-9)
    assert held[POLICY]["avg_jct_s"] > as_ran[POLICY]["avg_jct_s"]  # jobs wait in the admission queue
    assert held["fifo"]["avg_jct_s"] != as_ran["fifo"]["avg_jct_s"]  # every replay, not only the one it ran


BROKEN_POLICY = '''
class AlwaysRaises:
    """A policy plug-in whose every solve fails."""

    name = "always_raises"

    def allocate(self, problem):
        raise RuntimeError("the solver's licence expired")
'''


def test_a_policy_that_cannot_be_replayed_is_said_and_the_others_are_compared(journal, tmp_path, capsys, monkeypatch):
    """Under the gavel preset a job runs only where an allocation puts it: a policy that never
    answers leaves every job waiting, and its replay stalls."""
    (tmp_path / "whatife_broken.py").write_text(BROKEN_POLICY)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, stdout, stderr = gavel(
        capsys, "whatif", "--journal", str(journal), "--policies", "fifo,whatife_broken:AlwaysRaises", "--preset", "gavel",
        "--json", "--no-plots", "--out", str(tmp_path / "out"),
    )
    assert code == 1
    report = json.loads(stdout)
    assert [r["label"] for r in report["runs"]] == ["real run", POLICY, "fifo"]
    assert any(n.startswith("whatife_broken:AlwaysRaises could not be replayed") and "licence expired" in n for n in report["notes"])
    assert "gavel: whatife_broken:AlwaysRaises could not be replayed (see its note)" in stderr


def test_a_policy_that_never_answers_is_not_compared_though_its_jobs_ran_degraded(journal, tmp_path, capsys, monkeypatch):
    """Under the default preset the mechanism keeps the allocation in force and runs jobs on the
    GPUs it leaves idle, so a policy whose every solve fails still ends its replay: its figures are
    that fallback's, not the policy's, and it is a note and exit 1 as a stalled replay is."""
    (tmp_path / "whatife_broken2.py").write_text(BROKEN_POLICY)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, stdout, stderr = gavel(
        capsys, "whatif", "--journal", str(journal), "--policies", "fifo,whatife_broken2:AlwaysRaises",
        "--json", "--no-plots", "--out", str(tmp_path / "out"),
    )
    assert code == 1
    report = json.loads(stdout)
    assert [r["label"] for r in report["runs"]] == ["real run", POLICY, "fifo"]
    assert any(
        n.startswith("whatife_broken2:AlwaysRaises could not be replayed: its solves failed") and "licence expired" in n
        and "allocation kept in force" in n
        for n in report["notes"]
    ), report["notes"]
    assert "gavel: whatife_broken2:AlwaysRaises could not be replayed (see its note)" in stderr
    # the replays' events go to a file beside the results, not as JSON lines over the terminal
    assert "allocation_degraded" not in stderr
    log = tmp_path / "out" / "replays.log"
    assert any(json.loads(line)["event"] == "allocation_degraded" for line in log.read_text().splitlines())
    assert f"the replays' log: {log} (" in " ".join(report["notes"])
