"""The example package's placement and admission plug-ins (examples/gavel-example-plugins), found
by entry point once the package is installed and by package.module:Name, each on a hand-checked
case against the seams' contracts (mechanism_service/core/seams/).

The package is pip-installed into a temporary directory once (about 1.5 s).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import PluginError
from common.plugins import check_method, installed, resolve
from mechanism_service.core.seams.admission import (
    AdmissionView,
    EntityUsage,
    WaitingJob,
)
from mechanism_service.core.seams.placement import (
    Gang,
    PlacementRequest,
    answer_problem,
)


def test_the_package_declares_one_plugin_of_each_kind(on_path: Path) -> None:
    assert installed("policy")["weighted_share"].value == "gavel_example_plugins.policies:WeightedShare"
    assert installed("placement")["fewest_servers"].value == "gavel_example_plugins.placement:FewestServers"
    assert installed("admission")["per_entity_jobs"].value == "gavel_example_plugins.admission:PerEntityJobs"


SERVERS = ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11))


@pytest.mark.parametrize("spec", ["fewest_servers", "gavel_example_plugins.placement:FewestServers"])
def test_fewest_servers_puts_each_gang_on_the_emptiest_servers(on_path: Path, spec: str) -> None:
    strategy = resolve("placement", spec, {})()  # type: ignore[operator]
    check_method("placement", spec, strategy, "place", args=("request",))
    request = PlacementRequest(
        "v100", SERVERS, free=((2, 3), (5, 6, 7), (8, 9, 10, 11)),
        gangs=(Gang(("big",), 4), Gang(("pair",), 2), Gang(("one",), 1)),
    )
    placed = strategy.place(request)
    # by hand: only server 2 holds the 4-gang whole (consolidated would split it 2 + 2 over
    # servers 0 and 1); then free counts are 2, 3, 0: servers 0 and 1 hold the 2-gang, server 0
    # fits best; then 0, 3, 0: the last job goes to server 1
    assert placed == [(8, 9, 10, 11), (2, 3), (5,)]
    assert answer_problem(request, placed) == ""


def test_fewest_servers_spans_servers_only_when_no_server_holds_the_gang(on_path: Path) -> None:
    strategy = resolve("placement", "fewest_servers", {})()  # type: ignore[operator]
    # no server holds 5: the most free first, 3 + 2 (consolidated's lowest-first would be the same
    # here; with free counts 1, 2, 3 it would take three servers, this two)
    request = PlacementRequest("k80", SERVERS, free=((1, 2, 3), (6, 7), (11,)), gangs=(Gang(("a", "b"), 5),))
    assert strategy.place(request) == [(1, 2, 3, 6, 7)]
    request = PlacementRequest("k80", SERVERS, free=((3,), (6, 7), (9, 10, 11)), gangs=(Gang(("c",), 5),))
    assert strategy.place(request) == [(9, 10, 11, 6, 7)]
    with pytest.raises(TypeError, match="takes no parameters"):
        resolve("placement", "fewest_servers", {})(spread="1")  # type: ignore[operator]


def _view(waiting: tuple[WaitingJob, ...], usage: dict[str, EntityUsage]) -> AdmissionView:
    return AdmissionView(
        now_s=0.0, waiting=waiting, gpus_by_type={"v100": 4}, scheduled_jobs=sum(u.jobs for u in usage.values()),
        scheduled_gpus=0, running_jobs=0, usage_of=lambda: usage,
    )


def _job(job_id: str, entity: str | None) -> WaitingJob:
    return WaitingJob(job_id, entity, "ResNet-18 (batch size 64)", 1, 0.0, 1000, 100.0, 100.0)


@pytest.mark.parametrize("spec", ["per_entity_jobs", "gavel_example_plugins.admission:PerEntityJobs"])
def test_per_entity_jobs_admits_each_entity_up_to_its_cap_in_arrival_order(on_path: Path, spec: str) -> None:
    policy = resolve("admission", spec, {})(max_jobs="2")  # type: ignore[operator]
    check_method("admission", spec, policy, "admit", args=("view",))
    waiting = (
        _job("a1", "a"), _job("b1", "b"), _job("a2", "a"), _job("n1", None), _job("a3", "a"), _job("b2", "b"),
        _job("n2", None), _job("b3", "b"),
    )
    decision = policy.admit(_view(waiting, {"a": EntityUsage(jobs=1), "": EntityUsage(jobs=1)}))
    # by hand: a has 1 scheduled: a1 makes 2, a2 and a3 wait; b has none: b1 and b2 join, b3
    # waits; the jobs without an entity have 1: n1 joins, n2 waits
    assert decision.admit == ("a1", "b1", "n1", "b2")
    assert decision.reason_for("a2") == decision.reason_for("a3") == "entity a: 2 scheduled, at most 2"
    assert decision.reason_for("b3") == "entity b: 2 scheduled, at most 2"
    assert decision.reason_for("n2") == "jobs without an entity: 2 scheduled, at most 2"


def test_per_entity_jobs_refuses_parameters_it_cannot_use(on_path: Path) -> None:
    factory = resolve("admission", "per_entity_jobs", {})
    with pytest.raises(ValueError, match="max_jobs='0' is not a whole number >= 1"):
        factory(max_jobs="0")  # type: ignore[operator]
    with pytest.raises(TypeError, match="unknown parameters limit"):
        factory(limit="3")  # type: ignore[operator]


def test_a_kind_looks_only_in_its_own_group(on_path: Path) -> None:
    with pytest.raises(PluginError, match=r"^admission plug-in 'fewest_servers': unknown; .*installed \(gavel.admission\): per_entity_jobs;"):
        resolve("admission", "fewest_servers", {})
