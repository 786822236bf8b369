"""MergeSFL §IV-A batch sizes and times (Alg. 1 lines 1-2 and 7; Eq. 7-9, Eq. 10's budget).

Readings of the paper where it is silent or ambiguous (see ``reference/spec-gaps.md``):

* Eq. (9) as printed, ``d_i = d_l·⌊(μ_l+β_l)/(μ_i+β_i)⌋``, floors a ratio ≤ 1 and gives 0 to
  every worker slower than l; it is read as ``d_i = ⌊D·(μ_l+β_l)/(μ_i+β_i)⌋``, and workers
  whose d_i is 0 cannot keep pace with l even at one sample, so they are not selectable this
  round (flooring them at 1 made stragglers the KL-only GA happily picked).
* Line 7 scales all sizes by one common factor, capped so the largest reaches D (capping each
  size at D separately breaks the proportionality of Eq. 9), and rounds each scaled size to
  the nearest integer once: the sizes it scales are the un-floored Eq. 9 ratios
  (:func:`aligned_batch_sizes`, after line 6), so flooring in Eq. 9 and again after scaling
  cannot compound. A worker whose scaled size falls below one sample is dropped from S^h
  (size 0), as Eq. 9's reading drops a worker whose aligned size is below one: giving it one
  sample anyway made it a straggler of up to 1/(scaled size) of its aligned time.

No torch here: every function takes numpy arrays.
"""

from __future__ import annotations

import numpy as np

from splitfl.algorithms.estimates import BUDGET_RTOL


def aligned_batch_sizes(mu: np.ndarray, beta: np.ndarray, max_batch: int) -> np.ndarray:
    """Eq. (9) before flooring: ``D·(μ_l+β_l)/(μ_i+β_i)``, the (real) batch size that gives
    worker i the iteration time of the fastest worker l at ``D = max_batch`` (Eq. 7)."""
    per_sample = np.asarray(mu, dtype=np.float64) + np.asarray(beta, dtype=np.float64)
    if per_sample.size == 0:
        return np.zeros(0, dtype=np.float64)
    if np.any(per_sample <= 0):
        raise ValueError("μ_i + β_i must be positive for every worker")
    return max_batch * per_sample.min() / per_sample


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
    ideal = aligned_batch_sizes(mu, beta, max_batch)
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
    """``round(factor·d_i)`` (halves up), 0 where ``factor·d_i < 1``, at most ``cap``; a
    relative 1e-9 guard keeps exact products (e.g. 1.5·1 or 0.5·2) from float error."""
    x = batch * factor * (1.0 + 1e-9)
    out = np.where(x >= 1.0, np.floor(x + 0.5), 0.0)
    if cap is not None:
        out = np.minimum(out, cap)
    return out.astype(np.int64)


def scale_to_budget(
    batch: np.ndarray, bytes_per_sample: float, budget: float, max_batch: int | None = None
) -> np.ndarray:
    """Line 7 of Alg. 1: one common factor s for all, ``d_i' = round(s·d_i)``, 0 below one.

    s is the largest factor whose integer sizes still satisfy Eq. (10), ``Σ d_i'·c ≤ B``, found
    by bisection on s (the use is a non-decreasing step function of s). With ``max_batch`` = D,
    s is capped at ``D / max_i d_i`` so the largest batch reaches at most D and the sizes stay
    proportional ("scale up or down proportionally"); capping each size at D separately
    would flatten the ratios that align the workers' iteration times (Eq. 9).

    Each size is rounded to the nearest integer, so ``|d_i' − s·d_i| ≤ 1/2`` and, for the kept
    workers (``s·d_i ≥ 1``), ``d_i' / (s·d_i)`` lies in ``(2/3, 4/3]``: the iteration times
    ``d_i'·(μ_i+β_i)`` (Eq. 7) stay within a factor < 2 of proportional to ``d_i·(μ_i+β_i)``,
    and closer as the sizes grow. A worker with ``s·d_i < 1`` gets 0 (drop it from S^h, see
    the module docstring). Raises ``ValueError`` if no worker fits the budget at one sample.
    """
    d = np.asarray(batch, dtype=np.float64)
    if d.size == 0:
        return np.zeros(0, dtype=np.int64)
    if np.any(d <= 0):
        raise ValueError("batch sizes must be positive to be scaled")
    limit = budget * (1.0 + BUDGET_RTOL)

    def used(factor: float) -> float:
        return float(_scaled(d, factor, max_batch).sum() * bytes_per_sample)

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
    out = _scaled(d, lo, max_batch)
    if not out.any():
        raise ValueError(f"no worker fits the budget {budget} at one sample")
    return out
