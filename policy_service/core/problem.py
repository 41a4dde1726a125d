"""The input of every policy: a frozen, validated snapshot of the cluster and its jobs.

Column-oriented on purpose: every per-job quantity is one numpy array (rows: jobs in input
order), every per-type quantity one array (columns: worker types in input order), so policies
build their programs with vectorised algebra. Arrays are read-only.

    n = number of jobs, K = number of worker (accelerator) types

    worker_counts            (K,)    GPUs of each type
    throughputs_steps_per_s  (n, K)  steps/s of the whole gang (scale-factor GPUs) alone; >= 0
    scale_factors            (n,)    GPUs per gang (int >= 1)
    priority_weights         (n,)    > 0
    steps_remaining          (n,)    >= 0
    time_since_arrival_s     (n,)    >= 0
    slo_s                    (n,)    deadline measured from arrival, NaN = none
    isolated_time_s          (n,)    FTF baseline accumulated so far (see ftf.py), >= 0
    entity_of_job            (n,)    index into ``entities``, -1 = none
    attained_service_gpu_s   (n,)    GPU-seconds each job has run so far (Tiresias' LAS), >= 0
    time_since_last_run_s    (n,)    since its last run ended (since arrival if it never ran), >= 0
    last_run_s               (n,)    length of its last uninterrupted run (0: never ran), >= 0

Packing (space sharing) data lives in :class:`Colocation`: jobs i != j may share GPUs iff their
colocation keys form a listed key pair. Keys are (job type, scale factor) classes when the pairs
come from a throughput table, one key per job when pairs are listed job by job, and (colocation
class, scale factor, throughput row) groups when they come from class colocations (an
estimator's fractions per class pair: jobs with equal rows share a key, so they still group).

:func:`validation.build_problem` is the one validated constructor; every error is a
ProblemError whose message starts with the JSON path of the offending field
(``jobs[3].throughputs.v100: ...``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache

import numpy as np


FAIRNESS = "fairness"
FIFO = "fifo"
ENTITY_POLICIES = (FAIRNESS, FIFO)


@dataclass(frozen=True)
class Entity:
    """A tenant of a hierarchical policy: its weight, and how it shares its part among its jobs."""

    name: str
    weight: float = 1.0
    policy: str = FAIRNESS  # fairness | fifo


@dataclass(frozen=True)
class JobSpec:
    """One job in row form, as written in the input. ``build_problem`` turns a list into a Problem.

    ``throughputs_steps_per_s`` may be None when a throughput table is given (looked up by
    ``job_type`` and ``scale_factor``); when given, the table is not consulted for the job, so
    its job type may be one the table does not know (a user's own script). ``isolated_time_s``
    is optional state for finish-time fairness (see ftf.py); 0 for a job seen for the first
    time. ``colocation_class`` names the job's class in the problem's class colocations
    (:class:`ClassPairSpec`); "" means it is never packed through them.
    """

    id: str
    steps_remaining: float
    job_type: str | None = None
    scale_factor: int = 1
    priority_weight: float = 1.0
    throughputs_steps_per_s: Mapping[str, float] | None = None
    time_since_arrival_s: float = 0.0
    slo_s: float | None = None
    entity: str | None = None
    isolated_time_s: float = 0.0
    colocation_class: str = ""
    # What the job has run (tiresias.py): GPU-seconds in all, seconds since its last run ended
    # (since arrival when it never ran), the length of its last uninterrupted run
    attained_service_gpu_s: float = 0.0
    time_since_last_run_s: float = 0.0
    last_run_s: float = 0.0


@dataclass(frozen=True)
class PairSpec:
    """Two jobs that may share GPUs: per worker type, (first job's, second job's) steps/s."""

    job_ids: tuple[str, str]
    throughputs_steps_per_s: Mapping[str, tuple[float, float]]


@dataclass(frozen=True)
class ClassPairSpec:
    """Two colocation classes that may share GPUs: per worker type, the fraction of its isolated
    steps/s that each member keeps, (first class's, second class's). A packed job's steps/s is
    its own isolated row times its fraction; a type left out cannot host the pair. The same
    class twice packs two different jobs of that class."""

    classes: tuple[str, str]
    fractions: Mapping[str, tuple[float, float]]


@dataclass(frozen=True)
class AllocationEntry:
    """One line of an allocation: a job (or a pair) and its time fraction on each worker type."""

    job_ids: tuple[str, ...]
    fractions: Mapping[str, float]


def _readonly(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class Colocation:
    """Which jobs may share GPUs, and how fast each runs when they do.

    key_of_job               (n,)       colocation key of each job, -1 = never packed
    key_pairs                (P, 2)     unordered key pairs, first <= second, sorted, unique
    throughputs_steps_per_s  (P, K, 2)  [p, k, 0]: steps/s of the job with key ``key_pairs[p,0]``
                                        when packed with one of key ``key_pairs[p,1]`` on type k;
                                        [p, k, 1]: the partner's. A self pair (a, a) packs two
                                        different jobs of one key (symmetric by construction).
    """

    key_of_job: np.ndarray
    key_pairs: np.ndarray
    throughputs_steps_per_s: np.ndarray

    @staticmethod
    def empty(num_jobs: int, num_types: int) -> Colocation:
        return _empty_colocation(num_jobs, num_types)

    @staticmethod
    def _made_empty(num_jobs: int, num_types: int) -> Colocation:
        return Colocation(
            key_of_job=_readonly(np.full(num_jobs, -1, dtype=np.int64)),
            key_pairs=_readonly(np.zeros((0, 2), dtype=np.int64)),
            throughputs_steps_per_s=_readonly(np.zeros((0, num_types, 2))),
        )

    @property
    def num_pairs(self) -> int:
        return int(self.key_pairs.shape[0])

    def find(self, key_a: np.ndarray, key_b: np.ndarray) -> np.ndarray:
        """Index into ``key_pairs`` of each (key_a[i], key_b[i]) in either order, -1 if not listed.

        Vectorised: encodes each unordered pair as one integer and binary-searches the sorted codes.
        """
        key_a = np.asarray(key_a, dtype=np.int64)
        key_b = np.asarray(key_b, dtype=np.int64)
        result = np.full(key_a.shape, -1, dtype=np.int64)
        if self.num_pairs == 0 or key_a.size == 0:
            return result
        base = int(max(self.key_pairs.max(), key_a.max(), key_b.max())) + 1
        codes = self.key_pairs[:, 0] * base + self.key_pairs[:, 1]
        low, high = np.minimum(key_a, key_b), np.maximum(key_a, key_b)
        wanted = low * base + high
        position = np.clip(np.searchsorted(codes, wanted), 0, codes.size - 1)
        hit = (codes[position] == wanted) & (key_a >= 0) & (key_b >= 0)
        result[hit] = position[hit]
        return result

    def job_pair_throughputs(self, job_a: np.ndarray, job_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For job pairs (job_a[i], job_b[i]): (index into key_pairs or -1, (m, K, 2) steps/s).

        ``[i, k, 0]`` is job_a[i]'s steps/s on type k, ``[i, k, 1]`` job_b[i]'s; zeros when the
        pair is not allowed.
        """
        key_a, key_b = self.key_of_job[job_a], self.key_of_job[job_b]
        index = self.find(key_a, key_b)
        found = index >= 0
        out = np.zeros((len(index), self.throughputs_steps_per_s.shape[1], 2))
        table = self.throughputs_steps_per_s[index[found]]
        swapped = key_a[found] > key_b[found]
        table = np.where(swapped[:, None, None], table[:, :, ::-1], table)
        out[found] = table
        return index, out


@lru_cache(maxsize=256)
def _empty_colocation(num_jobs: int, num_types: int) -> Colocation:
    """Colocation.empty, made once per shape: read-only arrays in a frozen dataclass, shared by
    the hundreds of unpacked problems of a simulation."""
    return Colocation._made_empty(num_jobs, num_types)


@dataclass(frozen=True, eq=False)
class PreviousAllocation:
    """The allocation the mechanism used last (optional; needed by the stateful Gavel policies:
    agnostic FIFO keeps running jobs where they are, AlloX keeps whole assignments, Gandiva keeps
    its pairs).

    job_fractions   (n, K)  time fraction each job ran alone on each type
    pair_jobs       (P, 2)  job indices of packed pairs
    pair_fractions  (P, K)
    """

    job_fractions: np.ndarray
    pair_jobs: np.ndarray
    pair_fractions: np.ndarray


@dataclass(frozen=True, eq=False)
class Problem:
    """A validated policy input (see the module docstring for every array's shape)."""

    worker_types: tuple[str, ...]
    worker_counts: np.ndarray
    job_ids: tuple[str, ...]
    job_types: tuple[str | None, ...]
    scale_factors: np.ndarray
    priority_weights: np.ndarray
    throughputs_steps_per_s: np.ndarray
    steps_remaining: np.ndarray
    time_since_arrival_s: np.ndarray
    slo_s: np.ndarray
    isolated_time_s: np.ndarray
    entity_of_job: np.ndarray
    entities: tuple[Entity, ...] = ()
    colocation: Colocation = field(default=None)  # type: ignore[assignment]  # set by build_problem
    prices_per_hour: np.ndarray | None = None  # (K,) $ per GPU-hour
    previous: PreviousAllocation | None = None
    # Where the packing data came from: "table" (keys = job type classes), "pairs" (listed job
    # by job), "classes" (class colocations) or "none". Kept so the JSON writer can round-trip
    # the input faithfully.
    colocation_source: str = "none"
    # (n,) each job's colocation class ("" = none); () when no job has one. With the class
    # colocations as given (validated; None: not given) they let the JSON writer round-trip the
    # input, and the packed programs key partners by colocation class (packing.cell_colocation)
    # when every job has its own row; ``colocation`` stays the one source of pair throughputs.
    colocation_classes: tuple[str, ...] = ()
    class_colocations: tuple[ClassPairSpec, ...] | None = None
    # (K,) the largest gang each type can host. None: worker_counts. A POP part holds a share
    # of the GPUs but its jobs still run on the whole type, so it keeps the cluster's value.
    gang_limits: np.ndarray | None = None
    # Opaque state a stateful policy handed back with its last allocation (Allocation.
    # policy_state), returned unchanged by the caller: Gavel's agnostic FIFO and Gandiva keep
    # assignments and a random stream between solves; this keeps the service stateless.
    policy_state: str | None = None
    # (n,) what each job has run (the module docstring); None only for a Problem made without
    # build_problem, read as zeros (``service_columns``)
    attained_service_gpu_s: np.ndarray | None = None
    time_since_last_run_s: np.ndarray | None = None
    last_run_s: np.ndarray | None = None

    def service_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(attained GPU-seconds, seconds since the last run, last run's length), each (n,)."""
        zeros = np.zeros(self.num_jobs)
        return tuple(  # type: ignore[return-value]
            zeros if column is None else column
            for column in (self.attained_service_gpu_s, self.time_since_last_run_s, self.last_run_s)
        )

    @property
    def gang_capacity(self) -> np.ndarray:
        """(K,) the largest gang (GPUs) each type can host."""
        return self.worker_counts if self.gang_limits is None else self.gang_limits

    @property
    def num_jobs(self) -> int:
        return len(self.job_ids)

    @property
    def num_types(self) -> int:
        return len(self.worker_types)

    @cached_property
    def job_index(self) -> Mapping[str, int]:
        """Job id -> row."""
        return {job_id: i for i, job_id in enumerate(self.job_ids)}

    def with_throughputs(self, throughputs_steps_per_s: np.ndarray) -> Problem:
        """The same problem seen with other isolated throughputs (agnostic views, normalisations)."""
        return replace(self, throughputs_steps_per_s=_readonly(np.array(throughputs_steps_per_s, dtype=float)))

    def subset(self, jobs: np.ndarray, worker_counts: np.ndarray | None = None) -> Problem:
        """The problem restricted to rows ``jobs`` (sorted job indices), optionally on other counts.

        Used by the POP wrapper. Pairs and the previous allocation keep only entries whose jobs
        are all in the subset. Counts may be fractional (a share of the cluster).
        """
        jobs = np.asarray(jobs, dtype=np.int64)
        position = np.full(self.num_jobs, -1, dtype=np.int64)
        position[jobs] = np.arange(len(jobs))
        colocation = Colocation(
            key_of_job=_readonly(self.colocation.key_of_job[jobs].copy()),
            key_pairs=self.colocation.key_pairs,
            throughputs_steps_per_s=self.colocation.throughputs_steps_per_s,
        )
        previous = None
        if self.previous is not None:
            kept = (position[self.previous.pair_jobs] >= 0).all(axis=1)
            previous = PreviousAllocation(
                job_fractions=_readonly(self.previous.job_fractions[jobs].copy()),
                pair_jobs=_readonly(position[self.previous.pair_jobs[kept]]),
                pair_fractions=_readonly(self.previous.pair_fractions[kept].copy()),
            )
        take = lambda array: _readonly(array[jobs].copy())  # noqa: E731
        counts = self.worker_counts if worker_counts is None else _readonly(np.asarray(worker_counts, float))
        return replace(
            self,
            worker_counts=counts,
            gang_limits=self.gang_capacity,
            job_ids=tuple(self.job_ids[i] for i in jobs),
            job_types=tuple(self.job_types[i] for i in jobs),
            colocation_classes=tuple(self.colocation_classes[i] for i in jobs) if self.colocation_classes else (),
            scale_factors=take(self.scale_factors),
            priority_weights=take(self.priority_weights),
            throughputs_steps_per_s=take(self.throughputs_steps_per_s),
            steps_remaining=take(self.steps_remaining),
            time_since_arrival_s=take(self.time_since_arrival_s),
            slo_s=take(self.slo_s),
            isolated_time_s=take(self.isolated_time_s),
            entity_of_job=take(self.entity_of_job),
            colocation=colocation,
            previous=previous,
            **{
                name: None if getattr(self, name) is None else take(getattr(self, name))
                for name in ("attained_service_gpu_s", "time_since_last_run_s", "last_run_s")
            },
        )

    def __eq__(self, other: object) -> bool:  # whole-value equality for tests (NaN == NaN)
        if not isinstance(other, Problem):
            return NotImplemented
        return _values_equal(self, other)

    __hash__ = None  # type: ignore[assignment]


def _values_equal(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.shape != b.shape:
            return False
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
    if isinstance(a, (Problem, Colocation, PreviousAllocation)):
        if type(a) is not type(b):
            return False
        return all(
            _values_equal(getattr(a, name), getattr(b, name))
            for name in a.__dataclass_fields__  # type: ignore[union-attr]
        )
    return a == b
