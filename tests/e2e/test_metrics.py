"""Metrics across processes (issue 25, docs/metrics.md): the policy, the mechanism, the estimator
and a simulated fleet as processes over RabbitMQ, each serving its metrics (`--metrics-port 0`:
a port of the kernel's, which its `metrics_serving` line names); a small trace run to its end;
every endpoint scraped and parsed with Prometheus's text parser; the counters agree with the
mechanism's journal (rounds, jobs completed, submissions accepted) and with each other (the
leases the mechanism sent are the leases the fleet reported)."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.journal import read_events
from mechanism_service.core import audit
from tests.support.processes import Cluster, logged, run_jobs
from tests.support.scrape import Samples, scrape, total, value
from tests.support.waiting import eventually

pytestmark = pytest.mark.broker

SERVICES = ("policy", "mechanism", "estimator", "fleet")
JOBS = [
    ("ResNet-18 (batch size 64)", 3000), ("Transformer (batch size 16)", 1500), ("A3C", 2000),
    ("ResNet-18 (batch size 64)", 1000), ("Recommendation (batch size 2048)", 1500),
]  # fmt: skip


def journal_counts(journal: Path) -> dict[str, int]:
    """What the journal says happened: rounds started (boundaries that leased), jobs completed,
    submissions accepted (those journaled, less the ones refused on receipt)."""
    rounds = completed = submitted = refused = 0
    for _, kind, body, _ in read_events(journal):
        if kind == audit.BOUNDARY:
            rounds += audit.decode_boundary(body).round_id >= 0
        elif kind == audit.ENDED:
            outcome = audit.decode_end(body).outcome
            completed += outcome == "completed"
            refused += outcome == audit.REFUSED
        elif kind == "submitted":
            submitted += 1
    return {"rounds": rounds, "completed": completed, "accepted": submitted - refused}


def metric_counts(mechanism: Samples) -> dict[str, int]:
    return {
        "rounds": int(value(mechanism, "gavel_mechanism_rounds_total") or 0),
        "completed": int(value(mechanism, "gavel_mechanism_job_ends_total", outcome="completed") or 0),
        "accepted": int(value(mechanism, "gavel_mechanism_submissions_total", outcome="accepted") or 0),
    }


@pytest.mark.slow  # ~5-12 s: four service processes, five jobs over a few dozen scaled rounds
async def test_every_endpoint_parses_and_the_counters_agree_with_the_journal(cluster: Cluster, tmp_path: Path) -> None:
    journal = tmp_path / "mechanism.sqlite"
    metrics = ["--metrics-port", "0"]
    scale = ["--time-scale", "500"]  # a 360 s round in 0.72 s
    cluster.start("policy", "serve", "policy", "--solving", "inline", *metrics)
    cluster.start("estimator", "serve", "estimator", "--mode", "oracle", *metrics)
    cluster.start("fleet", "serve", "fleet", "--cluster", "v100=1,p100=1,k80=1", *scale, *metrics)
    cluster.start("mechanism", "serve", "mechanism", "--journal", str(journal), *scale, *metrics)

    def serving() -> bool:
        return all(logged(tmp_path / f"{name}.log", "metrics_serving") for name in SERVICES)

    try:
        await eventually(serving, timeout_s=60, poll_s=0.2)
    except TimeoutError:
        raise AssertionError(cluster.logs()) from None
    urls = {name: str(logged(tmp_path / f"{name}.log", "metrics_serving")[0]["url"]) for name in SERVICES}

    await run_jobs(cluster, tmp_path / "jobs.trace", JOBS, "m")

    # every job's end is journaled before its counter moves, and the last round's boundary record
    # before the round is counted: compare once both say every job completed
    def agreed() -> bool:
        return metric_counts(scrape(urls["mechanism"])) == journal_counts(journal)

    try:
        await eventually(agreed, timeout_s=30, poll_s=0.2)
    except TimeoutError:
        raise AssertionError(f"metrics {metric_counts(scrape(urls['mechanism']))} != journal {journal_counts(journal)}") from None

    s = {name: scrape(url) for name, url in urls.items()}  # parsed by Prometheus's own text parser
    for name in SERVICES:
        assert total(s[name], "gavel_build_info", service=name) == 1.0, name
    counts = journal_counts(journal)
    assert counts["completed"] == counts["accepted"] == len(JOBS) and counts["rounds"] > 0
    m = s["mechanism"]
    assert value(m, "gavel_mechanism_jobs", state="completed") == len(JOBS)
    assert value(m, "gavel_mechanism_job_completion_seconds_count") == len(JOBS)
    assert value(m, "gavel_mechanism_gpus", accelerator_type="v100", state="idle") == 1
    assert value(m, "gavel_mechanism_workers", state="up") == 3
    assert value(m, "gavel_mechanism_journal_replay_seconds") is not None
    # the mechanism's leases are the fleet's, counted in two processes
    assert total(s["fleet"], "gavel_worker_leases_total") == total(m, "gavel_mechanism_leases_total") > 0
    solves = total(s["policy"], "gavel_policy_solves_total", outcome="ok")
    assert solves > 0 and value(s["policy"], "gavel_policy_solve_duration_seconds_count", policy="max_min_fairness_perf") == solves
    assert value(s["estimator"], "gavel_estimator_measurements_total") > 0  # type: ignore[operator]
    for name in SERVICES:  # the host's own, in every process: nothing dead-lettered, its queues read
        refused = [v for (n, _), v in s[name].items() if n == "gavel_messages_dead_lettered_total"]
        assert refused == [0.0], name  # one series: the service (a policy replica under its own name)
    # read from the broker every 5 s: a read during the trace's burst says what waited then
    await eventually(
        lambda: value(scrape(urls["mechanism"]), "gavel_queue_messages", queue="mechanism.submissions") == 0,
        timeout_s=30, poll_s=0.5,
    )
