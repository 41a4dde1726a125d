"""The estimator's change tracking: the stamps its cached figures are keyed on, what may have moved
since it last spoke, and what it last said (rows.py and fractions.py compute the figures,
estimator.py caches them; this module decides which of them are computed again and which are sent).

- Stamps. ``global_stamp`` grows with whatever moves every figure (a straggler flagged, a
  calibration applied, the completion refitted); ``pair_versions`` with each packed measurement
  of a pair of classes; a class's own stamp (view.ClassEvidence.stamp) with its evidence. A cached
  figure is computed again once a stamp it was computed under has grown.
- What is dirty: the jobs whose rows, the class pairs whose fractions and the classes whose
  profiling requests may have moved since the last message (``moved`` and ``moved_belief`` say
  when a pooled figure moved enough to mark the figures read from it), and the straggler flags
  not yet sent. Only those are computed again for the next message.
- What was published: the last row, pair and profiling request sent for each. A row or a pair
  computed again is sent only when it says something the published one does not
  (publishing.differs), a request only when it changed; ``revision`` counts the messages.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from common.messages import ColocationEstimate, JobThroughput, ProfilingRequest, StragglerFlag, ThroughputEstimated
from estimator_service.core.beliefs import Belief, Source
from estimator_service.core.publishing import differs

Pair = tuple[str, str]  # two class names, in order

# Below this (relative) a class's pooled mean has not moved for its other jobs' figures: far under
# the publish tolerance, so skipping their recomputation changes nothing published.
STAMP_TOLERANCE = 1e-3

# An estimator pickled before this module held these fields itself: name there -> name here.
_ESTIMATOR_FIELDS = {
    "_global": "global_stamp",
    "_pair_versions": "pair_versions",
    "_dirty_rows": "dirty_rows",
    "_dirty_pairs": "dirty_pairs",
    "_dirty_profiling": "dirty_profiling",
    "_new_flags": "new_flags",
    "_published_rows": "published_rows",
    "_published_pairs": "published_pairs",
    "_published_profiling": "published_profiling",
    "revision": "revision",
}


class Changes:
    def __init__(self) -> None:
        self.global_stamp = 0  # grows with straggler flags, calibrations, refits: every cached figure depends on them
        self.pair_versions: dict[Pair, int] = {}  # grows with each packed measurement of the pair
        self.dirty_rows: set[str] = set()  # job ids
        self.dirty_pairs: set[Pair] = set()
        self.dirty_profiling: set[str] = set()  # class names
        self.new_flags: list[StragglerFlag] = []
        self.published_rows: dict[str, JobThroughput] = {}
        self.published_pairs: dict[Pair, ColocationEstimate] = {}
        self.published_profiling: dict[str, ProfilingRequest] = {}  # by job id
        self.revision = 0

    @staticmethod
    def taken_from(state: dict[str, object]) -> Changes:
        """The change tracking of an estimator pickled before this module, its fields taken out of
        the estimator's ``state`` (a field it lacks keeps its initial value)."""
        changes = Changes()
        for old, new in _ESTIMATOR_FIELDS.items():
            if old in state:
                setattr(changes, new, state.pop(old))
        return changes

    # -- marks ----------------------------------------------------------------------------------------

    def packed_measured(self, pair: Pair) -> None:
        """A packed measurement of the pair: its fractions' caches are stale, its estimate dirty."""
        self.pair_versions[pair] = self.pair_versions.get(pair, 0) + 1
        self.dirty_pairs.add(pair)

    def job_ended(self, job_id: str) -> None:
        """Its row and its profiling request are forgotten (another job of its id starts afresh)."""
        self.published_rows.pop(job_id, None)
        self.published_profiling.pop(job_id, None)

    def class_ended(self, name: str) -> None:
        """The class's last active job ended: the pairs it is part of are forgotten."""
        for pair in [p for p in self.published_pairs if name in p]:
            del self.published_pairs[pair]

    def forget_published(self) -> None:
        """Nothing counts as said: the next message says everything marked dirty."""
        self.published_rows.clear()
        self.published_pairs.clear()
        self.published_profiling.clear()

    # -- what to send ---------------------------------------------------------------------------------

    def rows_to_send(
        self,
        message_of: Callable[[str], JobThroughput | None],
        order: Callable[[str], int],
        tolerance: float,
        sds: float,
    ) -> tuple[JobThroughput, ...]:
        """Each dirty row in ``order`` (None from ``message_of``: not to be sent), kept when it
        differs from the one published; then nothing is dirty."""
        out = []
        for job_id in sorted(self.dirty_rows, key=order):
            message = message_of(job_id)
            if message is not None and differs(self.published_rows.get(job_id), message, tolerance, sds):
                self.published_rows[job_id] = message
                out.append(message)
        self.dirty_rows.clear()
        return tuple(out)

    def pairs_to_send(
        self, message_of: Callable[[Pair], ColocationEstimate | None], tolerance: float, sds: float
    ) -> tuple[ColocationEstimate, ...]:
        """Each dirty pair in order, as ``rows_to_send``."""
        out = []
        for pair in sorted(self.dirty_pairs):
            message = message_of(pair)
            if message is not None and differs(self.published_pairs.get(pair), message, tolerance, sds):
                self.published_pairs[pair] = message
                out.append(message)
        self.dirty_pairs.clear()
        return tuple(out)

    def requests_to_send(self, requests_of: Callable[[str], Iterable[ProfilingRequest]]) -> tuple[ProfilingRequest, ...]:
        """Each dirty class's requests, one per active job (in order), kept when it changed; an
        empty request for a job never asked anything is not sent."""
        out = []
        for name in sorted(self.dirty_profiling):
            for request in requests_of(name):
                before = self.published_profiling.get(request.job_id)
                if before is None and not request.cells:
                    continue
                if before != request:
                    self.published_profiling[request.job_id] = request
                    out.append(request)
        self.dirty_profiling.clear()
        return tuple(out)

    def message(
        self,
        rows: tuple[JobThroughput, ...],
        pairs: tuple[ColocationEstimate, ...],
        profiling: tuple[ProfilingRequest, ...],
        *,
        always: bool,
        profiling_share: float,
    ) -> ThroughputEstimated | None:
        """What changed with the new straggler flags, as the next revision (None: nothing to say,
        unless ``always``)."""
        flags, self.new_flags = tuple(self.new_flags), []
        if not (rows or pairs or profiling or flags or always):
            return None
        self.revision += 1
        return ThroughputEstimated(
            jobs=rows, colocations=pairs, profiling=profiling, stragglers=flags, revision=self.revision,
            mode="learned", profiling_share=profiling_share,
        )


def moved_belief(before: Belief, after: Belief | None) -> bool:
    """A job's own figure moved by more than STAMP_TOLERANCE (or to or from zero, or went)."""
    if after is None or (before.value <= 0) != (after.value <= 0):
        return True
    return before.value > 0 and abs(math.log(after.value / before.value)) > STAMP_TOLERANCE


def moved(before: Source | None, after: Source | None, tolerance: float) -> bool:
    """A pooled figure moved by more than ``tolerance`` (relative), to or from zero, or appeared
    or went."""
    if (before is None) != (after is None):
        return True
    if before is None or after is None:
        return False
    if (before.value <= 0) != (after.value <= 0):
        return True
    return before.value > 0 and abs(math.log(after.value / before.value)) > tolerance
