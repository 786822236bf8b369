"""ParallelSFL §4.2-4.5 control module: worker clustering (Alg. 1) and local frequencies.

Per round the PS knows, for N workers: label distributions ``V`` ([N, M], rows sum to 1),
bottom-model compute time per iteration ``mu_b[i]``, top-model compute time per iteration
on worker i for ONE bottom worker's batch ``mu_p[i]``, the symmetric matrix ``beta[i, j]`` of
per-iteration transmission times (smashed data + gradients of one iteration between i and j;
the diagonal is never used), ingress bandwidths ``B[i]`` (bytes per iteration time unit) and
``b``, the bytes one bottom worker sends per iteration. Eq. (6)/(7) (moving averages of the
measured times) are :func:`~splitfl.algorithms.estimates.moving_average`, shared with MergeSFL.

Algorithm 1 (worker clustering in round h):

1-2.  K-means splits the workers into K label sets ``S_1..S_K`` (:func:`cluster_label_sets`).
3-10. Greedy: the max-``B`` worker of the largest set becomes a top worker; bottom workers are
      added from the candidate set A (the slowest remaining worker of every set, Eq. 9) one at
      a time, each time the one giving the smallest ``KL(Φ_c ‖ Φ_0)``, while Eq. (8) and (10)
      hold (:func:`greedy_clusters`).
11.   Fine-tuning: swaps/moves of bottom workers that lower ``Σ_c U_c`` (Eq. 14) without
      breaking Eq. (8)/(10) (:func:`swap_finetune`).

Then Eq. (15)-(17) give per-cluster local frequencies τ_c (:func:`local_frequencies`) and
Eq. (18) the aggregation weights (:func:`aggregation_weights`).

Readings of the paper where it is silent or ambiguous (see ``reference/spec-gaps.md``):

* K-means (line 2) needs a vector space, so it runs on the label-distribution vectors ``V_i``
  with the Euclidean metric (not on the pairwise KL matrix of line 1).
* KL direction: Eq. (13) defines ``KL(Φ_c ‖ Φ_0)`` while Alg. 1 line 9 prints
  ``KL(Φ_0 ‖ Φ_c)``. Eq. (13)'s direction is used everywhere (greedy, utility, reports), so
  the greedy optimises the same quantity as Eq. (14). It is also finite when a small cluster
  misses some classes, whereas ``KL(Φ_0 ‖ Φ_c)`` is infinite there, which would make the first
  greedy picks indistinguishable.
* Normalisation of Eq. (14) (:func:`utility_scales`): ``W_c`` is divided by ``w_scale``, the
  mean Eq. (9) iteration time over all ordered (bottom i, top j ≠ i) pairs, which makes it
  dimensionless; ``KL`` is divided by ``kl_scale = max_i KL(V_i ‖ Φ_0)``, the KL of the worst
  single worker — by convexity of KL every cluster's ``KL(Φ_c ‖ Φ_0)`` is at most that, so
  the KL term lies in [0, 1]. A zero scale (identical workers) is replaced by 1.
* Eq. (17) (``⌈·⌉ = 1``): every cluster except the fastest gets the largest integer
  ``1 ≤ τ_c ≤ τ`` whose round time ``τ_c·t_c,o + β_c`` does not exceed the fastest cluster's.
* Eq. (8) is read as ``N_c·b ≤ B_top``; Eq. (9) is ``t_i = μ_b,i + β_i,top + μ_p,top`` as
  printed (one bottom worker's share of the top computation); Eq. (10),
  ``N_c·μ_p,top ≤ max_i(μ_b,i + β_i,top)``, is what bounds the top worker's load.
* A top worker that cannot serve even one bottom worker (``B_top < b`` or Eq. 10 fails for
  every candidate) joins an existing cluster as a bottom worker if Eq. (8)/(10) allow it,
  otherwise it waits in the pool as a possible bottom worker of a later cluster; a worker that
  still fits nowhere at the end forms a top-only cluster ``(w, [])`` that trains nothing
  (τ_c = 0, Eq. 18 weight 0).

Top workers' own data do not train (their labels are not in Φ_c); the caller handles that.
No torch here: every function takes numpy arrays and, where random, a ``np.random.Generator``.
Every tie is broken by the lower worker / set / cluster index, so a given ``rng`` state gives
one result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from sklearn.cluster import KMeans

from splitfl.algorithms.estimates import BUDGET_RTOL, iid_reference, kl_divergence

__all__ = [
    "Cluster",
    "aggregation_weights",
    "cluster_iteration_time",
    "cluster_kl",
    "cluster_label_sets",
    "cluster_utility",
    "cluster_waiting",
    "greedy_clusters",
    "iteration_time",
    "local_frequencies",
    "plan_clusters",
    "random_clusters",
    "round_waiting",
    "swap_finetune",
    "top_capacity_ok",
    "total_utility",
    "utility_scales",
]

#: One cluster: ``(top worker, bottom workers)``.
Cluster = tuple[int, list[int]]

#: Absolute slack below which a utility / KL decrease is treated as no decrease (float noise).
IMPROVE_TOL = 1e-12


def _idx(members: Sequence[int] | np.ndarray) -> np.ndarray:
    return np.asarray(members, dtype=np.int64).reshape(-1)


# ----------------------------------------------------------------------------- label sets


def cluster_label_sets(
    label_dists: np.ndarray, k: int, rng: np.random.Generator, n_init: int = 10
) -> list[np.ndarray]:
    """Alg. 1 lines 1-2: split the workers into K label sets with K-means.

    Line 2 clusters "according to the KL-divergence"; K-means needs a vector space, so it runs
    on the label-distribution vectors ``V_i`` with the Euclidean metric (scikit-learn
    ``KMeans(n_init=n_init, random_state=<drawn from rng>)``). K is clamped to
    ``[1, number of distinct V_i]`` (more clusters than distinct points is degenerate); the
    caller's default is ``K = max(1, N // 5)``. One integer is always drawn from ``rng`` (also
    when K = 1) so the generator advances the same way for every K. Returns the non-empty sets
    as sorted index arrays, in K-means label order.
    """
    dists = np.asarray(label_dists, dtype=np.float64)
    n = dists.shape[0]
    seed = int(rng.integers(0, 2**31 - 1))
    if n == 0:
        return []
    distinct = np.unique(dists, axis=0).shape[0]
    k = max(1, min(int(k), n, distinct))
    if k == 1:
        return [np.arange(n)]
    labels = KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit_predict(dists)
    sets = [np.flatnonzero(labels == c) for c in range(k)]
    return [s for s in sets if s.size]


# ------------------------------------------------------------------------ time and constraints


def iteration_time(i: int, top: int, mu_b: np.ndarray, mu_p: np.ndarray, beta: np.ndarray) -> float:
    """Eq. (9): ``t_i = μ_b,i + β_i,top + μ_p,top`` for bottom worker i served by ``top``."""
    return float(mu_b[i] + beta[i, top] + mu_p[top])


def _bottom_link(members: np.ndarray, top: int, mu_b: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """``μ_b,i + β_i,top`` for each member (Eq. 9 without the top's share, Eq. 10's right)."""
    return (
        np.asarray(mu_b, dtype=np.float64)[members]
        + np.asarray(beta, dtype=np.float64)[members, top]
    )


def top_capacity_ok(
    members: Sequence[int] | np.ndarray,
    top: int,
    mu_b: np.ndarray,
    mu_p: np.ndarray,
    beta: np.ndarray,
    bandwidth: np.ndarray,
    b: float,
) -> bool:
    """Eq. (8) ``N_c·b ≤ B_top`` and Eq. (10) ``N_c·μ_p,top ≤ max_i(μ_b,i + β_i,top)``.

    ``N_c = len(members)`` (bottom workers only). An empty cluster satisfies both trivially.
    A relative slack of ``BUDGET_RTOL`` absorbs float round-off only.
    """
    m = _idx(members)
    n_c = m.size
    if n_c == 0:
        return True
    if n_c * b > bandwidth[top] * (1.0 + BUDGET_RTOL):
        return False
    slowest = float(_bottom_link(m, top, mu_b, beta).max())
    return bool(n_c * mu_p[top] <= slowest * (1.0 + BUDGET_RTOL))


def cluster_iteration_time(
    members: Sequence[int] | np.ndarray,
    top: int,
    mu_b: np.ndarray,
    mu_p: np.ndarray,
    beta: np.ndarray,
) -> float:
    """``t_c,o = max_i t_i`` (Eq. 9) over the bottom workers; 0 for a top-only cluster."""
    m = _idx(members)
    if m.size == 0:
        return 0.0
    return float(_bottom_link(m, top, mu_b, beta).max() + mu_p[top])


def cluster_waiting(
    members: Sequence[int] | np.ndarray,
    top: int,
    mu_b: np.ndarray,
    mu_p: np.ndarray,
    beta: np.ndarray,
) -> float:
    """Eq. (11): ``W_c = (1/N_c) Σ_i (t_c,o − t_i)``; 0 for a top-only cluster.

    ``μ_p,top`` is common to all members and cancels, so ``mu_p`` does not change the value.
    """
    m = _idx(members)
    if m.size == 0:
        return 0.0
    link = _bottom_link(m, top, mu_b, beta)
    return float(link.max() - link.mean())


# ------------------------------------------------------------------------------ KL and utility


def cluster_kl(
    members: Sequence[int] | np.ndarray, label_dists: np.ndarray, phi0: np.ndarray
) -> float:
    """Eq. (12)-(13): ``KL(Φ_c ‖ Φ_0)`` with ``Φ_c`` the mean of the members' ``V_i``.

    0 for a top-only cluster (no bottom data, nothing to measure).
    """
    m = _idx(members)
    if m.size == 0:
        return 0.0
    phi_c = np.asarray(label_dists, dtype=np.float64)[m].mean(axis=0)
    return kl_divergence(phi_c, phi0)


def utility_scales(
    label_dists: np.ndarray, mu_b: np.ndarray, mu_p: np.ndarray, beta: np.ndarray
) -> tuple[float, float]:
    """Normalisers ``(w_scale, kl_scale)`` of Eq. (14) (the paper does not give them).

    * ``w_scale`` = mean Eq. (9) time over all ordered pairs (bottom i, top j), i ≠ j:
      ``mean(μ_b) + mean_{i≠j} β_ij + mean(μ_p)`` (``μ_b + μ_p`` for a single worker).
    * ``kl_scale`` = ``max_i KL(V_i ‖ Φ_0)``: by convexity no cluster's KL exceeds it.

    A scale that is not positive (identical or zero-cost workers) is replaced by 1.
    """
    mu_b = np.asarray(mu_b, dtype=np.float64)
    mu_p = np.asarray(mu_p, dtype=np.float64)
    beta = np.asarray(beta, dtype=np.float64)
    n = mu_b.size
    if n == 0:
        return 1.0, 1.0
    off = ~np.eye(n, dtype=bool)
    mean_beta = float(beta[off].mean()) if n > 1 else 0.0
    w_scale = float(mu_b.mean() + mean_beta + mu_p.mean())
    dists = np.asarray(label_dists, dtype=np.float64)
    phi0 = iid_reference(dists)
    kl_scale = max(kl_divergence(v, phi0) for v in dists)
    return (w_scale if w_scale > 0 else 1.0), (kl_scale if kl_scale > 0 else 1.0)


def cluster_utility(
    members: Sequence[int] | np.ndarray,
    top: int,
    label_dists: np.ndarray,
    phi0: np.ndarray,
    mu_b: np.ndarray,
    mu_p: np.ndarray,
    beta: np.ndarray,
    lam: float,
    w_scale: float,
    kl_scale: float,
) -> float:
    """Eq. (14): ``U_c = λ·W_c/w_scale + (1−λ)·KL(Φ_c ‖ Φ_0)/kl_scale``.

    ``W_c`` is Eq. (11), the KL is Eq. (13); see :func:`utility_scales` for the scales.
    """
    w = cluster_waiting(members, top, mu_b, mu_p, beta)
    kl = cluster_kl(members, label_dists, phi0)
    return float(lam * w / w_scale + (1.0 - lam) * kl / kl_scale)


def total_utility(
    clusters: Sequence[Cluster],
    label_dists: np.ndarray,
    phi0: np.ndarray,
    mu_b: np.ndarray,
    mu_p: np.ndarray,
    beta: np.ndarray,
    lam: float,
    w_scale: float,
    kl_scale: float,
) -> float:
    """``Σ_c U_c`` (Eq. 14 summed over clusters), the objective of Alg. 1 line 11."""
    return float(
        sum(
            cluster_utility(m, t, label_dists, phi0, mu_b, mu_p, beta, lam, w_scale, kl_scale)
            for t, m in clusters
        )
    )


# ------------------------------------------------------------------------------ greedy (3-10)


def _best_host(
    worker: int,
    clusters: list[Cluster],
    label_dists: np.ndarray,
    phi0: np.ndarray,
    mu_b: np.ndarray,
    mu_p: np.ndarray,
    beta: np.ndarray,
    bandwidth: np.ndarray,
    b: float,
) -> int | None:
    """Index of the cluster that can take ``worker`` as a bottom worker under Eq. (8)/(10)
    with the lowest resulting KL (ties: lower index), or ``None``."""
    best: tuple[float, int] | None = None
    for c, (top, members) in enumerate(clusters):
        cand = members + [worker]
        if not top_capacity_ok(cand, top, mu_b, mu_p, beta, bandwidth, b):
            continue
        kl = cluster_kl(cand, label_dists, phi0)
        if best is None or kl < best[0] - IMPROVE_TOL:
            best = (kl, c)
    return None if best is None else best[1]


def greedy_clusters(
    label_dists: np.ndarray,
    mu_b: np.ndarray,
    mu_p: np.ndarray,
    beta: np.ndarray,
    bandwidth: np.ndarray,
    b: float,
    k: int,
    rng: np.random.Generator,
) -> list[Cluster]:
    """Alg. 1 lines 1-10: K-means label sets, then greedy cluster construction.

    While some worker can still be a top worker:

    * line 5-6: the top worker is the max-``B`` worker of the set with the most remaining
      workers (ties: lower set index, lower worker index); it leaves its set;
    * line 8: the candidate set A holds, for each non-empty set, its remaining worker with
      the largest Eq. (9) time ``t_j`` w.r.t. this top (A is rebuilt from the sets after each
      pick, i.e. refilled from the set the pick came from);
    * line 9: among the candidates whose addition keeps Eq. (8) and (10), the one giving the
      smallest ``KL(Φ_c ‖ Φ_0)`` (Eq. 13's direction; see the module docstring) joins; this
      repeats until no candidate fits. Restricting each set to its slowest worker loses
      nothing for Eq. (10): a faster worker of the same set would not fit either.

    A top worker that got no bottom worker joins the existing cluster that accepts it under
    Eq. (8)/(10) with the lowest resulting KL (seldom possible: an earlier cluster closed when
    even the slowest worker of each set no longer fit); if none does, it goes back to its set, is
    never tried as a top again and may be picked as a bottom worker later. Workers left when
    no top can be chosen any more are placed the same way, else become top-only clusters
    ``(w, [])`` (they train nothing). Returns ``[(top, sorted bottom workers)]`` with every
    worker in exactly one role.
    """
    dists = np.asarray(label_dists, dtype=np.float64)
    mu_b = np.asarray(mu_b, dtype=np.float64)
    mu_p = np.asarray(mu_p, dtype=np.float64)
    beta = np.asarray(beta, dtype=np.float64)
    bandwidth = np.asarray(bandwidth, dtype=np.float64)
    phi0 = iid_reference(dists)
    sets = [list(s) for s in cluster_label_sets(dists, k, rng)]
    no_top: set[int] = set()
    clusters: list[Cluster] = []

    while True:
        top, home = None, -1
        for s in sorted(range(len(sets)), key=lambda s: (-len(sets[s]), s)):
            eligible = [w for w in sets[s] if w not in no_top]
            if eligible:
                top = max(eligible, key=lambda w: (bandwidth[w], -w))
                home = s
                sets[s].remove(top)
                break
        if top is None:
            break
        members: list[int] = []
        while True:
            best: tuple[float, int, int] | None = None
            for s, pool in enumerate(sets):
                if not pool:
                    continue
                j = max(pool, key=lambda w: (mu_b[w] + beta[w, top], -w))
                cand = members + [j]
                if not top_capacity_ok(cand, top, mu_b, mu_p, beta, bandwidth, b):
                    continue
                kl = cluster_kl(cand, dists, phi0)
                if best is None or kl < best[0] - IMPROVE_TOL:
                    best = (kl, j, s)
            if best is None:
                break
            _, j, s = best
            members.append(j)
            sets[s].remove(j)
        if members:
            clusters.append((top, sorted(members)))
            continue
        host = _best_host(top, clusters, dists, phi0, mu_b, mu_p, beta, bandwidth, b)
        if host is not None:
            clusters[host] = (clusters[host][0], sorted(clusters[host][1] + [top]))
        else:
            no_top.add(top)
            sets[home].append(top)
            sets[home].sort()

    for w in sorted(w for pool in sets for w in pool):
        host = _best_host(w, clusters, dists, phi0, mu_b, mu_p, beta, bandwidth, b)
        if host is not None:
            clusters[host] = (clusters[host][0], sorted(clusters[host][1] + [w]))
        else:
            clusters.append((w, []))
    return clusters


# ---------------------------------------------------------------------------- fine-tuning (11)


class _Evaluator:
    """Vectorised Eq. (14) utilities and Eq. (8)/(10) checks for candidate clusters.

    Gives the same values as :func:`cluster_utility` / :func:`top_capacity_ok` (up to float
    round-off) for many one-worker changes of a cluster at once; used by the local search.
    """

    def __init__(
        self,
        label_dists: np.ndarray,
        phi0: np.ndarray,
        mu_b: np.ndarray,
        mu_p: np.ndarray,
        beta: np.ndarray,
        bandwidth: np.ndarray,
        b: float,
        lam: float,
        w_scale: float,
        kl_scale: float,
    ) -> None:
        self.v = np.asarray(label_dists, dtype=np.float64)
        self.log_phi0 = np.log(np.maximum(np.asarray(phi0, dtype=np.float64), 1e-12))
        self.link = np.asarray(mu_b, dtype=np.float64)[:, None] + np.asarray(beta, np.float64)
        self.mu_p = np.asarray(mu_p, dtype=np.float64)
        self.bandwidth = np.asarray(bandwidth, dtype=np.float64)
        self.b = float(b)
        self.cw = lam / w_scale
        self.ck = (1.0 - lam) / kl_scale

    def _kl_rows(self, phi: np.ndarray) -> np.ndarray:
        pos = phi > 0
        logp = np.log(np.where(pos, phi, 1.0))
        return np.where(pos, phi * (logp - self.log_phi0), 0.0).sum(axis=-1)

    def _finish(
        self, top: int, size: int, lmax: np.ndarray, lsum: np.ndarray, vsum: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Utilities and feasibility of clusters of ``size`` members given link max/sum, ΣV."""
        wait = lmax - lsum / size
        util = self.cw * wait + self.ck * self._kl_rows(vsum / size)
        fits_bw = size * self.b <= self.bandwidth[top] * (1.0 + BUDGET_RTOL)
        ok = fits_bw & (size * self.mu_p[top] <= lmax * (1.0 + BUDGET_RTOL))
        return util, ok

    def single(self, members: list[int], top: int) -> tuple[float, bool]:
        """Utility and feasibility of one cluster (``(0, True)`` when it has no members)."""
        if not members:
            return 0.0, True
        link = self.link[members, top]
        util, ok = self._finish(
            top, len(members), link.max()[None], link.sum()[None], self.v[members].sum(0)[None]
        )
        return float(util[0]), bool(ok[0])

    def add_one(self, base: list[int], top: int, cands: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Each ``base + [j]`` for ``j`` in ``cands``."""
        link_j = self.link[cands, top]
        if base:
            link = self.link[base, top]
            lmax = np.maximum(link.max(), link_j)
            lsum = link.sum() + link_j
            vsum = self.v[base].sum(0) + self.v[cands]
        else:
            lmax, lsum, vsum = link_j, link_j.copy(), self.v[cands]
        return self._finish(top, len(base) + 1, lmax, lsum, vsum)

    def swap_in(self, members: list[int], top: int, worker: int) -> tuple[np.ndarray, np.ndarray]:
        """Each cluster ``members`` with its q-th member replaced by ``worker``, for every q."""
        link = self.link[members, top]
        size = len(members)
        if size == 1:
            others_max = np.full(1, -np.inf)
        else:
            order = np.argsort(-link, kind="stable")
            others_max = np.full(size, link[order[0]])
            others_max[order[0]] = link[order[1]]
        new = self.link[worker, top]
        lmax = np.maximum(others_max, new)
        lsum = link.sum() - link + new
        vsum = self.v[members].sum(0) - self.v[members] + self.v[worker]
        return self._finish(top, size, lmax, lsum, vsum)


def swap_finetune(
    clusters: Sequence[Cluster],
    label_dists: np.ndarray,
    phi0: np.ndarray,
    mu_b: np.ndarray,
    mu_p: np.ndarray,
    beta: np.ndarray,
    bandwidth: np.ndarray,
    b: float,
    lam: float,
    w_scale: float,
    kl_scale: float,
    max_passes: int = 20,
    allow_moves: bool = True,
) -> list[Cluster]:
    """Alg. 1 line 11: local search lowering ``Σ_c U_c`` (Eq. 14) under Eq. (8)/(10).

    Each pass is a deterministic first-improvement sweep:

    1. swaps: for every cluster pair c < d and every bottom-worker pair (i ∈ c, j ∈ d), in
       list order, swap i and j if ``U_c + U_d`` drops by more than ``IMPROVE_TOL`` and both
       new clusters satisfy Eq. (8)/(10);
    2. moves (``allow_moves``): for every bottom worker i of a cluster with ≥ 2 bottom
       workers, move it to the other cluster giving the largest drop of ``U_c + U_d`` (ties:
       lower index) if both clusters then satisfy Eq. (8)/(10). Moving into a top-only
       cluster is allowed (it starts training); no move empties a cluster.

    Top workers keep their role. Passes repeat until one changes nothing or ``max_passes``
    is reached. Every accepted change strictly lowers ``Σ U_c``, so the result is never worse
    than the input. Utilities are evaluated vectorised over the candidates of one worker
    (same values as :func:`cluster_utility`). Returns new ``(top, sorted members)`` tuples;
    the input is not modified.
    """
    ev = _Evaluator(label_dists, phi0, mu_b, mu_p, beta, bandwidth, b, lam, w_scale, kl_scale)
    tops = [int(t) for t, _ in clusters]
    mems = [[int(w) for w in m] for _, m in clusters]
    utils = [ev.single(m, t)[0] for t, m in zip(tops, mems, strict=True)]
    n_c = len(tops)
    for _ in range(max_passes):
        changed = False
        for c in range(n_c):
            for d in range(c + 1, n_c):
                mc, md = mems[c], mems[d]
                for p in range(len(mc)):
                    q = 0
                    while q < len(md):
                        rest_c = mc[:p] + mc[p + 1 :]
                        uc, okc = ev.add_one(rest_c, tops[c], md[q:])
                        ud, okd = ev.swap_in(md, tops[d], mc[p])
                        ud, okd = ud[q:], okd[q:]
                        good = (utils[c] + utils[d] - uc - ud > IMPROVE_TOL) & okc & okd
                        hits = np.flatnonzero(good)
                        if hits.size == 0:
                            break
                        h = int(hits[0])
                        mc[p], md[q + h] = md[q + h], mc[p]
                        utils[c], utils[d] = float(uc[h]), float(ud[h])
                        changed = True
                        q += h + 1
        if allow_moves:
            for c in range(n_c):
                p = 0
                while p < len(mems[c]) and len(mems[c]) > 1:
                    w = mems[c][p]
                    new_c = mems[c][:p] + mems[c][p + 1 :]
                    uc, okc = ev.single(new_c, tops[c])
                    best: tuple[float, int, float] | None = None
                    if okc:
                        for d in range(n_c):
                            if d == c:
                                continue
                            ud_arr, okd_arr = ev.add_one(mems[d], tops[d], [w])
                            ud = float(ud_arr[0])
                            gain = utils[c] + utils[d] - uc - ud
                            if gain <= IMPROVE_TOL or (best is not None and gain <= best[0]):
                                continue
                            if bool(okd_arr[0]):
                                best = (gain, d, ud)
                    if best is None:
                        p += 1
                        continue
                    _, d, ud = best
                    mems[c] = new_c
                    mems[d] = mems[d] + [w]
                    utils[c], utils[d] = uc, ud
                    changed = True
        if not changed:
            break
    return [(t, sorted(m)) for t, m in zip(tops, mems, strict=True)]


# ------------------------------------------------------------------------ random (ablation R)


def random_clusters(n: int, sizes: Sequence[int] | int, rng: np.random.Generator) -> list[Cluster]:
    """ParallelSFL-R ablation: random top workers and random membership.

    ``sizes`` is either the list of bottom-worker counts per cluster (e.g. those of the greedy
    plan, so only *who* goes where is random; ``Σ sizes + len(sizes)`` must equal ``n``) or an
    int C, the number of clusters, whose ``n − C`` bottom workers are split as evenly as
    possible (the first clusters get one more). A random permutation of the workers gives
    the C tops first, then the members in cluster order. Eq. (8)/(10) are NOT checked: the
    ablation removes the clustering strategy altogether (the paper's -R also uses a fixed τ).
    """
    if isinstance(sizes, int | np.integer):
        n_clusters = int(sizes)
        if not 1 <= n_clusters <= n:
            raise ValueError(f"need 1 ≤ number of clusters ≤ {n}, got {n_clusters}")
        base, extra = divmod(n - n_clusters, n_clusters)
        counts = [base + (1 if c < extra else 0) for c in range(n_clusters)]
    else:
        counts = [int(s) for s in sizes]
        if any(s < 0 for s in counts) or sum(counts) + len(counts) != n or not counts:
            raise ValueError(f"cluster sizes {counts} plus one top each do not cover {n} workers")
    perm = [int(w) for w in rng.permutation(n)]
    n_clusters = len(counts)
    tops, rest = perm[:n_clusters], perm[n_clusters:]
    out: list[Cluster] = []
    start = 0
    for top, size in zip(tops, counts, strict=True):
        out.append((top, sorted(rest[start : start + size])))
        start += size
    return out


# ---------------------------------------------------------------- local frequency and weights


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


# ---------------------------------------------------------------------------- whole pipeline


def plan_clusters(
    label_dists: np.ndarray,
    mu_b: np.ndarray,
    mu_p: np.ndarray,
    beta: np.ndarray,
    bandwidth: np.ndarray,
    b: float,
    rng: np.random.Generator,
    *,
    tau: int,
    k: int | None = None,
    lam: float = 0.5,
    beta_ps: np.ndarray | None = None,
    max_passes: int = 20,
    random_assignment: bool = False,
    adaptive_tau: bool = True,
    cluster_time: Callable[[list[Cluster]], tuple[np.ndarray, np.ndarray]] | None = None,
) -> tuple[list[Cluster], np.ndarray, dict[str, Any]]:
    """Alg. 1 lines 1-11 plus Eq. (15)-(17) for one round.

    ``k`` defaults to ``max(1, N // 5)``; ``beta_ps[i]`` is worker i's time to upload the
    submodels to the PS (``β_c = beta_ps[top_c]``, default 0). ``cluster_time``, if given,
    maps the final clusters to ``(t_c,o, β_c)`` per cluster for Eq. (15)-(17) in place of
    Eq. (9) and ``beta_ps`` (ParallelSFL passes the clock's cluster model,
    :func:`splitfl.system.cluster.cluster_times`). Variants:
    ``random_assignment=True`` replaces the plan by :func:`random_clusters` with the greedy
    plan's cluster sizes and skips line 11 (ParallelSFL-R); ``adaptive_tau=False`` gives every
    training cluster τ (ParallelSFL-WC; -R uses both). Returns the clusters, τ_c (int64, 0 for
    top-only clusters) and an info dict: ``sum_utility`` (Σ U_c), ``sum_utility_greedy``
    (before line 11), ``mean_kl`` and ``mean_waiting`` (Eq. 13 / Eq. 11 averaged over the
    clusters that train), ``n_clusters``, ``n_top_only``, ``w_scale``, ``kl_scale``,
    ``t_co`` and ``beta_c`` (per-cluster lists), ``round_time`` (max_c of Eq. 15),
    ``cluster_times`` (Eq. 15 per cluster) and ``cluster_waiting`` (Eq. 16 over the clusters
    that train).
    """
    dists = np.asarray(label_dists, dtype=np.float64)
    n = dists.shape[0]
    if k is None:
        k = max(1, n // 5)
    phi0 = iid_reference(dists)
    w_scale, kl_scale = utility_scales(dists, mu_b, mu_p, beta)
    scales = (lam, w_scale, kl_scale)
    greedy = greedy_clusters(dists, mu_b, mu_p, beta, bandwidth, b, k, rng)
    u_greedy = total_utility(greedy, dists, phi0, mu_b, mu_p, beta, *scales)
    if random_assignment:
        clusters = random_clusters(n, [len(m) for _, m in greedy], rng)
    else:
        clusters = swap_finetune(
            greedy, dists, phi0, mu_b, mu_p, beta, bandwidth, b, *scales, max_passes=max_passes
        )
    if cluster_time is None:
        t_co = np.array([cluster_iteration_time(m, t, mu_b, mu_p, beta) for t, m in clusters])
        ps = np.zeros(n) if beta_ps is None else np.asarray(beta_ps, dtype=np.float64)
        beta_c = np.array([ps[t] for t, _ in clusters], dtype=np.float64)
    else:
        t_co, beta_c = (np.asarray(a, dtype=np.float64) for a in cluster_time(clusters))
    if adaptive_tau:
        taus = local_frequencies(clusters, t_co, beta_c, tau)
    else:
        taus = np.array([tau if m else 0 for _, m in clusters], dtype=np.int64)
    training = [(t, m) for t, m in clusters if m]
    kls = [cluster_kl(m, dists, phi0) for _, m in training]
    waits = [cluster_waiting(m, t, mu_b, mu_p, beta) for t, m in training]
    info: dict[str, Any] = {
        "sum_utility": total_utility(clusters, dists, phi0, mu_b, mu_p, beta, *scales),
        "sum_utility_greedy": u_greedy,
        "mean_kl": float(np.mean(kls)) if kls else 0.0,
        "mean_waiting": float(np.mean(waits)) if waits else 0.0,
        "n_clusters": len(clusters),
        "n_top_only": len(clusters) - len(training),
        "w_scale": w_scale,
        "kl_scale": kl_scale,
        "t_co": t_co.tolist(),
        "beta_c": beta_c.tolist(),
    }
    info.update(round_waiting(taus * t_co + np.where(taus > 0, beta_c, 0.0), taus > 0))
    return clusters, taus, info


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
