"""--catch-up-ratio of `gavel simulate` and `gavel serve mechanism` (docs/mechanism.md, "What a move
costs"): the mechanism runs with the value given, the preset's without it, and a bad value is
refused at parse time saying what the flag takes."""

from __future__ import annotations

import dataclasses
import json

import pytest

from common.config import Settings
from mechanism_service.core.settings import preset
from policy_service.service import shipped_context
from services.cli import build_parser, main
from services.cli.simulate_cmd import replay_flags
from sim.fastpath import RunConfig, simulate
from sim.traces import TraceSpec, TraceStreams, generate_trace

# 60 generated jobs at 2/h on 3:3:3: jobs fall behind there, so the flag changes the schedule
RUN = ("simulate", "--jobs", "60", "--jobs-per-hour", "2", "--cluster", "3:3:3", "--policy", "max_min_fairness_perf", "--no-plots", "--json")


@pytest.mark.slow  # ~10-19 s: four gavel simulate runs
def test_gavel_simulate_runs_the_ratio_given_and_the_presets_without_it(tmp_path, capsys):
    averages = {}
    for ratio in ("none", "1.3", None):
        code = main([*RUN, "--out", str(tmp_path / str(ratio)), *(("--catch-up-ratio", ratio) if ratio else ())])
        assert code == 0
        averages[ratio] = json.loads(capsys.readouterr().out)["avg_jct_s"]
    context = shipped_context()
    trace = generate_trace(TraceSpec(num_jobs=60, jobs_per_hour=2.0), context.table, TraceStreams.gavel(0))
    off = dataclasses.replace(preset("default", "max_min_fairness_perf"), catch_up_ratio=None)
    result = simulate(trace, RunConfig("max_min_fairness_perf", {"v100": 3, "p100": 3, "k80": 3}, off), context)

    assert averages["none"] == pytest.approx(sum(j.jct_s for j in result.jobs) / len(result.jobs), rel=1e-12)
    assert averages["1.3"] == averages[None] != averages["none"]  # the default preset's own value is 1.3


def test_a_replay_of_a_run_keeps_the_ratio_it_was_given():
    args = build_parser().parse_args([*RUN, "--catch-up-ratio", "none"])
    assert "--catch-up-ratio none" in replay_flags(args)
    assert "--catch-up-ratio" not in replay_flags(build_parser().parse_args(list(RUN)))


@pytest.mark.parametrize(("flags", "ratio"), [((), 1.3), (("--catch-up-ratio", "1.5"), 1.5), (("--catch-up-ratio", "none"), None)])
def test_gavel_serve_mechanism_runs_the_ratio_given_and_the_presets_without_it(flags, ratio):
    from services.cli.serve_cmd import build_services

    args = build_parser().parse_args(["serve", "mechanism", "--no-journal", *flags])
    (mechanism,) = build_services(["mechanism"], args, Settings.from_env({}), "amqp")
    assert mechanism.config.settings.catch_up_ratio == ratio  # type: ignore[attr-defined]


@pytest.mark.parametrize("command", [list(RUN), ["serve", "mechanism"]])
@pytest.mark.parametrize("value", ["1", "0.5", "all"])
def test_a_ratio_not_above_one_is_refused_saying_what_the_flag_takes(command, value, capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*command, "--catch-up-ratio", value])
    assert exited.value.code == 2
    assert f"argument --catch-up-ratio: must be a finite number > 1 (or none), got '{value}'" in capsys.readouterr().err

