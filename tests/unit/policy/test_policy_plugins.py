"""Policies by plug-in (policy_service/plugins.py, answer.py): the example package's policy by entry
point and by module:Name, answered like a built-in; a module:Name a replica was not started with
refused and never imported; a plug-in that cannot load, or that raises or answers nonsense,
refused with a line naming it.

The example package is pip-installed into a temporary directory once (about 1.5 s).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from common.errors import PluginError, UnknownPolicyError
from common.messages import (
    AllocationComputed,
    AllocationFailed,
    AllocationRequested,
    PolicyJob,
    PolicyProblem,
)
from policy_service.answer import SolveContext, answer
from policy_service.plugins import load_policy, policy_entry
from tests.support.example_plugins import (
    POLICY_ENTRY_POINT,
    POLICY_REFERENCE,
)
from tests.unit.policy.builders import PRICES, gavel_table

CONTEXT = SolveContext(table=gavel_table(), prices_per_hour=PRICES)
COUNTS = {"v100": 2, "p100": 4, "k80": 4}


def _request(policy: str, jobs: tuple[PolicyJob, ...]) -> AllocationRequested:
    return AllocationRequested("r1", policy, PolicyProblem(COUNTS, jobs), deadline_s=1e12)


def _jobs(*rows: tuple[str, str, int, float]) -> tuple[PolicyJob, ...]:
    return tuple(PolicyJob(job_id, job_type, scale, weight, 10_000, 0.0) for job_id, job_type, scale, weight in rows)


JOBS = _jobs(("a", "ResNet-18 (batch size 64)", 1, 1.0), ("b", "Transformer (batch size 64)", 1, 2.0),
             ("c", "LM (batch size 20)", 2, 1.0))


def _expected_weighted_share(jobs: tuple[PolicyJob, ...]) -> np.ndarray:
    """The example's rule, computed by hand here from the table, row by row (not its code)."""
    table = gavel_table()
    types = list(COUNTS)
    rows = []
    demand = dict.fromkeys(types, 0.0)
    for job in jobs:
        speeds = [table.isolated_steps_per_s[(job.job_type, job.scale_factor, k)] for k in types]
        rows.append([job.priority_weight * s for s in speeds])
        for k, claim in zip(types, rows[-1]):
            demand[k] += job.scale_factor * claim
    out = []
    for row in rows:
        shares = [claim * COUNTS[k] / demand[k] for k, claim in zip(types, row)]
        total = sum(shares)
        out.append([s / max(total, 1.0) for s in shares])
    return np.array(out)


def _fractions(reply: AllocationComputed) -> np.ndarray:
    by_job = {entry.job_ids[0]: entry.fractions for entry in reply.entries}
    return np.array([[by_job[j.job_id][k] for k in COUNTS] for j in JOBS])


def test_the_example_policy_answers_by_entry_point_without_being_named_at_start(on_path: Path) -> None:
    reply = answer(_request(POLICY_ENTRY_POINT, JOBS), CONTEXT)
    assert isinstance(reply, AllocationComputed), reply
    assert reply.policy == POLICY_ENTRY_POINT
    np.testing.assert_allclose(_fractions(reply), _expected_weighted_share(JOBS), rtol=1e-9)
    fractions = _fractions(reply)
    assert (fractions.sum(axis=1) <= 1 + 1e-9).all()
    assert (np.array([j.scale_factor for j in JOBS]) @ fractions <= np.array(list(COUNTS.values())) + 1e-9).all()


def test_a_module_reference_is_answered_only_by_a_replica_started_with_it(on_path: Path) -> None:
    served = SolveContext(table=CONTEXT.table, prices_per_hour=PRICES, plugins=(POLICY_REFERENCE,))
    reply = answer(_request(POLICY_REFERENCE, JOBS), served)
    assert isinstance(reply, AllocationComputed), reply
    np.testing.assert_allclose(_fractions(reply), _expected_weighted_share(JOBS), rtol=1e-9)

    refused = answer(_request(POLICY_REFERENCE, JOBS), CONTEXT)
    assert isinstance(refused, AllocationFailed)
    assert refused.reason.startswith(f"policy plug-in {POLICY_REFERENCE!r}: not served here")
    assert "never imports a module a request names" in refused.reason


def test_a_request_naming_a_module_never_imports_it(on_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "imported"
    (tmp_path / "plugb_side_effect.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass P: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reply = answer(_request("plugb_side_effect:P", JOBS), CONTEXT)
    assert isinstance(reply, AllocationFailed) and "not served here" in reply.reason
    assert not marker.exists() and "plugb_side_effect" not in sys.modules


def test_an_unknown_bare_name_still_lists_the_known_ones(on_path: Path) -> None:
    with pytest.raises(UnknownPolicyError) as caught:
        policy_entry("no_such_policy")
    assert "max_min_fairness_perf" in str(caught.value) and POLICY_ENTRY_POINT in str(caught.value)


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("plugb_broken_import:Anything",
         "module 'plugb_broken_import' does not import: ModuleNotFoundError: No module named 'plugb_no_such_dependency'"),
        ("plugb_broken_policies:WrongSignature", "allocate() cannot be called as allocate(problem): too many positional arguments"),
        ("plugb_broken_policies:factory_that_raises", "its factory raised ValueError: no configuration file"),
        ("plugb_broken_policies:NoSuch", "module 'plugb_broken_policies' has no attribute 'NoSuch'"),
    ],
)
def test_a_plugin_that_cannot_load_is_refused_naming_it(on_path: Path, spec: str, reason: str) -> None:
    with pytest.raises(PluginError) as caught:
        load_policy(spec)
    assert str(caught.value) == f"policy plug-in {spec!r}: {reason}"
    # and a replica started with it answers each request with that line, not a crash
    reply = answer(_request(spec, JOBS), SolveContext(table=CONTEXT.table, prices_per_hour=PRICES, plugins=(spec,)))
    assert isinstance(reply, AllocationFailed) and reply.reason == str(caught.value)


def test_a_plugin_raising_in_allocate_costs_that_answer(on_path: Path) -> None:
    spec = "plugb_broken_policies:RaisesOnSecondJob"
    context = SolveContext(table=CONTEXT.table, prices_per_hour=PRICES, plugins=(spec,))
    one = answer(_request(spec, JOBS[:1]), context)
    assert isinstance(one, AllocationComputed), one
    failed = answer(_request(spec, JOBS), context)
    assert isinstance(failed, AllocationFailed)
    assert failed.reason == f"policy plug-in {spec!r}: allocate raised RuntimeError: cannot share between 3 jobs"
    again = answer(_request(spec, JOBS[:1]), context)
    assert isinstance(again, AllocationComputed)  # the next request is answered as before


def test_a_plugin_calling_sys_exit_costs_that_answer_not_the_process(on_path: Path) -> None:
    spec = "plugb_broken_policies:Exits"
    failed = answer(_request(spec, JOBS), SolveContext(table=CONTEXT.table, prices_per_hour=PRICES, plugins=(spec,)))
    assert isinstance(failed, AllocationFailed)
    assert failed.reason == f"policy plug-in {spec!r}: allocate raised SystemExit: giving up"


def test_a_plugin_answer_that_is_no_allocation_is_refused(on_path: Path) -> None:
    spec = "plugb_broken_policies:Oversubscribes"
    reply = answer(_request(spec, JOBS), SolveContext(table=CONTEXT.table, prices_per_hour=PRICES, plugins=(spec,)))
    assert isinstance(reply, AllocationFailed)
    assert reply.reason == f"policy plug-in {spec!r}: allocate returned job 'a' scheduled 3 of the time (at most 1)"


def test_a_plugin_gets_only_the_parameters_its_factory_takes(on_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request's solver goes to a plug-in that takes one and not to one that does not; a seed
    reaches a factory taking ``seed``."""
    (tmp_path / "plugb_params.py").write_text(
        "from gavel_example_plugins.policies import WeightedShare\n"
        "SEEN = []\n"
        "def seeded(seed=None):\n"
        "    SEEN.append(seed)\n"
        "    return WeightedShare('seeded')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec, seed in (("plugb_params:seeded", 7), (POLICY_REFERENCE, 7)):
        request = AllocationRequested("r", spec, PolicyProblem(COUNTS, JOBS), deadline_s=1e12, seed=seed, solver="ECOS")
        reply = answer(request, SolveContext(table=CONTEXT.table, prices_per_hour=PRICES, plugins=(spec,)))
        assert isinstance(reply, AllocationComputed), reply
    assert sys.modules["plugb_params"].SEEN[-1] == 7


def test_the_metrics_label_a_plugin_it_serves_by_its_name(on_path: Path) -> None:
    from policy_service.service import PolicyMetrics

    metrics = PolicyMetrics(None, plugins=(POLICY_REFERENCE,))
    assert metrics.policy(POLICY_REFERENCE) == POLICY_REFERENCE
    assert metrics.policy(POLICY_ENTRY_POINT) == POLICY_ENTRY_POINT  # installed
    assert metrics.policy("fifo") == "fifo"
    assert metrics.policy("someone.elses:Module") == "unknown"  # a label set stays bounded


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("valid_for_s='soon'", "valid_for_s 'soon', not a number"),
        ("valid_for_s=float('nan')", "valid_for_s nan: seconds >= 0, or None for as long as the job set holds"),
        ("valid_for_s=-1.0", "valid_for_s -1.0: seconds >= 0, or None for as long as the job set holds"),
        ("policy_state={'a': 1}", "policy_state of type dict, not a str"),
        ("status='fine'", "status 'fine', not one of optimal, optimal_inaccurate, infeasible, failed"),
        ("pairs=None", "pairs of type NoneType, not PairShares"),
        ("objective='high'", "objective 'high', not a number"),
        ("solve_time_s=float('nan')", "solve_time_s nan: seconds >= 0, finite"),
        ("job_fractions=[['x']]", "an answer that cannot be read (ValueError: could not convert string to float: 'x')"),
    ],
)
def test_a_plugin_answer_with_a_field_the_mechanism_cannot_take_is_refused(
    on_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str, reason: str
) -> None:
    """Fields beside the fractions are the plug-in's too: one the reply cannot carry (a
    valid_for_s of 'soon' failed the reply's encoding, so the mechanism heard nothing) or the
    simulator cannot use (it stopped on a TypeError) is AllocationFailed naming the plug-in."""
    module = f"plugb_fields_{abs(hash(change))}"  # a module per case: loaded plug-ins are cached by spec
    (tmp_path / f"{module}.py").write_text(
        "import dataclasses\n"
        "from gavel_example_plugins.policies import WeightedShare\n"
        "class Bad:\n"
        "    name = 'bad'\n"
        "    def allocate(self, problem):\n"
        f"        return dataclasses.replace(WeightedShare('bad').allocate(problem), {change})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = f"{module}:Bad"
    context = SolveContext(table=CONTEXT.table, prices_per_hour=PRICES, plugins=(spec,))
    reply = answer(_request(spec, JOBS), context)
    assert isinstance(reply, AllocationFailed)
    assert reply.reason == f"policy plug-in {spec!r}: allocate returned {reason}"
    # and the simulator's in-process form of the same request
    from policy_service.answer import AdmittedRequest, answer_admitted
    from policy_service.core.admitted import AdmittedJobs

    jobs = AdmittedJobs(*zip(*((j.job_id, j.job_type, j.scale_factor, j.priority_weight, float(j.steps_remaining),
                                 j.time_since_arrival_s, None, 0.0) for j in JOBS)))  # type: ignore[arg-type]
    admitted = answer_admitted(AdmittedRequest("r", spec, COUNTS, jobs, (), packing=False), context)
    assert isinstance(admitted, AllocationFailed) and admitted.reason == reply.reason


def test_a_plugin_answer_that_holds_for_ever_is_sent_as_none(on_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """valid_for_s = inf (never re-solve) is what None says; the wire takes finite numbers only."""
    from common.codec import DEFAULT_CODEC

    (tmp_path / "plugb_forever.py").write_text(
        "import dataclasses\n"
        "from gavel_example_plugins.policies import WeightedShare\n"
        "class Forever:\n"
        "    name = 'forever'\n"
        "    def allocate(self, problem):\n"
        "        return dataclasses.replace(WeightedShare('forever').allocate(problem), valid_for_s=float('inf'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = "plugb_forever:Forever"
    reply = answer(_request(spec, JOBS), SolveContext(table=CONTEXT.table, prices_per_hour=PRICES, plugins=(spec,)))
    assert isinstance(reply, AllocationComputed) and reply.valid_for_s is None
    assert DEFAULT_CODEC.encode(reply, source="test", sent_at_s=0.0)


@pytest.mark.parametrize(
    ("baseline", "reason"),
    [
        ("raise KeyError('no table')", "isolated_baseline raised KeyError: 'no table'"),
        ("return [1.0]", "isolated_baseline returned 1 values, not 3 finite ones"),
    ],
)
def test_a_plugin_isolated_baseline_that_fails_costs_that_answer(
    on_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, baseline: str, reason: str
) -> None:
    """A plug-in's own isolated_baseline (what finish-time fairness is measured against) is the
    plug-in's code too: failing, it is AllocationFailed naming the plug-in on either path (the
    simulator's in-process one stopped on the exception)."""
    from policy_service.answer import AdmittedRequest, answer_admitted
    from policy_service.core.admitted import AdmittedJobs

    module = f"plugb_baseline_{abs(hash(baseline))}"
    (tmp_path / f"{module}.py").write_text(
        "from gavel_example_plugins.policies import WeightedShare\n"
        "class Bad(WeightedShare):\n"
        "    def isolated_baseline(self, problem):\n"
        f"        {baseline}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = f"{module}:Bad"
    context = SolveContext(table=CONTEXT.table, prices_per_hour=PRICES, plugins=(spec,))
    reply = answer(_request(spec, JOBS), context)
    assert isinstance(reply, AllocationFailed) and reply.reason == f"policy plug-in {spec!r}: {reason}"
    jobs = AdmittedJobs(*zip(*((j.job_id, j.job_type, j.scale_factor, j.priority_weight, float(j.steps_remaining),
                                 j.time_since_arrival_s, None, 0.0) for j in JOBS)))  # type: ignore[arg-type]
    admitted = answer_admitted(AdmittedRequest("r", spec, COUNTS, jobs, (), packing=False), context)
    assert isinstance(admitted, AllocationFailed) and admitted.reason == reply.reason
