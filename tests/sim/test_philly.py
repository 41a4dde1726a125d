"""Gavel's Philly-derived traces shipped with the simulator (`--trace philly:VC[:SEED]`; issue 26,
item 4): the same jobs as Gavel's files, the sizes the table lacks added by the fleets' rule, a
run to the end, and bad names refused in one line. About 2 s.
"""

from __future__ import annotations

import json

import pytest

from services.cli import main
from sim.scenario import load_context, trace_context
from sim.traces import read_trace
from sim.traces.philly import SEEDS, VIRTUAL_CLUSTERS, philly_trace, sized_table
from tests.support.data import GAVEL_TRACES

CONTEXT = load_context(None)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_shipped_traces_are_gavels_files_job_for_job(seed):
    for vc in VIRTUAL_CLUSTERS:
        assert philly_trace(vc, seed) == read_trace(GAVEL_TRACES / "msr" / f"seed={seed}" / f"{vc}.trace"), vc


def test_sizes_the_table_lacks_follow_the_fleets_rule_and_the_table_keeps_its_own():
    jobs = philly_trace("23dbec", 0)
    assert ("CycleGAN", 8) in {(j.job_type, j.scale_factor) for j in jobs}
    assert not CONTEXT.table.has_job("CycleGAN", 8)
    sized = sized_table(CONTEXT.table, jobs)
    for w in CONTEXT.table.accelerator_types:  # its nearest size is 1: x 8^0.75
        one_gpu = CONTEXT.table.isolated_steps_per_s[("CycleGAN", 1, w)]
        assert sized.isolated_steps_per_s[("CycleGAN", 8, w)] == pytest.approx(one_gpu * 8**0.75)
    assert all(sized.isolated_steps_per_s[k] == v for k, v in CONTEXT.table.isolated_steps_per_s.items())
    assert sized.pair_steps_per_s == CONTEXT.table.pair_steps_per_s
    # a file's trace keeps the context it was given, whatever its jobs
    assert trace_context("my.trace", jobs, CONTEXT) is CONTEXT


def test_a_philly_trace_runs_to_the_end_on_gavels_cluster(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["simulate", "--trace", "philly:51b7ef:1", "--cluster", "300:300:300", "--policy", "max_min_fairness_perf"]
    assert main([*argv, "--no-plots", "--json", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["jobs_completed"] == summary["jobs_total"] == len(philly_trace("51b7ef", 1)) == 18


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("philly:nope", "--trace: unknown virtual cluster 'nope' (known: 0e4a51, "),
        ("philly:6214e9:7", "--trace: no trace with seed 7 (Gavel published seeds 0, 1)"),
        ("philly:6214e9:x", "--trace: philly:6214e9:x: expected philly:VC or philly:VC:SEED"),
    ],
)
def test_a_bad_philly_name_is_refused_in_one_line(name, message, capsys):
    assert main(["simulate", "--trace", name, "--cluster", "4:4:4", "--policy", "fifo_perf", "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_trace_show_and_convert_take_a_philly_name(tmp_path, capsys):
    assert main(["trace", "show", "philly:ed69ec:1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_jobs"] == len(philly_trace("ed69ec", 1)) == 951
    assert main(["trace", "convert", "philly:51b7ef", "--output", str(tmp_path / "t.trace")]) == 0
    assert read_trace(tmp_path / "t.trace") == philly_trace("51b7ef", 0)  # 10 columns: the same jobs
    capsys.readouterr()
    # its gangs sized as gavel simulate sizes them: none left out of the GPU-hours (a CycleGAN x8
    # is not in the table, and simulate runs it)
    assert main(["trace", "show", "philly:23dbec", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["unsized_jobs"] == [] and shown["gpu_hours"] > 34.91
    assert main(["trace", "show", "philly:zz"]) == 2
    assert "philly:zz: unknown virtual cluster 'zz'" in capsys.readouterr().err
