"""``gavel simulate``'s flags: the groups other commands share (cluster, policy, plots; ``gavel
sweep`` takes the cluster's), the checks of the trace flags against each other, what a run still
lacks, and the flags that replay a run. Its parser needs only these at import: the simulator is
imported by the functions that check values against it.
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from common.errors import FaultSpecError
from mechanism_service.core.settings import PRESETS
from services.cli.common import PRESET_VALUE, CommandFailed

if TYPE_CHECKING:
    from sim.faults import FaultSpec

ENGINES = ("fast", "services")
ROUND_S_DEFAULT = 360.0
GPUS_PER_SERVER_DEFAULT = 1


def round_flags_given(round_s: float, gpus_per_server: int) -> list[str]:
    """The flags of the rounds and the servers set away from their defaults: what the fluid run
    (--ideal), which has no rounds and places no job on a server, would ignore."""
    return [flag for flag, given in (("--round-s", round_s != ROUND_S_DEFAULT),
                                     ("--gpus-per-server", gpus_per_server != GPUS_PER_SERVER_DEFAULT)) if given]
PRESET_NAMES = tuple(PRESETS)


def add_fault_flags(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("faults (docs/reliability.md; the services engine only)")
    group.add_argument(
        "--faults", metavar="SPEC",
        help="inject seeded faults: mix, or kind=value items such as worker-crash=2,hang=1,slow-gpu=1,job-crash=3,"
        "mechanism-crash=2,policy-crash=1,dup=0.05,reorder=0.05:4,delay=0.02:30,loss=0.02 (implies --engine services)",
    )
    group.add_argument(
        "--fault-seed", type=int, metavar="N", help="the faults' seed (default: --seed); a run replays with the same SPEC and N"
    )


def resolve_faults(args: argparse.Namespace) -> tuple[str, FaultSpec | None]:
    """(engine, fault spec): faults run on the services engine only (the fast path has no bus, no
    workers and no services to break); --engine fast with --faults is refused in one line."""
    from sim.faults import parse_spec
    from sim.scenario import bad_input

    if args.faults is None:
        if args.fault_seed is not None:
            raise bad_input("--fault-seed", "needs --faults")
        return args.engine or "fast", None
    if args.engine == "fast":
        raise bad_input("--faults", "needs --engine services (the fast path has no bus, workers or services to break)")
    try:
        spec = parse_spec(args.faults)
    except FaultSpecError as e:
        raise CommandFailed(str(e), exit_code=2) from None
    return "services", None if spec.empty else spec  # "none" (or all zeros): the plain services run


def add_plots_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-plots", dest="plots", action="store_false",
        help="write the numbers only (summary.json, jobs.csv, ...), no PNG plots: saves the plotting stack's start",
    )


def add_quiet_rounds_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-skip-quiet-rounds", dest="skip_quiet_rounds", action="store_false",
        help="plan every round, even those where nothing but time changes (by default they are advanced without "
        "planning: the same results, byte for byte; this is the check)",
    )


def add_estimator_flags(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("throughput estimation (docs/estimator.md)")
    group.add_argument(
        "--estimator", choices=("oracle", "learned"), default="oracle",
        help="oracle (default): the scheduler knows every true throughput, as Gavel's simulator; learned: it schedules "
        "on the estimator's estimates, learned from profiling runs and measurements",
    )
    group.add_argument(
        "--unknown-types", metavar="N|A,B,...",
        help="learned: job types removed from what the estimator and the mechanism know (they still run at their true "
        "speed): N of the trace's types drawn with --seed, or a list",
    )
    group.add_argument("--profiling-share", type=float, metavar="F", help="learned: at most this share of GPU time for profiling (default 0.1)")
    group.add_argument(
        "--profiling-percentage", type=float, metavar="P",
        help="learned: share of a new type's (type, reference) cells measured packed (Gavel's profiling_percentage; default 0.25)",
    )
    group.add_argument("--reference-models", type=int, metavar="K", help="learned: K reference job types per gang size (default: all)")
    group.add_argument(
        "--measurement-noise", type=float, metavar="SIGMA",
        help="learned: each measurement is the true rate times exp(SIGMA x a standard normal) (default 0)",
    )


def add_policy_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", metavar="NAME", help="the policy to simulate (gavel policy list); this or --policies is required")
    p.add_argument("--policies", metavar="A,B,...", help="several policies, compared side by side")


def add_cluster_flags(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``required``: argparse refuses a missing --cluster (``gavel simulate`` says itself, after
    checking the values it was given, so a missing flag does not hide a wrong one)."""
    p.add_argument(
        "--cluster",
        required=required,
        metavar="SPEC",
        help="required: GPUs per type, v100=36,p100=36,k80=36, or Gavel's 36:36:36 (v100:p100:k80)",
    )
    p.add_argument(
        "--throughputs", metavar="TABLE.json", help="throughput table in Gavel's format (default: the shipped Gavel table)"
    )
    p.add_argument("--round-s", type=float, default=ROUND_S_DEFAULT, metavar="S", help="round length in seconds (default 360)")
    p.add_argument("--gpus-per-server", type=int, default=GPUS_PER_SERVER_DEFAULT, metavar="G", help="GPUs per server (default 1)")
    p.add_argument(
        "--preset",
        choices=PRESET_NAMES,
        default="default",
        help="default: ours (docs/mechanism.md); gavel: Gavel's simulator, to reproduce its numbers",
    )


JOB_OPTION_FLAGS = ("--priority-weights", "--slos", "--fixed-run-time-s", "--steady-state")


def add_job_option_flags(group: argparse._ArgumentGroup) -> None:
    """The generated jobs' options beyond their arrivals (Gavel's generated-jobs driver's)."""
    group.add_argument(
        "--priority-weights", action="store_true",
        help="generated: 20%% of the jobs get priority weight 5 (Gavel's --generate-multi-priority-jobs)",
    )
    group.add_argument(
        "--slos", action="store_true",
        help="generated: each job an SLO of 1.2, 2 or 10 x its run time on a V100, a third each (Gavel's SLOs)",
    )
    group.add_argument(
        "--fixed-run-time-s", type=float, metavar="S",
        help="generated: every job runs S seconds on a V100 (Gavel's --fixed-job-duration)",
    )
    group.add_argument(
        "--steady-state", action="store_true",
        help="generated: first as many jobs as the cluster has GPUs, at t = 0, then the arrivals "
        "(Gavel's --simulate-steady-state): the cluster starts full",
    )


def given_job_options(args: argparse.Namespace) -> list[str]:
    """The job options given, as flags (a replay's, a label's)."""
    given = [flag for flag, on in (("--priority-weights", args.priority_weights), ("--slos", args.slos)) if on]
    if args.fixed_run_time_s is not None:
        given.append(f"--fixed-run-time-s {args.fixed_run_time_s:g}")
    if args.steady_state:
        given.append("--steady-state")
    return given


def job_options(args: argparse.Namespace, cluster: dict[str, int]) -> dict[str, object]:
    """The generator's options (TraceSpec's fields) from the flags; the steady state fills
    ``cluster``'s GPUs, type by type in sorted order as Gavel does."""
    return {
        "priority_weights": args.priority_weights,
        "slos": args.slos,
        "fixed_run_time_s": args.fixed_run_time_s,
        "steady_state_gpus": tuple(cluster[w] for w in sorted(cluster)) if args.steady_state else (),
    }


def check_trace_flags(args: argparse.Namespace) -> bool:
    """Refuse trace flags that contradict each other or are out of range, before anything is
    read or generated; True when the flags ask for a generated trace."""
    from sim.scenario import bad_input

    generating = (
        args.jobs is not None or args.jobs_per_hour is not None or args.static or args.multi_gpu
        or args.trace_seed is not None or any(given_job_options(args))
    )
    if args.trace is not None and generating:
        raise bad_input(
            "--trace",
            "a trace file and generation options (--jobs, --jobs-per-hour, --static, --multi-gpu, --trace-seed, "
            f"{', '.join(JOB_OPTION_FLAGS)}) exclude each other",
        )
    if args.fixed_run_time_s is not None and not 0 < args.fixed_run_time_s < math.inf:
        raise bad_input("--fixed-run-time-s", f"expected a number of seconds > 0, got {args.fixed_run_time_s:g}")
    if args.static and args.jobs_per_hour is not None:
        raise bad_input(
            "--jobs-per-hour", "cannot go with --static (Poisson arrivals at R per hour, or every job at t = 0: one of them)"
        )
    if args.jobs is not None and args.jobs < 1:
        raise bad_input("--jobs", f"expected a whole number >= 1, got {args.jobs}")
    if args.jobs_per_hour is not None and not 0 < args.jobs_per_hour < math.inf:
        raise bad_input("--jobs-per-hour", f"expected a number > 0, got {args.jobs_per_hour:g}")
    seed_flag, seed = ("--seed", args.seed) if args.trace_seed is None else ("--trace-seed", args.trace_seed)
    if generating and seed < 0:  # Gavel's generator seeds numpy with it
        raise bad_input(seed_flag, f"the trace's seed must be a whole number >= 0, got {seed}")
    return generating


def missing_flags(args: argparse.Namespace, generating: bool, no_policy: bool) -> list[str]:
    """What the run still needs, each with what to give, in the order of the help."""
    missing = []
    if args.trace is None and not generating:
        missing.append("the jobs (--trace FILE, or --jobs N with --jobs-per-hour R or --static)")
    if generating and args.jobs is None:
        missing.append("--jobs N (how many jobs to generate)")
    if generating and args.jobs_per_hour is None and not args.static:
        missing.append("--jobs-per-hour R or --static (how the generated jobs arrive: Poisson at R per hour, or all at t = 0)")
    if no_policy:
        missing.append("--policy NAME (gavel policy list; or --policies A,B,... to compare several)")
    if args.cluster is None:
        missing.append("--cluster SPEC (GPUs per type: v100=4,p100=4,k80=4, or Gavel's 4:4:4)")
    return missing


def replay_flags(args: argparse.Namespace) -> str:
    """The flags besides the faults that a replay of this run needs."""
    parts = [f"--trace {args.trace}" if args.trace else f"--jobs {args.jobs}"]
    if args.trace is None:
        if args.jobs_per_hour is not None:
            parts.append(f"--jobs-per-hour {args.jobs_per_hour:g}")
        if args.static:
            parts.append("--static")
        if args.multi_gpu:
            parts.append("--multi-gpu")
        if args.trace_seed is not None:
            parts.append(f"--trace-seed {args.trace_seed}")
        parts += given_job_options(args)
    parts.append(f"--cluster {args.cluster}")
    if args.policy:
        parts.append(f"--policy {args.policy}")
    if args.policies:
        parts.append(f"--policies {args.policies}")
    parts += [f"--preset {args.preset}", f"--round-s {args.round_s:g}", f"--gpus-per-server {args.gpus_per_server}",
              f"--seed {args.seed}"]
    if args.catch_up_ratio is not PRESET_VALUE:
        parts.append(f"--catch-up-ratio {'none' if args.catch_up_ratio is None else f'{args.catch_up_ratio:g}'}")
    if args.window:
        parts.append(f"--window {args.window}")
    if args.throughputs:
        parts.append(f"--throughputs {args.throughputs}")
    if args.estimator != "oracle":
        parts.append(f"--estimator {args.estimator}")
    for flag in ("unknown_types", "profiling_share", "profiling_percentage", "reference_models", "measurement_noise"):
        value = getattr(args, flag)
        if value is not None:
            parts.append(f"--{flag.replace('_', '-')} {value}")
    return " ".join(parts)
