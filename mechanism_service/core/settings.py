"""How the mechanism behaves: Gavel's semantics (preset ``gavel``) or ours (preset ``default``).

Every difference between the two is one field here, so each can be switched and measured on its
own (docs/mechanism.md). The policy-dependent fields (packing, FIFO's rule, the visiting order
of types) are filled in by whoever composes the system from the policy's name
(``for_policy``); the mechanism itself never asks which policy it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from common.errors import ConfigError

# Gavel visits accelerator types fastest first for heterogeneity-aware policies.
GAVEL_TYPE_ORDER = ("v100", "p100", "k80")

# Policies Gavel runs with a reshuffled type order each round (names without "Perf"/"Packing").
AGNOSTIC_POLICIES = frozenset(
    {
        "fifo",
        "isolated",
        "max_min_fairness",
        "finish_time_fairness",
        "min_total_duration",
        "max_min_fairness_water_filling",
        "srtf",  # not one of Gavel's: agnostic all the same
        "tiresias",
        "themis",
        "optimus",
    }
)
# Policies that schedule packed pairs (Gavel: "Packing" in the class name).
PACKING_POLICIES = frozenset(
    {
        "max_min_fairness_packed",
        "max_min_fairness_water_filling_packed",
        "finish_time_fairness_packed",
        "min_total_duration_packed",
        "fifo_packed",
        "gandiva",
        "gandiva_ts",  # not one of Gavel's: Gandiva's time-slicing, packing introspectively
        "max_sum_throughput_normalized_by_cost_packed_SLOs",
    }
)


@dataclass(frozen=True, slots=True)
class MechanismSettings:
    preset: str = "default"
    round_s: float = 360.0
    gpus_per_server: int = 1
    # Re-solve only when jobs or workers changed and at least this long after the last reset
    # (Gavel: 1920 s, so a new job can wait up to ~5 rounds for its first allocation).
    min_reset_interval_s: float = 1920.0
    # Gavel's quirk: "the first time" is tested as last_reset_s == 0, so a trace starting at 0
    # re-solves again at its first change.
    reset_quirk_at_zero: bool = True
    # Received time seeded per entry at a reset (and for a new job): half a round (Gavel).
    seed_received_s: float | None = None  # None: round_s / 2
    # A picked entry that is not in the allocation: Gavel leaves its GPUs idle for the round;
    # ours runs it (the GPUs were free anyway).
    run_unallocated: bool = False
    # Checkpoint/restore cost charged to a job that starts on GPUs it did not hold last round.
    restore_s: float = 0.0
    # Migration-aware rounds (core/migration.py, docs/mechanism.md "What a move costs"), both off
    # in Gavel's mechanism. Placement: every continuing entry keeps its GPUs before any fresh
    # placement, whatever its gang size (Gavel places gang sizes in turn, so a larger gang placed
    # afresh could take a smaller continuing entry's GPUs and make it move).
    extensions_first: bool = False
    # Priorities: a move is charged its cost: an entry that would start afresh on a type ranks
    # by the share of the round it would work, and its deficit counts net of the cost.
    charge_moves: bool = False
    # ... as this many restores per job the fresh start restarts (a pair restarts two). A move
    # sets off more restores than its own: the entry it displaces pays one when it comes back,
    # and a job that moves to its minor type for a stretch pays another to return; charged once,
    # a move wins a GPU for a deficit it does not repair (docs/mechanism.md "What a move costs").
    move_charge_restores: float = 1.0
    # Holds: an entry that moved keeps its GPUs (ahead of the greedy pass) while the restore it
    # paid is more than this share of the time it has run there since, and its allocation there
    # is not overshot by more than move_overshoot_moves moves' cost; None: every round is decided
    # afresh from the priorities alone (Gavel).
    move_overhead_share: float | None = None
    move_overshoot_moves: float = 10.0
    # Picking: every type's entries the allocation gives time there before any entry on a type
    # it gives none (those only fill GPUs left idle); off: one pass in visiting order (Gavel), so
    # a spare GPU of the first type goes to whoever comes first, the allocation's type or not.
    allocated_first: bool = False
    # Allocations: each new answer's single-job entries re-laid over the types, every job keeping
    # its throughput to this relative tolerance, so each job runs where the last allocation gave
    # it most time as much as it can (core/stability.py); None: the answer as given (Gavel).
    steady_types_tolerance: float | None = None
    # ... but only while the answer splits at most this many jobs over several types: the re-lay
    # is one LP whose simplex grows faster than linearly (2,000 split jobs ~50 ms, 20,000 ~1.5 s,
    # bench/round_plan.py), and it runs inside the boundary that installs the answer. Above it the
    # answer is installed as given, as with None.
    steady_max_split_jobs: int = 2_000
    # Jobs that fall behind (core/catch_up.py): a job on course for a finish-time-fairness ratio
    # above this if it waits this round is charged nothing for its moves, and no hold keeps it
    # waiting (the GPUs of the types it is allocated are left for it, as for a job that never
    # ran); None: the charge and the holds apply to every job.
    catch_up_ratio: float | None = None
    max_gang_failures: int = 5
    # Real workers (docs/mechanism.md, "Workers that fail, jobs that crash"). A job whose process
    # crashed in this many leases in a row fails (Gavel's limit, 5, as for gang failures).
    max_failed_attempts: int = 5
    # A worker that has sent heartbeats and then is silent for longer than this (seconds of the
    # mechanism's clock) is declared lost. None: never (simulated fleets send no heartbeats, and
    # virtual or lockstep time would not measure silence anyway).
    worker_grace_s: float | None = None
    # Gavel credits a round's time from the previous round's end, which is stale after an idle
    # gap (and 0 before the first round); ours from when the round was dispatched.
    round_start_from_previous_end: bool = False
    # Gavel counts a gang's lease with fewer steps than GPUs as a failure even when those were
    # every step the job had left (an odd remainder after a crash credited its checkpoint), so
    # such a job never finishes: 5 rounds later it is dropped. Ours: it finishes.
    finishing_gang_fails: bool = False
    # The seams (core/seams/, docs/mechanism.md "Seams"): each a built-in name, an installed entry
    # point (gavel.admission, gavel.placement) or package.module:Name, with its parameters as
    # (name, value) strings; resolved once at start (mechanism_service/plugins.py). The defaults
    # are today's behaviour, to the bit.
    admission: str = "accept_all"
    admission_params: tuple[tuple[str, str], ...] = ()
    placement: str = "consolidated"
    placement_params: tuple[tuple[str, str], ...] = ()
    launch: str = "priority"
    launch_params: tuple[tuple[str, str], ...] = ()
    # -- policy-dependent, see for_policy ---------------------------------------------------
    packing: bool = False
    only_allocated_run: bool = False  # FIFO's "no allocation, no run"
    shuffle_type_order: bool = False
    # Gavel's policies return a row for every entry they were given, zeros included, so every
    # entry present at the reset counts as allocated.
    zero_fill_allocation: bool = True
    type_order: tuple[str, ...] = GAVEL_TYPE_ORDER

    def __post_init__(self) -> None:
        if self.move_overhead_share is not None and not 0.0 < self.move_overhead_share <= 1.0:
            raise ConfigError(f"move_overhead_share must be in (0, 1], got {self.move_overhead_share}")
        if self.move_charge_restores < 0.0:
            raise ConfigError(f"move_charge_restores must be >= 0, got {self.move_charge_restores}")
        if self.move_overshoot_moves < 0.0:
            raise ConfigError(f"move_overshoot_moves must be >= 0, got {self.move_overshoot_moves}")
        if self.steady_types_tolerance is not None and not 0.0 <= self.steady_types_tolerance < 1.0:
            raise ConfigError(f"steady_types_tolerance must be in [0, 1), got {self.steady_types_tolerance}")
        if self.catch_up_ratio is not None and not self.catch_up_ratio > 1.0:
            raise ConfigError(f"catch_up_ratio must be > 1, got {self.catch_up_ratio}")
        if self.steady_max_split_jobs < 0:
            raise ConfigError(f"steady_max_split_jobs must be >= 0, got {self.steady_max_split_jobs}")

    @property
    def seed_s(self) -> float:
        return self.round_s / 2 if self.seed_received_s is None else self.seed_received_s

    def for_policy(self, policy: str) -> MechanismSettings:
        return replace(
            self,
            packing=policy in PACKING_POLICIES,
            only_allocated_run=policy.startswith("fifo"),
            shuffle_type_order=policy in AGNOSTIC_POLICIES,
        )


def gavel_preset(policy: str, *, round_s: float = 360.0, gpus_per_server: int = 1) -> MechanismSettings:
    """Gavel's simulator, as docs/gavel-semantics.md specifies it."""
    return MechanismSettings(
        preset="gavel", round_s=round_s, gpus_per_server=gpus_per_server, round_start_from_previous_end=True,
        finishing_gang_fails=True,
    ).for_policy(policy)


def default_preset(policy: str, *, round_s: float = 360.0, gpus_per_server: int = 1) -> MechanismSettings:
    """Ours: Gavel's mechanism with what wastes GPUs fixed (docs/mechanism.md, "Presets"):
    a new job is allocated at the next boundary instead of up to 1920 s later, a picked job is
    never left idle for lack of an allocation, and moving a job costs a checkpoint restore, which
    the rounds avoid paying (extensions first, moves charged, holds, allocated entries picked
    first, and answers re-laid so each job stays on its type: docs/mechanism.md)."""
    return MechanismSettings(
        preset="default",
        round_s=round_s,
        gpus_per_server=gpus_per_server,
        min_reset_interval_s=0.0,
        reset_quirk_at_zero=False,
        run_unallocated=True,
        restore_s=DEFAULT_RESTORE_S,
        extensions_first=True,
        charge_moves=True,
        move_charge_restores=DEFAULT_MOVE_CHARGE_RESTORES,
        move_overhead_share=DEFAULT_MOVE_OVERHEAD_SHARE,
        allocated_first=True,
        catch_up_ratio=DEFAULT_CATCH_UP_RATIO,
        # Not for packed answers (the pairs hold most of the time and stay as they are; re-laying
        # the singles around them measured worse: docs/mechanism.md "What a move costs"), nor for
        # the agnostic policies, which the re-lay by measured throughputs would make partly aware.
        steady_types_tolerance=(
            None if policy in PACKING_POLICIES or policy in AGNOSTIC_POLICIES else DEFAULT_STEADY_TYPES_TOLERANCE
        ),
    ).for_policy(policy)


# A checkpoint restore when a job lands on other GPUs: reading a few hundred MB of state and
# warming up the input pipeline; tens of seconds for the models in Gavel's table.
DEFAULT_RESTORE_S = 20.0
# A fresh start is charged six restores per job it restarts in the priorities: the smallest
# count at which, on Gavel's continuous calibration trace, both max_min_fairness_perf and _packed
# finish at or below the gavel preset's average JCT with a worst finish-time-fairness ratio no
# worse than before migration-aware rounds (bench/preset_differences.py --migration: 1 to 12).
DEFAULT_MOVE_CHARGE_RESTORES = 6.0
# A moved entry runs until its restore is at most 1% of its stretch (20 s restores: up to 2,000 s,
# 6 rounds of 360 s), unless that overshoots its allocation on the type by more than 10 moves'
# cost (200 s); bench/preset_differences.py measures the alternatives.
DEFAULT_MOVE_OVERHEAD_SHARE = 0.01
# A job on course for a finish-time-fairness ratio above 1.3 (waiting this round) catches up:
# charged nothing for its moves, never kept waiting by a hold (core/catch_up.py). Measured with
# bench/preset_differences.py --migration (docs/mechanism.md, "What a move costs").
DEFAULT_CATCH_UP_RATIO = 1.3
# An answer is re-laid keeping every job's throughput to 1e-4 of the policy's (core/stability.py):
# the same allocation as far as the policy can tell, the answer's own precision.
DEFAULT_STEADY_TYPES_TOLERANCE = 1e-4

PRESETS = {"default": default_preset, "gavel": gavel_preset}


def preset(name: str, policy: str, *, round_s: float = 360.0, gpus_per_server: int = 1) -> MechanismSettings:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})")
    return PRESETS[name](policy, round_s=round_s, gpus_per_server=gpus_per_server)
