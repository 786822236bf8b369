"""MergeSFL §IV-A control module: worker state estimation and Algorithm 1 as pure functions.

Algorithm 1 (worker arrangement and configuration in round h):

1-2. Give the fastest worker l the maximum batch size D and every worker a batch size that
     aligns its iteration time with l's (Eq. 9; Eq. 7 is the time model).
3-5. Rank workers by priority (Eq. 13), seed a genetic algorithm with the m highest-priority
     workers and search bit strings (gene i = worker i selected) for the set S minimising
     KL(Φ_h ‖ Φ_0) (Eq. 11-12) under the PS ingress-bandwidth budget (Eq. 10).
6.   Fine-tune the batch sizes of S with the smallest added waiting time Δ (Eq. 14) subject to
     KL(Φ_h ‖ Φ_0) ≤ ε.
7.   Scale all batch sizes by one factor to use as much of the budget as Eq. (10) allows.

Readings of the paper where it is silent or ambiguous (see ``reference/spec-gaps.md``):

* Eq. (9) as printed, ``d_i = d_l·⌊(μ_l+β_l)/(μ_i+β_i)⌋``, floors a ratio ≤ 1 and gives 0 to
  every worker slower than l; it is read as ``d_i = ⌊D·(μ_l+β_l)/(μ_i+β_i)⌋``, and workers
  whose d_i is 0 cannot keep pace with l even at one sample, so they are not selectable this
  round (flooring them at 1 made stragglers the KL-only GA happily picked).
* Line 7 scales all sizes by one common factor, capped so the largest reaches D (capping each
  size at D separately breaks the proportionality of Eq. 9).
* GA settings (population, generations, rates, elite count, m = ⌈init_fraction·N⌉) and ε are
  arguments, since the paper does not give them.
* Line 6 ("a Lagrange dual problem") is solved numerically with SLSQP on the equivalent primal
  problem; the |Δd_i| of Eq. (14) is linearised with d = d⁰ + u − v, u, v ≥ 0.

No torch here: every function takes numpy arrays and, where random, a ``np.random.Generator``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.optimize import minimize

from splitfl.algorithms.estimates import BUDGET_RTOL, iid_reference, kl_divergence

#: Absolute slack on ``KL ≤ ε`` when judging a numerical solution of line 6 feasible.
KL_ATOL = 1e-9


# ------------------------------------------------------------------------ batch size and time


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


def priorities(participation: np.ndarray) -> np.ndarray:
    """Eq. (13): ``p_i = Σ_j (K_j+1) / (K_i+1)`` with ``K`` the participation counts."""
    k1 = np.asarray(participation, dtype=np.float64) + 1.0
    return k1.sum() / k1


# ------------------------------------------------------------------------ label distributions


def _as_indices(selected: np.ndarray, n: int) -> np.ndarray:
    """Worker indices from a boolean mask of length ``n`` or from an integer index array."""
    sel = np.asarray(selected)
    if sel.dtype == np.bool_:
        if sel.shape != (n,):
            raise ValueError(f"boolean mask has shape {sel.shape}, expected ({n},)")
        return np.flatnonzero(sel)
    sel = sel.astype(np.int64).reshape(-1)
    if sel.size and (sel.min() < 0 or sel.max() >= n):
        raise ValueError(f"worker index out of range [0, {n})")
    return sel


def label_mixture(batch: np.ndarray, label_dists: np.ndarray, selected: np.ndarray) -> np.ndarray:
    """Eq. (11): ``Φ_h = Σ_{i∈S} d_i·V_i / Σ_{i∈S} d_i``.

    ``batch`` has one entry per worker (length N) and ``label_dists`` one row ``V_i`` per worker
    (``[N, M]``, rows summing to 1). ``selected`` is either a boolean mask of length N or an
    integer array of worker indices; both are accepted. Raises ``ValueError`` if the selected
    batch sizes sum to zero (the mixture is undefined).
    """
    dists = np.asarray(label_dists, dtype=np.float64)
    idx = _as_indices(selected, dists.shape[0])
    d = np.asarray(batch, dtype=np.float64)[idx]
    total = d.sum()
    if total <= 0:
        raise ValueError("the selected workers' batch sizes sum to zero; Φ_h is undefined")
    return d @ dists[idx] / total


# ----------------------------------------------------------------------------- worker selection


def bandwidth_feasible(
    mask: np.ndarray, batch: np.ndarray, bytes_per_sample: float, budget: float
) -> bool:
    """Eq. (10): ``Σ_{i∈S} d_i·c ≤ B`` (``mask``: boolean mask or index array, as Eq. 11).

    A relative slack of ``BUDGET_RTOL`` absorbs float round-off only.
    """
    d = np.asarray(batch, dtype=np.float64)
    used = d[_as_indices(mask, d.shape[0])].sum() * bytes_per_sample
    return bool(used <= budget * (1.0 + BUDGET_RTOL))


def _repair(
    genes: np.ndarray,
    cost: np.ndarray,
    budget: float,
    fits_alone: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """Make a bit string satisfy Eq. (10) and be non-empty (in place; also returned).

    While over budget, one selected worker chosen uniformly at random is dropped. If the result
    is empty, one worker chosen uniformly at random among those that fit the budget alone
    (``fits_alone``, non-empty by the caller's check) is selected.
    """
    limit = budget * (1.0 + BUDGET_RTOL)
    used = cost[genes].sum()
    while used > limit:
        on = np.flatnonzero(genes)
        drop = on[rng.integers(on.size)]
        genes[drop] = False
        used -= cost[drop]
    if not genes.any():
        genes[fits_alone[rng.integers(fits_alone.size)]] = True
    return genes


def ga_select(
    label_dists: np.ndarray,
    batch: np.ndarray,
    bytes_per_sample: float,
    budget: float,
    priority: np.ndarray,
    rng: np.random.Generator,
    population: int = 20,
    generations: int = 40,
    mutation_rate: float = 0.05,
    crossover_rate: float = 0.9,
    elite: int = 2,
    init_fraction: float = 0.5,
    phi0: np.ndarray | None = None,
) -> np.ndarray:
    """Lines 3-5 of Alg. 1: genetic search for the worker set minimising ``KL(Φ_h ‖ Φ_0)``.

    Encoding: a bit string of length N, gene i = worker i selected. ``Φ_0`` is
    :func:`iid_reference` over all N workers and ``Φ_h`` is Eq. (11) with the Eq. (9) batch
    sizes ``batch``.

    * Initial population ("select m workers based on their priority"): the m = ⌈init_fraction·N⌉
      workers of highest Eq. (13) priority (ties to the lower index). Individual 0 selects all
      m of them; each other individual selects each of the m with probability 1/2 (an empty
      draw gets one of the m at random). Every individual is then repaired.
    * Repair (applied to every individual, initial and offspring): while Eq. (10) is violated,
      drop a uniformly random selected worker; if the set became empty, select one random
      worker among those whose batch fits the budget alone.
    * Fitness: ``KL(Φ_h(S) ‖ Φ_0)``, lower is better; ties go to the larger total priority
      ``Σ_{i∈S} p_i`` (so equally balanced sets favour rarely-used workers and more workers).
    * Each generation keeps the ``elite`` best unchanged; every other child comes from two
      binary-tournament parents (best of two random individuals each), uniform crossover with
      probability ``crossover_rate`` (else a copy of the first parent), independent bit-flip
      mutation with probability ``mutation_rate`` per gene, then repair.

    ``phi0`` overrides Φ_0 (when ``label_dists`` holds only the eligible workers, Φ_0 is still
    the mean over all N). Deterministic for a given ``rng`` state. Raises ``ValueError`` if no
    single worker fits the budget. Returns the best set found, as sorted worker indices.
    """
    dists = np.asarray(label_dists, dtype=np.float64)
    d = np.asarray(batch, dtype=np.float64)
    prio = np.asarray(priority, dtype=np.float64)
    n = dists.shape[0]
    if n == 0:
        raise ValueError("no workers to select from")
    cost = d * bytes_per_sample
    fits_alone = np.flatnonzero(cost <= budget * (1.0 + BUDGET_RTOL))
    if fits_alone.size == 0:
        raise ValueError(
            f"bandwidth budget {budget} is below the smallest worker's use {cost.min()} (Eq. 10)"
        )
    phi0 = iid_reference(dists) if phi0 is None else np.asarray(phi0, dtype=np.float64)
    population = max(1, population)
    elite = min(max(0, elite), population)

    cache: dict[bytes, tuple[float, float]] = {}

    def key(genes: np.ndarray) -> tuple[float, float]:
        k = np.packbits(genes).tobytes()
        if k not in cache:
            kl = kl_divergence(label_mixture(d, dists, genes), phi0)
            cache[k] = (kl, -float(prio[genes].sum()))
        return cache[k]

    m = min(n, max(1, math.ceil(init_fraction * n)))
    top = np.argsort(-prio, kind="stable")[:m]
    pop = []
    for j in range(population):
        genes = np.zeros(n, dtype=bool)
        if j == 0:
            genes[top] = True
        else:
            genes[top[rng.random(m) < 0.5]] = True
            if not genes.any():
                genes[top[rng.integers(m)]] = True
        pop.append(_repair(genes, cost, budget, fits_alone, rng))

    def tournament(ranked: list[np.ndarray]) -> np.ndarray:
        a, b = rng.integers(len(ranked), size=2)
        return ranked[min(a, b)]  # ranked is sorted best-first, so the lower rank wins

    for _ in range(generations):
        ranked = sorted(pop, key=key)
        nxt = [g.copy() for g in ranked[:elite]]
        while len(nxt) < population:
            first, second = tournament(ranked), tournament(ranked)
            if rng.random() < crossover_rate:
                child = np.where(rng.random(n) < 0.5, first, second)
            else:
                child = first.copy()
            child ^= rng.random(n) < mutation_rate
            nxt.append(_repair(child, cost, budget, fits_alone, rng))
        pop = nxt
    best = min(pop, key=key)
    return np.flatnonzero(best)


# ----------------------------------------------------------------------- batch-size finetuning


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


# ------------------------------------------------------------------------------- Algorithm 1


def arrange_workers(
    label_dists: np.ndarray,
    mu: np.ndarray,
    beta: np.ndarray,
    participation: np.ndarray,
    bytes_per_sample: float,
    budget: float,
    max_batch: int,
    epsilon: float,
    rng: np.random.Generator,
    tau: int = 1,
    **ga_options: Any,
) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Algorithm 1 end to end (lines 1-7) for one round.

    Returns the sorted selected worker indices, their integer batch sizes (aligned with the
    indices) and an info dict: ``kl_before`` (GA set with Eq. 9 sizes), ``kl_finetuned`` (after
    line 6), ``kl_after`` (final integer sizes), ``delta`` (Eq. 14 of line 6),
    ``waiting_time`` (Eq. 8 over the selected workers, final sizes), ``bandwidth`` (Σ d_i·c).
    ``ga_options`` are passed to :func:`ga_select`. Workers whose Eq. (9) batch is 0 (slower
    per sample than D× the fastest worker: even one sample would make them stragglers) are not
    offered to the GA; ``excluded`` counts them. Φ_0 stays the mean over all N workers.
    """
    dists = np.asarray(label_dists, dtype=np.float64)
    mu = np.asarray(mu, dtype=np.float64)
    beta = np.asarray(beta, dtype=np.float64)
    batch = regulate_batch_sizes(mu, beta, max_batch, min_batch=0)
    phi0 = iid_reference(dists)
    eligible = np.flatnonzero(batch >= 1)
    prio = priorities(participation)[eligible]
    chosen = ga_select(
        dists[eligible],
        batch[eligible],
        bytes_per_sample,
        budget,
        prio,
        rng,
        phi0=phi0,
        **ga_options,
    )
    selected = eligible[chosen]
    d0 = batch[selected].astype(np.float64)
    kl_before = kl_divergence(label_mixture(d0, dists[selected], np.arange(selected.size)), phi0)
    tuned = finetune_batch_sizes(
        d0, mu[selected], beta[selected], dists[selected], phi0, epsilon, max_batch
    )
    kl_tuned = kl_divergence(label_mixture(tuned, dists[selected], np.arange(selected.size)), phi0)
    final = scale_to_budget(tuned, bytes_per_sample, budget, max_batch)
    kl_after = kl_divergence(label_mixture(final, dists[selected], np.arange(selected.size)), phi0)
    times = iteration_times(final, mu[selected], beta[selected], tau)
    info = {
        "kl_before": kl_before,
        "kl_finetuned": kl_tuned,
        "kl_after": kl_after,
        "delta": waiting_increase(tuned, d0, mu[selected], beta[selected]),
        "waiting_time": average_waiting_time(times),
        "bandwidth": float(final.sum() * bytes_per_sample),
        "excluded": float(batch.size - eligible.size),
    }
    return selected, final, info
