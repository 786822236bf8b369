"""MergeSFL §IV-A batch-size fine-tuning (Alg. 1 line 6; Eq. 14): the smallest added waiting
time Δ subject to KL(Φ_h ‖ Φ_0) ≤ ε.

Line 6 ("a Lagrange dual problem") is solved numerically with SLSQP on the equivalent primal
problem; the |Δd_i| of Eq. (14) is linearised with d = d⁰ + u − v, u, v ≥ 0; ε is an argument
(see ``reference/spec-gaps.md``). No torch here: every function takes numpy arrays.
"""

from __future__ import annotations

import numpy as np


def load_solver() -> None:
    """Import SciPy's optimiser now. Call it before a run limits the BLAS threads
    (``experiment/loop.py``): threadpoolctl limits only libraries already loaded, and SLSQP on
    a BLAS loaded inside the limits runs with its default threads and moves in the last bits
    (it is imported lazily so that ``splitfl list`` and ``validate`` do not pay for it)."""
    import scipy.optimize  # noqa: F401


#: Absolute slack on ``KL ≤ ε`` when judging a numerical solution of line 6 feasible.
KL_ATOL = 1e-9


def waiting_increase(
    batch: np.ndarray, batch0: np.ndarray, mu: np.ndarray, beta: np.ndarray
) -> float:
    """Eq. (14): ``Δ = (1/R) Σ_i |d_i − d_i⁰|·(μ_i+β_i)`` over the R selected workers."""
    d = np.asarray(batch, dtype=np.float64)
    if d.size == 0:
        return 0.0
    diff = np.abs(d - np.asarray(batch0, dtype=np.float64))
    return float(np.mean(diff * (np.asarray(mu) + np.asarray(beta))))


def _kl_and_grad(d: np.ndarray, dists: np.ndarray, phi0: np.ndarray) -> tuple[float, np.ndarray]:
    """``KL(Φ(d) ‖ Φ_0)`` and its gradient in ``d`` (Φ(d) = d·V / Σd, all rows selected)."""
    total = d.sum()
    phi = d @ dists / total
    log_ratio = np.log(np.maximum(phi, 1e-300) / np.maximum(phi0, 1e-12))
    kl = float(np.sum(np.where(phi > 0, phi * log_ratio, 0.0)))
    # ∂Φ_j/∂d_i = (V_ij − Φ_j)/Σd and Σ_j (V_ij − Φ_j) = 0, so the "+1" of ∂(Φ log Φ) cancels.
    grad = (dists - phi) @ np.where(phi > 0, log_ratio, 0.0) / total
    return kl, grad


def finetune_batch_sizes(
    batch_sel: np.ndarray,
    mu_sel: np.ndarray,
    beta_sel: np.ndarray,
    label_dists_sel: np.ndarray,
    phi0: np.ndarray,
    epsilon: float,
    max_batch: int,
) -> np.ndarray:
    """Line 6 of Alg. 1: minimise Δ (Eq. 14) subject to ``KL(Φ_h ‖ Φ_0) ≤ ε``, 1 ≤ d_i ≤ D.

    All arguments are already restricted to the selected set S (R workers); ``batch_sel`` is
    d⁰ (the Eq. 9 sizes, each in [1, max_batch]). The paper solves this as a Lagrange dual
    problem; here the primal is solved numerically with SLSQP. Writing ``d = d⁰ + u − v`` with
    ``0 ≤ u ≤ D − d⁰`` and ``0 ≤ v ≤ d⁰ − 1`` makes the objective linear,
    ``Σ (u_i + v_i)·(μ_i+β_i)`` (scaled by a constant, which does not move the optimum).

    Procedure: if ``KL(d⁰) ≤ ε`` return d⁰. Otherwise first minimise KL alone within the bounds
    (SLSQP from d⁰). If even that minimum exceeds ε, the target is unreachable: return the
    lower-KL one of that minimiser and d⁰. Else solve the Δ problem from two starts (u = v = 0,
    and the KL minimiser) and return, among all candidates whose KL ≤ ε (up to ``KL_ATOL``),
    the one with the least Δ — the KL minimiser itself is always such a candidate. The result
    is never worse in KL than d⁰ and stays within the bounds. Values are floats; rounding to
    integers happens in :func:`scale_to_budget`.
    """
    d0 = np.asarray(batch_sel, dtype=np.float64)
    r = np.asarray(mu_sel, dtype=np.float64) + np.asarray(beta_sel, dtype=np.float64)
    dists = np.asarray(label_dists_sel, dtype=np.float64)
    phi0 = np.asarray(phi0, dtype=np.float64)
    size = d0.size
    if size == 0:
        return d0.copy()
    if np.any(d0 < 1) or np.any(d0 > max_batch):
        raise ValueError("initial batch sizes must lie in [1, max_batch]")
    kl0, _ = _kl_and_grad(d0, dists, phi0)
    if kl0 <= epsilon:
        return d0.copy()

    from scipy.optimize import minimize  # here: importing it takes ~0.5 s

    bounds_d = [(1.0, float(max_batch))] * size
    res = minimize(
        lambda x: _kl_and_grad(x, dists, phi0),
        d0,
        jac=True,
        method="SLSQP",
        bounds=bounds_d,
        options={"maxiter": 500, "ftol": 1e-14},
    )
    d_min = np.clip(res.x, 1.0, max_batch)
    kl_min, _ = _kl_and_grad(d_min, dists, phi0)
    if kl_min > epsilon + KL_ATOL:
        return d_min if kl_min < kl0 else d0.copy()

    weight = np.concatenate([r, r]) / r.sum()

    def to_batch(x: np.ndarray) -> np.ndarray:
        return d0 + x[:size] - x[size:]

    def constraint(x: np.ndarray) -> float:
        return epsilon - _kl_and_grad(to_batch(x), dists, phi0)[0]

    def constraint_jac(x: np.ndarray) -> np.ndarray:
        grad = _kl_and_grad(to_batch(x), dists, phi0)[1]
        return np.concatenate([-grad, grad])

    bounds_x = [(0.0, max_batch - v) for v in d0] + [(0.0, v - 1.0) for v in d0]
    shift = d_min - d0
    starts = [np.zeros(2 * size), np.concatenate([np.maximum(shift, 0), np.maximum(-shift, 0)])]
    candidates = [d_min]
    for x0 in starts:
        sol = minimize(
            lambda x: float(weight @ x),
            x0,
            jac=lambda x: weight,
            method="SLSQP",
            bounds=bounds_x,
            constraints=[{"type": "ineq", "fun": constraint, "jac": constraint_jac}],
            options={"maxiter": 500, "ftol": 1e-12},
        )
        candidates.append(np.clip(to_batch(sol.x), 1.0, max_batch))
    feasible = [c for c in candidates if _kl_and_grad(c, dists, phi0)[0] <= epsilon + KL_ATOL]
    return min(feasible, key=lambda c: waiting_increase(c, d0, r, np.zeros(size)))
