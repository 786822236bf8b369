"""ParallelSFL Alg. 1 lines 1-10: label sets (K-means), the greedy choice of top workers and
their bottom workers, and the random clusters of the ParallelSFL-R ablation.

Readings of the paper where it is silent or ambiguous (see ``reference/spec-gaps.md``):

* K-means (line 2) needs a vector space, so it runs on the label-distribution vectors ``V_i``
  with the Euclidean metric (not on the pairwise KL matrix of line 1).
* A top worker that cannot serve even one bottom worker (``B_top < b`` or Eq. 10 fails for
  every candidate) joins an existing cluster as a bottom worker if Eq. (8)/(10) allow it,
  otherwise it waits in the pool as a possible bottom worker of a later cluster; a worker that
  still fits nowhere at the end forms a top-only cluster ``(w, [])`` that trains nothing
  (τ_c = 0, Eq. 18 weight 0).

Every tie is broken by the lower worker / set / cluster index, so a given ``rng`` state gives
one result.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from splitfl.algorithms.parallelsfl.problem import IMPROVE_TOL, Cluster, ClusterInputs


def load_kmeans() -> None:
    """Import scikit-learn's K-means now: before a run limits the BLAS/OpenMP threads, as
    :func:`splitfl.algorithms.mergesfl.finetune.load_solver` explains."""
    import sklearn.cluster  # noqa: F401


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
    from sklearn.cluster import KMeans  # here: importing scikit-learn takes ~0.5 s

    labels = KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit_predict(dists)
    sets = [np.flatnonzero(labels == c) for c in range(k)]
    return [s for s in sets if s.size]


# ------------------------------------------------------------------------------ greedy (3-10)


def _best_host(worker: int, clusters: list[Cluster], inputs: ClusterInputs) -> int | None:
    """Index of the cluster that can take ``worker`` as a bottom worker under Eq. (8)/(10)
    with the lowest resulting KL (ties: lower index), or ``None``."""
    best: tuple[float, int] | None = None
    for c, (top, members) in enumerate(clusters):
        cand = members + [worker]
        if not inputs.fits(cand, top):
            continue
        kl = inputs.kl(cand)
        if best is None or kl < best[0] - IMPROVE_TOL:
            best = (kl, c)
    return None if best is None else best[1]


def _place(worker: int, clusters: list[Cluster], inputs: ClusterInputs) -> bool:
    """Add ``worker`` as a bottom worker to :func:`_best_host`'s cluster; False if none."""
    host = _best_host(worker, clusters, inputs)
    if host is None:
        return False
    clusters[host] = (clusters[host][0], sorted(clusters[host][1] + [worker]))
    return True


def _pick_top(
    sets: list[list[int]], no_top: set[int], bandwidth: np.ndarray
) -> tuple[int | None, int]:
    """Lines 5-6: the max-``B`` worker (not in ``no_top``) of the set with the most remaining
    workers (ties: lower set index, lower worker index), removed from its set; with its set's
    index. ``(None, -1)`` when no worker can be tried as a top any more."""
    for s in sorted(range(len(sets)), key=lambda s: (-len(sets[s]), s)):
        eligible = [w for w in sets[s] if w not in no_top]
        if eligible:
            top = max(eligible, key=lambda w: (bandwidth[w], -w))
            sets[s].remove(top)
            return top, s
    return None, -1


def _fill(top: int, sets: list[list[int]], inputs: ClusterInputs) -> list[int]:
    """Lines 7-10: bottom workers for ``top``, one at a time from the candidate set A (each
    set's slowest remaining worker: the largest iteration time alone with ``top`` on the
    cluster time model, Eq. 9), the one of smallest ``KL(Φ_c ‖ Φ_0)`` whose addition keeps
    Eq. (8)/(10); they leave their sets."""
    members: list[int] = []
    while True:
        best: tuple[float, int, int] | None = None
        for s, pool in enumerate(sets):
            if not pool:
                continue
            j = max(pool, key=lambda w: (inputs.iteration_time([w], top), -w))
            cand = members + [j]
            if not inputs.fits(cand, top):
                continue
            kl = inputs.kl(cand)
            if best is None or kl < best[0] - IMPROVE_TOL:
                best = (kl, j, s)
        if best is None:
            return members
        _, j, s = best
        members.append(j)
        sets[s].remove(j)


def greedy_clusters(inputs: ClusterInputs, k: int, rng: np.random.Generator) -> list[Cluster]:
    """Alg. 1 lines 1-10: K-means label sets, then greedy cluster construction.

    While some worker can still be a top worker:

    * line 5-6: the top worker is the max-``B`` worker of the set with the most remaining
      workers (ties: lower set index, lower worker index); it leaves its set;
    * line 8: the candidate set A holds, for each non-empty set, its remaining worker with
      the largest time ``t_j`` w.r.t. this top (Eq. 9: its iteration time alone with the top
      on the cluster time model; A is rebuilt from the sets after each pick, i.e. refilled
      from the set the pick came from);
    * line 9: among the candidates whose addition keeps Eq. (8) and (10), the one giving the
      smallest ``KL(Φ_c ‖ Φ_0)`` (Eq. 13's direction; see :mod:`.problem`) joins; this
      repeats until no candidate of A fits.

    A top worker that got no bottom worker joins the existing cluster that accepts it under
    Eq. (8)/(10) with the lowest resulting KL (seldom possible: an earlier cluster closed when
    even the slowest worker of each set no longer fit); if none does, it goes back to its set, is
    never tried as a top again and may be picked as a bottom worker later. Workers left when
    no top can be chosen any more are placed the same way, else become top-only clusters
    ``(w, [])`` (they train nothing). Returns ``[(top, sorted bottom workers)]`` with every
    worker in exactly one role.
    """
    sets = [list(s) for s in cluster_label_sets(inputs.label_dists, k, rng)]
    no_top: set[int] = set(inputs.excluded_tops)
    clusters: list[Cluster] = []
    while True:
        top, home = _pick_top(sets, no_top, inputs.bandwidth)
        if top is None:
            break
        members = _fill(top, sets, inputs)
        if members:
            clusters.append((top, sorted(members)))
        elif not _place(top, clusters, inputs):
            no_top.add(top)
            sets[home].append(top)
            sets[home].sort()
    for w in sorted(w for pool in sets for w in pool):
        if not _place(w, clusters, inputs):
            clusters.append((w, []))
    return clusters


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
