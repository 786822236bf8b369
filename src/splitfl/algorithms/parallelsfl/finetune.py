"""ParallelSFL Alg. 1 line 11: local search (swaps and moves of bottom workers) lowering
``Σ_c U_c`` (Eq. 14) under Eq. (8)/(10), on the cluster time model of
:class:`~.problem.ClusterInputs` (:class:`_Evaluator`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from splitfl.algorithms.estimates import BUDGET_RTOL
from splitfl.algorithms.parallelsfl.problem import IMPROVE_TOL, Cluster, ClusterInputs


class _Evaluator:
    """Eq. (14) utilities and Eq. (8)/(10) checks of candidate clusters (one-worker changes
    of a cluster), the same values as :func:`~.problem.cluster_utility` and :func:`~.problem.
    top_capacity_ok` (up to float round-off): the times of every candidate come from the
    inputs' cluster time model (:meth:`~.problem.ClusterInputs.timing`), the KL terms are
    computed for all candidates of one change at once."""

    def __init__(self, inputs: ClusterInputs) -> None:
        self.inputs = inputs
        self.v = inputs.label_dists
        self.log_phi0 = np.log(np.maximum(inputs.phi0, 1e-12))
        self.cw = inputs.lam / inputs.w_scale
        self.ck = (1.0 - inputs.lam) / inputs.kl_scale

    def _kl_rows(self, phi: np.ndarray) -> np.ndarray:
        pos = phi > 0
        logp = np.log(np.where(pos, phi, 1.0))
        return np.where(pos, phi * (logp - self.log_phi0), 0.0).sum(axis=-1)

    def _many(self, candidates: list[list[int]], top: int) -> tuple[np.ndarray, np.ndarray]:
        """Utilities and feasibility of equally sized candidate clusters served by ``top``."""
        inputs, size = self.inputs, len(candidates[0])
        timings = [inputs.timing(m, top) for m in candidates]
        wait = np.array([t.waiting for t in timings])
        slowest = np.array([t.bottom_max for t in timings])
        util = self.cw * wait + self.ck * self._kl_rows(self.v[candidates].mean(axis=1))
        fits_bw = size * inputs.b <= inputs.bandwidth[top] * (1.0 + BUDGET_RTOL)
        ok = fits_bw & (size * inputs.mu_p[top] <= slowest * (1.0 + BUDGET_RTOL))
        return util, ok

    def single(self, members: list[int], top: int) -> tuple[float, bool]:
        """Utility and feasibility of one cluster (``(0, True)`` when it has no members)."""
        if not members:
            return 0.0, True
        util, ok = self._many([members], top)
        return float(util[0]), bool(ok[0])

    def add_one(self, base: list[int], top: int, cands: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Each ``base + [j]`` for ``j`` in ``cands``."""
        return self._many([base + [j] for j in cands], top)

    def swap_in(self, members: list[int], top: int, worker: int) -> tuple[np.ndarray, np.ndarray]:
        """Each cluster ``members`` with its q-th member replaced by ``worker``, for every q."""
        cands = [members[:q] + [worker] + members[q + 1 :] for q in range(len(members))]
        return self._many(cands, top)


class _Search:
    """The local search's state: tops, members and utilities per cluster (changed in place)."""

    def __init__(self, clusters: Sequence[Cluster], inputs: ClusterInputs) -> None:
        self.ev = _Evaluator(inputs)
        self.tops = [int(t) for t, _ in clusters]
        self.mems = [[int(w) for w in m] for _, m in clusters]
        self.utils = [self.ev.single(m, t)[0] for t, m in zip(self.tops, self.mems, strict=True)]
        #: how often each cluster's members changed; ``settled[(c, d)]`` the two counts when
        #: :meth:`swap_pair` last found no swap between c and d. A pair whose clusters have
        #: not changed since finds none again (the search is deterministic in the members and
        #: utilities), so later passes skip it: splitfl's, not the paper's (issue 54; same
        #: clusters, a pass after the first costs the changed clusters' pairs only).
        self.changes = [0] * len(self.tops)
        self.settled: dict[tuple[int, int], tuple[int, int]] = {}
        self.joined: dict[tuple[int, int], tuple[int, float, bool]] = {}  # (d, w): :meth:`_with`

    def _changed(self, *clusters: int) -> None:
        for c in clusters:
            self.changes[c] += 1

    def swap_pair(self, c: int, d: int) -> bool:
        """First-improvement swaps of bottom workers i ∈ c, j ∈ d (in list order) that lower
        ``U_c + U_d`` by more than ``IMPROVE_TOL`` and keep both clusters within Eq. (8)/(10)."""
        ev, tops, utils = self.ev, self.tops, self.utils
        mc, md = self.mems[c], self.mems[d]
        changed = False
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
                self._changed(c, d)
                changed = True
                q += h + 1
        return changed

    def swaps(self) -> bool:
        """One sweep of :meth:`swap_pair` over the cluster pairs c < d, but those settled and
        unchanged since (:attr:`settled`); True if any swap."""
        changed = False
        n_c, counts = len(self.tops), self.changes
        for c in range(n_c):
            for d in range(c + 1, n_c):
                if self.settled.get((c, d)) == (counts[c], counts[d]):
                    continue
                if self.swap_pair(c, d):
                    changed = True
                else:
                    self.settled[(c, d)] = (counts[c], counts[d])
        return changed

    def best_move(self, c: int, w: int, uc: float) -> tuple[float, int, float] | None:
        """``(gain, d, U_d)`` of the cluster d ≠ c whose taking ``w`` lowers ``U_c + U_d``
        most (ties: lower index) within Eq. (8)/(10), ``uc`` being c's utility without w."""
        best: tuple[float, int, float] | None = None
        for d in range(len(self.tops)):
            if d == c:
                continue
            ud, okd = self._with(d, w)
            gain = self.utils[c] + self.utils[d] - uc - ud
            if gain <= IMPROVE_TOL or (best is not None and gain <= best[0]):
                continue
            if okd:
                best = (gain, d, ud)
        return best

    def _with(self, d: int, w: int) -> tuple[float, bool]:
        """Cluster d's utility and Eq. (8)/(10) check with ``w`` added, kept while d stays
        unchanged (:attr:`changes`): a moves sweep asks each cluster about every worker, and
        a later sweep asks the unchanged clusters the same again (same values). At most one
        entry per (cluster, worker): N·K, below the N² link times β the inputs hold."""
        seen = self.joined.get((d, w))
        if seen is not None and seen[0] == self.changes[d]:
            return seen[1], seen[2]
        ud, okd = self.ev.add_one(self.mems[d], self.tops[d], [w])
        self.joined[(d, w)] = (self.changes[d], float(ud[0]), bool(okd[0]))
        return float(ud[0]), bool(okd[0])

    def moves(self) -> bool:
        """One sweep of moves: every bottom worker of a cluster with ≥ 2 bottom workers goes
        to :meth:`best_move`'s cluster if its own cluster stays within Eq. (8)/(10)."""
        changed = False
        mems, utils = self.mems, self.utils
        for c in range(len(self.tops)):
            p = 0
            while p < len(mems[c]) and len(mems[c]) > 1:
                w = mems[c][p]
                new_c = mems[c][:p] + mems[c][p + 1 :]
                uc, okc = self.ev.single(new_c, self.tops[c])
                best = self.best_move(c, w, uc) if okc else None
                if best is None:
                    p += 1
                    continue
                _, d, ud = best
                mems[c] = new_c
                mems[d] = mems[d] + [w]
                utils[c], utils[d] = uc, ud
                self._changed(c, d)
                changed = True
        return changed


def swap_finetune(
    clusters: Sequence[Cluster],
    inputs: ClusterInputs,
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
    than the input. Utilities are those of :func:`~.problem.cluster_utility` on the cluster
    time model. Returns new ``(top, sorted members)`` tuples; the input is not modified.
    """
    search = _Search(clusters, inputs)
    for _ in range(max_passes):
        changed = search.swaps()
        if allow_moves and search.moves():
            changed = True
        if not changed:
            break
    return [(t, sorted(m)) for t, m in zip(search.tops, search.mems, strict=True)]
