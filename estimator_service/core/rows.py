"""A job's row: its steps/s alone on each accelerator type published, as a belief.

Per type it combines (beliefs.combine, in log space, weighted by precision):

- its own measurements on the type (a flagged straggler's only where no healthy worker measured it);
- the other jobs of its colocation class, pooled (pools.py), give or take the spread between jobs;
- the reference table's figure calibrated, for a class the reference set knows (priors.reference);
- the user's estimate at submission;
- for a class it does not know: its speed implied by its packed runs there
  (priors.implied_by_packing), and where nothing measured it on the type but something did on
  others, the matched reference's ratio between the types (priors.matched_ratio);
- when nothing at all is known of it there, the typical reference job of its size (priors.typical).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from common.messages import Provenance
from estimator_service.core import priors
from estimator_service.core.beliefs import MEASUREMENTS, Belief, Source, combine
from estimator_service.core.evidence import JobEvidence
from estimator_service.core.view import EvidenceView, Row

# (class, scale factor) -> (K,) the speeds alone of its matched reference (priors.matched), or None
Match = Callable[[str, int], np.ndarray | None]


def row(view: EvidenceView, job: JobEvidence, match: Match, fraction_prior: priors.FractionPrior) -> Row:
    """The job's beliefs per published type (module docstring); a type nothing says anything of
    would read the typical job, so every type has one."""
    s = view.settings
    located = view.references.locate(job.colocation_class)
    spread = s.job_spread_sd**2
    direct: dict[str, list[Source]] = {}
    for w in view.types_out:
        sources = list(job.alone_sources(w, s.measurement_sd, view.slow))
        pooled = view.pooled(job.colocation_class, w, without=job.job_id)
        if pooled is not None:
            sources.append(Source(pooled.value, pooled.variance + spread, pooled.provenance, pooled.count))
        if located is not None:
            reference = priors.reference(view, located, job.colocation_class, w)
            if reference is not None:
                sources.append(reference)
        if w in job.user:
            sources.append(Source(job.user[w], s.user_sd**2, Provenance.USER))
        if located is None:
            sources += priors.implied_by_packing(view, job, w, fraction_prior)
        direct[w] = sources
    beliefs = {w: combine(sources) for w, sources in direct.items()}
    measured = {
        w: b for w, b in beliefs.items()
        if b is not None and b.value > 0 and b.provenance in MEASUREMENTS
    }
    matched = None if located is not None else match(job.colocation_class, job.scale_factor)
    out: Row = {}
    for w in view.types_out:
        sources = direct[w]
        if matched is not None and measured and w not in measured:
            ratio = priors.matched_ratio(view, matched, measured, view.types.index(w))
            if ratio is not None:
                sources = [*sources, ratio]
        if not sources:  # nothing at all is known: the typical job of its size
            sources = [priors.typical(view, job.scale_factor, w)]
        belief = combine(sources)
        out[w] = belief if belief is not None else Belief(0.0, 0.0, Provenance.REFERENCE)
    return out
