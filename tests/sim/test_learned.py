"""The simulator with the learned estimator (issue 11): the services make the bus-free path's
schedule, jobs of types nobody told it of run and finish, a user's estimate off by 2x is
corrected by the policy's next solves, a pair that cannot share a GPU is learned, not crashed on,
and the schedule is close to the oracle's.

Costs (2 cores): the equivalence test ~8 s of CPU (both engines, packing, 20 jobs), the others a few
seconds each."""

from __future__ import annotations

import numpy as np
import pytest

from common.bus import Delivery
from common.messages import AllocationRequested, JobProgress
from mechanism_service.core.settings import preset
from policy_service.service import shipped_context
from sim.driver import simulate_services
from sim.fastpath import RunConfig, simulate
from sim.learning import EstimationConfig
from sim.metrics import measured_jcts_s
from sim.traces import TraceSpec, generate_trace
from sim.traces.job import TraceJob
from tests.sim.test_equivalence import assert_same_schedule

CONTEXT = shipped_context()
TABLE = CONTEXT.table
TYPES = sorted(TABLE.job_types)
UNKNOWN = tuple(TYPES[::3])  # a third of the job types


def config(policy: str, estimation: EstimationConfig, cluster: dict[str, int] | None = None, **kwargs) -> RunConfig:  # noqa: ANN003
    return RunConfig(policy, cluster or {"v100": 4, "p100": 4, "k80": 4}, preset("default", policy), seed=2, estimation=estimation, **kwargs)


def trace(num_jobs: int, seed: int = 7) -> tuple[TraceJob, ...]:
    return generate_trace(TraceSpec(num_jobs=num_jobs, jobs_per_hour=3.0), TABLE, np.random.default_rng(seed))


@pytest.mark.slow  # ~8 s of CPU (10-20 s wall under load): a learned run on the services and on the fast path
async def test_the_services_make_the_fast_paths_schedule_with_a_learned_estimator():
    # 20 jobs (6 of unknown types, 85 solves, 81 of them with colocated estimates, ~1,350 rounds):
    # the estimator's cost grows with the jobs running at once, and 40 jobs (13 unknown, 170
    # solves) cost ~25 s of CPU to prove the same equality.
    jobs = trace(20)
    run = config("max_min_fairness_packed", EstimationConfig("learned", UNKNOWN, measurement_noise=0.1))
    fast = simulate(jobs, run, CONTEXT)
    assert_same_schedule(fast, await simulate_services(jobs, run, CONTEXT))
    assert fast.estimation and any(s.colocated_mape is not None for s in fast.estimation)
    unknown_jobs = [j for j in fast.jobs if j.job_type in UNKNOWN]
    assert unknown_jobs and all(j.completion_s is not None for j in unknown_jobs)  # accepted, scheduled, done


@pytest.mark.slow  # ~4-7 s: three runs
def test_learned_stays_close_to_the_oracle_and_ahead_of_the_agnostic_policy():
    jobs = trace(60)
    policy = "max_min_fairness_perf"
    oracle = simulate(jobs, config(policy, EstimationConfig()), CONTEXT)
    learned = simulate(jobs, config(policy, EstimationConfig("learned", UNKNOWN)), CONTEXT)
    agnostic = simulate(jobs, config("max_min_fairness", EstimationConfig()), CONTEXT)
    mean = {name: float(np.mean(measured_jcts_s(r))) for name, r in (("oracle", oracle), ("learned", learned), ("agnostic", agnostic))}
    assert abs(mean["learned"] / mean["oracle"] - 1) < 0.05
    assert mean["learned"] < 0.9 * mean["agnostic"]
    # the estimates end close to the truth: every type measured, by profiling or by running
    assert learned.estimation[-1].isolated_mape < 0.01


async def test_a_users_estimate_off_by_2x_is_corrected_within_10_percent_after_its_first_leases():
    unknown = "ResNet-50 (batch size 64)"
    truth = {w: TABLE.isolated(unknown, 1, w) for w in ("v100", "p100", "k80")}
    jobs = (TraceJob("mine", unknown, 40_000, 1, 0.0), TraceJob("other", "LM (batch size 20)", 40_000, 1, 0.0))
    estimation = EstimationConfig("learned", (unknown,), user_estimates={"mine": {w: 2 * v for w, v in truth.items()}})
    seen: list[dict[str, float]] = []

    class PolicyInputs:
        name = "policy-inputs"

        async def start(self, bus) -> None:  # noqa: ANN001
            await bus.subscribe(self.name, [AllocationRequested.ROUTING_KEY], self.take, durable=False)

        async def stop(self) -> None:
            return None

        async def take(self, d: Delivery) -> None:
            for job in d.message.problem.jobs:
                if job.job_id == "mine":
                    seen.append(dict(job.throughputs_steps_per_s))

    run = config("max_min_fairness_perf", estimation, cluster={"v100": 1, "p100": 1, "k80": 1})
    result = await simulate_services(jobs, run, CONTEXT, observers=[PolicyInputs()])
    assert all(j.completion_s is not None for j in result.jobs)
    first, last = seen[0], seen[-1]
    assert first["v100"] == pytest.approx(2 * truth["v100"])  # what the user said, at first
    for w, value in truth.items():
        assert abs(last[w] / value - 1) < 0.10, (w, last[w], value)
    corrected = next(i for i, s in enumerate(seen) if all(abs(s[w] / truth[w] - 1) < 0.10 for w in truth))
    assert corrected <= 4  # a few solves: one lease on each type (profiling asks for the ones it lacks)


async def test_a_pair_that_cannot_share_a_gpu_is_learned_and_never_crashes_the_run():
    """Gavel's estimator schedules such a pair from an estimate and its simulator crashes. Here the
    estimate says it can share (ResNet-50 at batch size 128 is new to it), the first packed lease
    measures zero, and the pair is not packed on that type again. (The new class packed with
    itself cannot share the k80 either: the profiling run that asks for it measures that once.)"""
    a, b = "ResNet-18 (batch size 16)", "ResNet-50 (batch size 128)"
    assert TABLE.pair(a, b, 1, "k80") == (0.0, 0.0) and TABLE.pair(b, b, 1, "k80") == (0.0, 0.0)
    jobs = tuple(TraceJob(f"{name}-{i}", t, 3_000, 1, 0.0) for i in range(3) for name, t in (("a", a), ("b", b)))
    zero_leases: dict[tuple[str, str], set[int]] = {}  # the pair's names ("a" or "b") -> rounds measured zero

    class Progress:
        name = "progress-watch"

        async def start(self, bus) -> None:  # noqa: ANN001
            await bus.subscribe(self.name, [JobProgress.ROUTING_KEY], self.take, durable=False)

        async def stop(self) -> None:
            return None

        async def take(self, d: Delivery) -> None:
            report = d.message
            if report.packed_with and report.throughput_steps_per_s == 0:
                pair = tuple(sorted(job_id.split("-")[0] for job_id in (report.job_id, *report.packed_with)))
                zero_leases.setdefault(pair, set()).add(report.round_id)  # type: ignore[arg-type]

    run = config("max_min_fairness_packed", EstimationConfig("learned", (b,)), cluster={"k80": 2})
    result = await simulate_services(jobs, run, CONTEXT, observers=[Progress()])
    assert all(j.completion_s is not None for j in result.jobs)
    assert zero_leases[("a", "b")] == {0}  # measured once, in the first round, and never packed so again
    assert set(zero_leases) <= {("a", "b"), ("b", "b")} and all(len(rounds) == 1 for rounds in zero_leases.values())
