"""How fast the mechanism believes a job runs, alone and packed: the throughputs its ledgers, its
planner and the policy's input use. Two kinds:

- ``TableRates``: a measured table is the truth (the simulator with the estimator in oracle
  mode, and Gavel's own simulator). Jobs are looked up by type; a type the table does not know is
  refused at submission, and the policy service fills throughputs from its own copy of the table.
- ``EstimatedRates``: the estimator's latest estimates (estimates.EstimateBook), job by job. Until
  the estimator has said something of a job, a documented prior: the user's own estimate at
  submission, else the reference table's figure for its type, else the typical job of its size in
  that table (the geometric mean of its types' figures). No job type is refused: a user's own
  script is scheduled from its prior until the first measurements arrive. The policy gets every
  job's row and the packed fractions per pair of colocation classes explicitly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from common.throughputs import ThroughputTable, format_job_key
from mechanism_service.core.estimates import EstimateBook

# (job type, scale factor, accelerator type) -> isolated steps/s of the gang (raises when unknown)
IsolatedLookup = Callable[[str, int, str], float]
# (lo's type, hi's type, scale factor, accelerator type) -> (lo's, hi's) steps/s when packed
PairLookup = Callable[[str, str, int, str], "tuple[float, float] | None"]


class JobRef(Protocol):
    """What a rate needs to know of a job (NewJob and JobState both are)."""

    job_id: str
    job_type: str
    scale_factor: int


class Rates(Protocol):
    explicit: bool  # the policy's input carries each job's throughputs (else: the policy's table)

    def isolated(self, job: JobRef, accelerator_type: str) -> float:
        """Steps/s of the job's gang alone on the type; 0 where it cannot run (or nothing knows)."""

    def pair(self, lo: JobRef, hi: JobRef, accelerator_type: str) -> tuple[float, float] | None:
        """(lo's, hi's) steps/s packed on the type; None when they may not share GPUs at all."""

    def unknown(self, job: JobRef, types: Sequence[str]) -> str:
        """Why no rate can ever be given for this job on ``types`` ("" when one can)."""


def colocation_class(job: JobRef) -> str:
    """A job's colocation class: its type and gang size, written as the throughput table writes
    its keys (the estimator's classes are the same strings)."""
    return format_job_key(job.job_type, job.scale_factor)


class TableRates:
    explicit = False

    def __init__(self, isolated: IsolatedLookup, pair: PairLookup) -> None:
        self._isolated = isolated
        self._pair = pair

    @classmethod
    def of(cls, table: ThroughputTable) -> TableRates:
        return cls(table.isolated, table.pair)

    def isolated(self, job: JobRef, accelerator_type: str) -> float:
        try:
            return self._isolated(job.job_type, job.scale_factor, accelerator_type)
        except Exception:  # noqa: BLE001 - the table's ProblemError: not measured there
            return 0.0

    def pair(self, lo: JobRef, hi: JobRef, accelerator_type: str) -> tuple[float, float] | None:
        return self._pair(lo.job_type, hi.job_type, lo.scale_factor, accelerator_type)

    def unknown(self, job: JobRef, types: Sequence[str]) -> str:
        """The table's own words for what it does not know, when it knows the job nowhere here."""
        reasons = []
        for w in types:
            try:
                self._isolated(job.job_type, job.scale_factor, w)
            except Exception as e:  # noqa: BLE001 - the table's ProblemError names what it does not know
                reasons.append(str(e))
            else:
                return ""
        if not reasons:
            return ""
        if reasons[0].startswith("unknown job type"):
            return reasons[0]
        return f"the throughput table has no {job.job_type!r} on {job.scale_factor} GPUs"


class EstimatedRates:
    explicit = True

    def __init__(
        self, book: EstimateBook, reference: ThroughputTable | None = None, users: Mapping[str, Mapping[str, float]] | None = None
    ) -> None:
        self.book = book
        self.reference = reference
        self.users = users if users is not None else {}  # job id -> the user's estimate per type
        self._typical: dict[int, dict[str, float]] = {}

    def isolated(self, job: JobRef, accelerator_type: str) -> float:
        row = self.book.rows.get(job.job_id)
        if row is not None and accelerator_type in row:
            return row[accelerator_type]
        user = self.users.get(job.job_id)
        if user is not None and accelerator_type in user:
            return float(user[accelerator_type])
        if self.reference is None:
            return 0.0
        known = self.reference.isolated_steps_per_s.get((job.job_type, job.scale_factor, accelerator_type))
        if known is not None:
            return known
        if self.reference.has_job(job.job_type, job.scale_factor):
            return 0.0  # the reference knows the job, and not there: it cannot run there
        typical = self._typical.get(job.scale_factor)
        if typical is None:
            typical = self._typical[job.scale_factor] = self.reference.typical_isolated(job.scale_factor)
        return typical.get(accelerator_type, 0.0)

    def fraction(self, lo_class: str, hi_class: str, accelerator_type: str, lo: JobRef, hi: JobRef) -> tuple[float, float] | None:
        """The estimator's packed fractions, else the reference table's for two types it knows."""
        estimated = self.book.fraction(lo_class, hi_class, accelerator_type)
        if estimated is not None:
            return estimated
        if self.reference is None:
            return None
        packed = self.reference.pair(lo.job_type, hi.job_type, lo.scale_factor, accelerator_type)
        lo_alone = self.reference.isolated_steps_per_s.get((lo.job_type, lo.scale_factor, accelerator_type), 0.0)
        hi_alone = self.reference.isolated_steps_per_s.get((hi.job_type, hi.scale_factor, accelerator_type), 0.0)
        if packed is None or not (lo_alone > 0 and hi_alone > 0):
            return None
        return min(1.0, packed[0] / lo_alone), min(1.0, packed[1] / hi_alone)

    def pair(self, lo: JobRef, hi: JobRef, accelerator_type: str) -> tuple[float, float] | None:
        if lo.scale_factor != hi.scale_factor:
            return None
        f = self.fraction(self.class_of(lo), self.class_of(hi), accelerator_type, lo, hi)
        if f is None:
            return None
        return self.isolated(lo, accelerator_type) * f[0], self.isolated(hi, accelerator_type) * f[1]

    def class_of(self, job: JobRef) -> str:
        return self.book.classes.get(job.job_id) or colocation_class(job)

    def unknown(self, job: JobRef, types: Sequence[str]) -> str:  # noqa: ARG002 - every job has a prior
        return ""
