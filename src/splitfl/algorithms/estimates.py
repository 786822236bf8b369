"""Numeric helpers shared by the algorithms' control modules (no torch, no algorithm state).

* Per-worker estimates: :func:`moving_average` (MergeSFL Eq. 5–6, ParallelSFL Eq. 6–7),
  :func:`update_table` (one worker's entry of a table of such averages, as AdaSampling,
  PyramidFL and the MergeSFL/AdaSFL state estimator keep them) and :func:`fill_unmeasured`
  (an estimate for the workers never measured).
* Label distributions: :func:`iid_reference` (Φ_0, MergeSFL §IV-A, ParallelSFL Eq. 13) and
  :func:`kl_divergence` (MergeSFL Eq. 12, ParallelSFL Eq. 13).
* :data:`BUDGET_RTOL`: the slack of every "use ≤ budget" check (MergeSFL Eq. 10,
  ParallelSFL Eq. 8 and 10).
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, MutableSequence
from typing import Any

import numpy as np

#: Relative slack used when comparing a bandwidth use with the budget (float round-off only).
BUDGET_RTOL = 1e-9


def moving_average(previous, measured, alpha: float = 0.8):
    """Eq. (5)/(6): ``α·previous + (1−α)·measured``; the first measurement is taken as is.

    Scalars give a float; arrays (e.g. ParallelSFL's pairwise β matrix, Eq. 7) an array.
    """
    if np.ndim(measured) > 0:
        measured = np.asarray(measured, dtype=np.float64)
        return measured.copy() if previous is None else alpha * previous + (1.0 - alpha) * measured
    if previous is None:
        return float(measured)
    return float(alpha * previous + (1.0 - alpha) * measured)


def update_table(
    table: MutableSequence[Any] | MutableMapping[Any, Any], client: Any, measured, alpha: float
):
    """Eq. (5)/(6) for one worker: ``table[client] ← moving_average(table[client], measured,
    alpha)`` (``None`` in the table: never measured). Returns the new estimate."""
    table[client] = moving_average(table[client], measured, alpha)
    return table[client]


def fill_unmeasured(
    values: list[float | None],
    default: float = 1.0,
    summary: Callable[[list[float]], Any] = np.median,
) -> np.ndarray:
    """Estimates with ``None`` (never measured) replaced by ``summary`` (the median unless
    given) of the measured ones, or by ``default`` when nothing has been measured yet."""
    fill = fill_value(values, default, summary)
    return np.array([fill if v is None else v for v in values], dtype=float)


def fill_value(
    values: list[float | None],
    default: float = 1.0,
    summary: Callable[[list[float]], Any] = np.median,
) -> float:
    """What :func:`fill_unmeasured` puts where a value is ``None``."""
    known = [v for v in values if v is not None]
    return float(summary(known)) if known else default


def estimate_of(values: list[float | None], index: int, default: float = 1.0) -> float:
    """``fill_unmeasured(values, default)[index]`` without filling every entry: O(1) for a
    measured one, one scan for a never-measured one (issue 54: a per-client call that
    filled the whole table made a round O(clients x participants))."""
    value = values[index]
    return float(value) if value is not None else fill_value(values, default)


def kl_divergence(p: np.ndarray, q: np.ndarray, eps: float = 1e-12) -> float:
    """Eq. (12): ``Σ_j p_j log(p_j / q_j)``, with ``0·log 0 = 0`` and ``q`` floored at ``eps``."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    mask = p > 0
    return float(np.sum(p[mask] * np.log(p[mask] / np.maximum(q[mask], eps))))


def iid_reference(label_dists: np.ndarray) -> np.ndarray:
    """``Φ_0 = (1/N) Σ_i V_i`` over all N workers (§IV-A)."""
    return np.asarray(label_dists, dtype=np.float64).mean(axis=0)
