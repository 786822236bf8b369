"""MergeSFL §IV-A batch sizes and times (Alg. 1 lines 1-2 and 7; Eq. 7-9, Eq. 10's budget).

Readings of the paper where it is silent or ambiguous (see ``reference/spec-gaps.md``):

* Eq. (9) as printed, ``d_i = d_l·⌊(μ_l+β_l)/(μ_i+β_i)⌋``, floors a ratio ≤ 1 and gives 0 to
  every worker slower than l; it is read as ``d_i = ⌊D·(μ_l+β_l)/(μ_i+β_i)⌋``, and workers
  whose d_i is 0 cannot keep pace with l even at one sample, so they are not selectable this
  round (flooring them at 1 made stragglers the KL-only GA happily picked).
* Line 7 scales all sizes by one common factor, capped so the largest reaches D (capping each
  size at D separately breaks the proportionality of Eq. 9).

No torch here: every function takes numpy arrays.
"""

from __future__ import annotations

import numpy as np

from splitfl.algorithms.estimates import BUDGET_RTOL


def regulate_batch_sizes(
    mu: np.ndarray, beta: np.ndarray, max_batch: int, min_batch: int = 1
) -> np.ndarray:
    """Eq. (9), lines 1-2 of Alg. 1: ``d_i = max(min_batch, ⌊D·(μ_l+β_l)/(μ_i+β_i)⌋)``.

    ``l = argmin(μ+β)`` is the fastest worker and gets ``D = max_batch``. The printed Eq. (9)
    floors the ratio before multiplying by ``d_l`` (which would give 0 to every slower worker),
    so the product is floored instead. ``min_batch = 0`` keeps the 0 of workers that cannot
    keep pace with l even at one sample (MergeSFL excludes them, :func:`arrange_workers`);
    ``min_batch = 1`` gives them one sample (AdaSFL, which shortens their τ instead). A relative
    1e-9 guard keeps exact quotients (e.g. 64·0.5/1) from rounding down by float error.
    """
    per_sample = np.asarray(mu, dtype=np.float64) + np.asarray(beta, dtype=np.float64)
    if per_sample.size == 0:
        return np.zeros(0, dtype=np.int64)
    if np.any(per_sample <= 0):
        raise ValueError("μ_i + β_i must be positive for every worker")
    ideal = max_batch * per_sample.min() / per_sample
    batch = np.floor(ideal * (1.0 + 1e-9)).astype(np.int64)
    return np.clip(batch, min_batch, max_batch)


def iteration_times(
    batch: np.ndarray, mu: np.ndarray, beta: np.ndarray, tau: int = 1
) -> np.ndarray:
    """Eq. (7): ``t_i = τ·d_i·(μ_i+β_i)``."""
    return tau * np.asarray(batch, dtype=np.float64) * (np.asarray(mu) + np.asarray(beta))


def average_waiting_time(times: np.ndarray) -> float:
    """Eq. (8): mean over workers of ``max_j t_j − t_i`` (0 for no workers)."""
    times = np.asarray(times, dtype=np.float64)
    if times.size == 0:
        return 0.0
    return float(np.mean(times.max() - times))


# ------------------------------------------------------------------------------ budget scaling


def _scaled(batch: np.ndarray, factor: float, cap: int | None) -> np.ndarray:
    out = np.maximum(np.floor(batch * factor * (1.0 + 1e-9)), 1.0)
    if cap is not None:
        out = np.minimum(out, cap)
    return out.astype(np.int64)


def scale_to_budget(
    batch: np.ndarray, bytes_per_sample: float, budget: float, max_batch: int | None = None
) -> np.ndarray:
    """Line 7 of Alg. 1: one common factor s for all, ``d_i' = max(1, ⌊s·d_i⌋)``.

    s is the largest factor whose integer sizes still satisfy Eq. (10), ``Σ d_i'·c ≤ B``, found
    by bisection on s (the use is a non-decreasing step function of s). With ``max_batch`` = D,
    s is capped at ``D / max_i d_i`` so the largest batch reaches at most D and the sizes stay
    proportional ("scale up or down proportionally"); capping each size at D separately
    would flatten the ratios that align the workers' iteration times (Eq. 9). Flooring after
    scaling loses less than one sample per worker, so below the cap the unused budget is below
    ``c·(number of workers whose size steps up at the next breakpoint)``. Raises
    ``ValueError`` if even one sample per worker exceeds the budget. Integers ≥ 1 are returned.
    """
    d = np.asarray(batch, dtype=np.float64)
    if d.size == 0:
        return np.zeros(0, dtype=np.int64)
    if np.any(d <= 0):
        raise ValueError("batch sizes must be positive to be scaled")
    limit = budget * (1.0 + BUDGET_RTOL)

    def used(factor: float) -> float:
        return float(_scaled(d, factor, max_batch).sum() * bytes_per_sample)

    if d.size * bytes_per_sample > limit:
        raise ValueError(f"{d.size} workers at one sample each exceed the budget {budget}")
    if max_batch is None:
        hi = (budget / bytes_per_sample + 2.0) / d.min()
    else:
        hi = max_batch / d.max()
    if used(hi) <= limit:  # the cap (largest batch = D) binds before the budget
        return _scaled(d, hi, max_batch)
    lo = 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if used(mid) <= limit:
            lo = mid
        else:
            hi = mid
    return _scaled(d, lo, max_batch)
