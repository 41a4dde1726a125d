"""The joint fit of calibration.py: log ratios to the table over observed (class, type) cells,

    r_jk = a_k + b_j + noise,

a (the types' hardware) shrunk towards 0, b (the classes' levels) free, by ridge least squares: one
small linear solve over K + J + 1 parameters, whatever the number of cells. Pure numpy: values in,
the shifts to apply out. calibration.py says what the fit is for and how its results are applied.
"""

from __future__ import annotations

import numpy as np

SPREAD_CLASSES = 3  # classes needed before the spread of b is measured rather than assumed
MAD_TO_SD = 1.4826  # a normal distribution's sd over its median absolute deviation
# Prior sds of the fit (log). A type's hardware against the table's ratios between types: a factor
# of e either way before a class links it to another type. A class's level and the common level:
# free (100), so what a type's own classes measured is theirs, not the type's.
HARDWARE_SD = 1.0
CLASS_SD = 100.0
# A cell's noise (the median of a class's ratios on a type: lease-to-lease noise, jobs of the class,
# how far the class is from the model) until the residuals measure it, worth this many cells.
CELL_SD = 0.1
CELL_SD_CELLS = 2.0


def fit_cells(
    class_index: np.ndarray,
    type_index: np.ndarray,
    log_ratio: np.ndarray,
    num_classes: int,
    num_types: int,
    tolerance: float,
    assumed_sd: float,
) -> dict[str, np.ndarray] | None:
    """r = a[type] + b[class] + noise over the observed cells (each (class, type) at most once),
    a shrunk towards 0, b free (module docstring); the shifts applied, as Fit's arrays, or None when
    every cell is the table's within the tolerance (then the table stands everywhere as it is).

    class_index, type_index, log_ratio: (n,) the cells. Returns reference_log/var (J, K),
    typical_log/var (K,), between_log/var (K, K) [to, from], hardware (K,) a, levels (J,) b."""
    j, k, r = class_index, type_index, log_ratio
    n, big_j, big_k = r.size, num_classes, num_types
    p = big_k + big_j + 1  # parameters: a (K), d (J), beta; b = beta + d
    a_, d_, beta_ = slice(0, big_k), slice(big_k, big_k + big_j), big_k + big_j
    per_type = np.bincount(k, minlength=big_k).astype(float)
    per_class = np.bincount(j, minlength=big_j).astype(float)
    gram = np.zeros((p, p))  # X'X of the design (one-hot a, one-hot d, 1)
    gram[np.arange(big_k), np.arange(big_k)] = per_type
    gram[big_k + np.arange(big_j), big_k + np.arange(big_j)] = per_class
    gram[k, big_k + j] = gram[big_k + j, k] = 1.0
    gram[a_, beta_] = gram[beta_, a_] = per_type
    gram[d_, beta_] = gram[beta_, d_] = per_class
    gram[beta_, beta_] = n
    moments = np.concatenate([np.bincount(k, r, big_k), np.bincount(j, r, big_j), [r.sum()]])
    prior_precision = np.concatenate([np.full(big_k, HARDWARE_SD**-2), np.full(big_j + 1, CLASS_SD**-2)])
    # the estimate: ridge with the prior at the assumed noise (so it is linear in r)
    solve = np.linalg.inv(gram + CELL_SD**2 * np.diag(prior_precision))
    theta = solve @ moments
    a, levels = theta[a_], theta[beta_] + theta[d_]
    residual = r - a[k] - levels[j]
    used = float(np.sum(solve * gram))  # the parameters the cells pin: trace(solve X'X)
    noise_var = (CELL_SD_CELLS * CELL_SD**2 + float(residual @ residual)) / (CELL_SD_CELLS + max(n - used, 0.0))
    sampling = noise_var * solve @ gram @ solve  # how far the estimate moves with the cells' noise

    value = _combinations(theta, big_j, big_k)
    standard_error = tuple(np.sqrt(np.maximum(v, 0.0)) for v in _variances(sampling, big_j, big_k))
    stands = tuple(np.abs(v) <= tolerance + 2.0 * se for v, se in zip(value, standard_error, strict=True))
    if stands[0][j, k].all():
        return None  # every cell measured is the table's as far as its noise tells: so is this cluster
    # this cluster is not the table's: each figure's shift unless within the tolerance, and its whole
    # uncertainty (a type no class links is a guess)
    posterior = np.linalg.inv(gram / noise_var + np.diag(prior_precision))  # how far the truth may be
    if big_j >= SPREAD_CLASSES:
        spread_sd = MAD_TO_SD * float(np.median(np.abs(levels - np.median(levels))))
    else:
        spread_sd = assumed_sd
    reference_var, typical_var, between_var = _variances(posterior, big_j, big_k)
    reference_log, typical_log, between_log = (np.where(s, 0.0, v) for s, v in zip(stands, value, strict=True))
    reference_var, typical_var, between_var = reference_var + noise_var, typical_var + spread_sd**2, between_var + noise_var
    # on a type it was measured on, a class's own measurements say the rest: the typical shift
    measured = np.zeros((big_j, big_k), dtype=bool)
    measured[j, k] = True
    return {
        "reference_log": np.where(measured, typical_log, reference_log),
        "reference_var": np.where(measured, typical_var, reference_var),
        "typical_log": typical_log, "typical_var": typical_var,
        "between_log": between_log, "between_var": between_var,
        "hardware": a, "levels": levels,
    }


def _combinations(theta: np.ndarray, big_j: int, big_k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The figures' shifts from theta = (a (K), d (J), beta): a_k + b_j (J, K), a_k + mean b (K,),
    a_to - a_from (K, K)."""
    a, d, beta = theta[:big_k], theta[big_k : big_k + big_j], theta[big_k + big_j]
    return (a[None, :] + beta + d[:, None], a + beta + d.mean(), a[:, None] - a[None, :])


def _variances(cov: np.ndarray, big_j: int, big_k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The variances of _combinations' figures under the covariance ``cov`` (p, p) of theta."""
    a_, d_, beta_ = slice(0, big_k), slice(big_k, big_k + big_j), big_k + big_j
    aa, dd, ad = cov[a_, a_], cov[d_, d_], cov[a_, d_]
    a_diag, d_diag, a_beta, d_beta, bb = np.diag(aa), np.diag(dd), cov[a_, beta_], cov[d_, beta_], cov[beta_, beta_]
    reference = a_diag[None, :] + d_diag[:, None] + bb + 2 * ad.T + 2 * a_beta[None, :] + 2 * d_beta[:, None]
    typical = a_diag + bb + dd.sum() / big_j**2 + 2 * a_beta + 2 * ad.sum(axis=1) / big_j + 2 * d_beta.sum() / big_j
    between = a_diag[:, None] + a_diag[None, :] - 2 * aa
    return reference, typical, between
