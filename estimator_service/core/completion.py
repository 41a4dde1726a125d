"""Low-rank matrix completion by alternating ridge least squares, in numpy.

    complete(values, observed, settings) -> completed values

Each column is centred on the mean of its observed entries (the "typical" row), and the
residuals are fitted by a rank-r product U V^T with ridge regularisation lambda:

    minimise  sum over observed (i, c) of (x_ic - mu_c - u_i . v_c)^2 + lambda (|U|^2 + |V|^2)

alternating between U (each row a ridge regression on the columns it observes) and V (each column
one on the rows that observe it), from a seeded start, so the same input always completes the same
way. Rows with nothing observed complete to the column means. Every row and column is solved at
once as a batch of r x r systems (no Python loop over rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class CompletionSettings:
    rank: int = 5
    regularisation: float = 0.1
    iterations: int = 60
    tolerance: float = 1e-4  # stop when no fitted value (a fraction in [0, 1]) moves more than this
    seed: int = 0


def complete(values: np.ndarray, observed: np.ndarray, settings: CompletionSettings = CompletionSettings()) -> np.ndarray:
    """``values`` (n, C), read only where ``observed`` (n, C) is True; returns (n, C) with every
    entry filled (observed ones refitted too: callers keep their measurements themselves)."""
    values = np.asarray(values, dtype=float)
    mask = np.asarray(observed, dtype=bool) & np.isfinite(values)
    n, num_columns = values.shape
    weight = mask.astype(float)
    counts = weight.sum(axis=0)
    overall = float(values[mask].mean()) if mask.any() else 0.0
    means = np.where(counts > 0, np.where(mask, values, 0.0).sum(axis=0) / np.maximum(counts, 1), overall)
    residual = np.where(mask, values - means, 0.0)
    rank = max(1, min(settings.rank, n, num_columns))
    rng = np.random.default_rng(settings.seed)
    u = rng.normal(scale=0.1, size=(n, rank))
    v = rng.normal(scale=0.1, size=(num_columns, rank))
    ridge = settings.regularisation * np.eye(rank)
    fitted = u @ v.T
    for _ in range(settings.iterations):
        u = _ridge_rows(weight, residual, v, ridge)
        v = _ridge_rows(weight.T, residual.T, u, ridge)
        refitted = u @ v.T
        moved = float(np.abs(refitted - fitted).max()) if refitted.size else 0.0
        fitted = refitted
        if moved < settings.tolerance:
            break
    return means + fitted


def _ridge_rows(weight: np.ndarray, residual: np.ndarray, factors: np.ndarray, ridge: np.ndarray) -> np.ndarray:
    """For every row i: argmin_x sum_c w_ic (r_ic - x . f_c)^2 + x^T ridge x, as one batch."""
    rank = factors.shape[1]
    outer = (factors[:, :, None] * factors[:, None, :]).reshape(len(factors), rank * rank)
    gram = (weight @ outer).reshape(-1, rank, rank) + ridge  # a matrix product, not an einsum loop
    rhs = (weight * residual) @ factors
    return np.linalg.solve(gram, rhs[..., None])[..., 0]
