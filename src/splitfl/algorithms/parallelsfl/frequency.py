"""ParallelSFL §4.4-4.5: local updating frequencies τ_c (Eq. 15-17), the round's cluster
waiting (Eq. 15-16) and the aggregation weights (Eq. 18).

Reading of Eq. (17) (``⌈·⌉ = 1``; see ``reference/spec-gaps.md``): every cluster except the
fastest gets the largest integer ``1 ≤ τ_c ≤ τ`` whose round time ``τ_c·t_c,o + β_c`` does not
exceed the fastest cluster's. No torch here: every function takes numpy arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from splitfl.algorithms.parallelsfl.problem import Cluster


def local_frequencies(
    clusters: Sequence[Cluster] | None,
    t_co: np.ndarray,
    beta_c: np.ndarray,
    tau: int,
) -> np.ndarray:
    """Eq. (15)-(17): local updating frequency τ_c of every cluster.

    Round time Eq. (15) ``t_c = τ_c·t_c,o + β_c`` (``β_c``: the top worker's upload of the
    submodels to the PS). The fastest cluster ``l = argmin_c (τ·t_c,o + β_c)`` gets ``τ``; every
    other cluster gets the largest integer ``τ_c ∈ [1, τ]`` with
    ``τ_c·t_c,o + β_c ≤ τ·t_l,o + β_l`` (the reading of Eq. 17's ``⌈·⌉ = 1``), i.e.
    ``⌊(t_l − β_c)/t_c,o⌋`` clipped to [1, τ] (a relative 1e-9 guard keeps exact quotients
    from being floored down by float error). A cluster so slow that even τ_c = 1 overshoots
    gets 1. Top-only clusters (no bottom workers in ``clusters``) get 0 and are ignored when
    choosing l; ``clusters=None`` treats every cluster as active. Returns int64.
    """
    t_co = np.asarray(t_co, dtype=np.float64).reshape(-1)
    beta_c = np.asarray(beta_c, dtype=np.float64).reshape(-1)
    if t_co.shape != beta_c.shape:
        raise ValueError("t_co and beta_c need one entry per cluster")
    if clusters is None:
        active = np.ones(t_co.size, dtype=bool)
    else:
        if len(clusters) != t_co.size:
            raise ValueError("t_co needs one entry per cluster")
        active = np.array([len(m) > 0 for _, m in clusters], dtype=bool)
    taus = np.zeros(t_co.size, dtype=np.int64)
    if not active.any():
        return taus
    if np.any(t_co[active] <= 0):
        raise ValueError("every active cluster needs a positive iteration time t_c,o")
    at_tau = tau * t_co + beta_c
    l_idx = int(np.flatnonzero(active)[np.argmin(at_tau[active])])
    target = at_tau[l_idx]
    ideal = (target - beta_c[active]) / t_co[active]
    taus[active] = np.clip(np.floor(ideal * (1.0 + 1e-9)), 1, tau).astype(np.int64)
    taus[l_idx] = tau
    return taus


def aggregation_weights(
    sizes: Sequence[int] | np.ndarray, taus: Sequence[int] | np.ndarray
) -> np.ndarray:
    """Eq. (18): weight of cluster c = ``N_c·τ_c / Σ_c' N_c'·τ_c'``.

    Top-only clusters (N_c = 0) or τ_c = 0 get weight 0. Raises ``ValueError`` if every
    product is 0 (no cluster trained).
    """
    prod = np.asarray(sizes, dtype=np.float64) * np.asarray(taus, dtype=np.float64)
    total = prod.sum()
    if total <= 0:
        raise ValueError("Σ N_c·τ_c is zero: no cluster trained, Eq. (18) is undefined")
    return prod / total


def round_waiting(t_c: np.ndarray, active: np.ndarray) -> dict[str, Any]:
    """Eq. (15)-(16): the round time ``t = max_c t_c`` and the clusters' average waiting
    ``W = (1/C) Σ_c (t − t_c)`` over the ``active`` (training) clusters (0 if none)."""
    t_c = np.asarray(t_c, dtype=np.float64)
    live = t_c[np.asarray(active, dtype=bool)]
    t = float(live.max()) if live.size else 0.0
    return {
        "round_time": t,
        "cluster_times": t_c.tolist(),
        "cluster_waiting": float((t - live).mean()) if live.size else 0.0,
    }
