"""S²FL §3.2 data balance-based grouping: partition devices to minimise Eq. (2).

Eq. (2): for a group G, ``Dist(G) = || (Σ_{c∈G} D_c) / (Σ_{c∈G} |D_c|) − 1/n ||_2`` — the L2
distance of the group's combined label distribution from uniform. The paper does not fix the
number or the size of the groups, so splitfl asks for ``num_groups`` groups whose sizes differ
by at most one (without a size constraint, one large group and singletons would be favoured),
and minimises the *sum* of the groups' distances.

Search: exact enumeration of every balanced partition when there are at most ``exact_limit``
of them (e.g. 126 for 10 devices in 2 groups, 945 for 10 in 5 pairs); otherwise a heuristic —
random balanced starts (from the run's seed) improved by pairwise swaps between groups until no
swap lowers the objective; the best of ``restarts`` local optima is returned. Each step makes
the best swap of all pairs of groups. A table holds every pair's best swap, scored from dot
products; a swap changes two groups, so a step rescores O(G) pairs instead of all O(G²), and
only the few pairs the table cannot rule out are scored exactly, so the swaps (ties included)
are those of rescoring every pair exactly every step.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np


def balance_distance(histograms: np.ndarray) -> float:
    """Eq. (2) for one group given its members' label histograms ``[members, classes]``."""
    counts = np.asarray(histograms, dtype=np.float64).sum(axis=0)
    total = counts.sum()
    if total == 0:
        return 0.0
    return float(np.sqrt(np.sum((counts / total - 1.0 / counts.shape[0]) ** 2)))


def partition_cost(histograms: np.ndarray, groups: Sequence[Sequence[int]]) -> float:
    """Sum of Eq. (2) over the groups (indices into ``histograms``)."""
    return sum(balance_distance(histograms[list(g)]) for g in groups)


def group_sizes(n: int, num_groups: int) -> list[int]:
    """Sizes of ``num_groups`` groups over ``n`` members, differing by at most one."""
    base, extra = divmod(n, num_groups)
    return [base + 1] * extra + [base] * (num_groups - extra)


def count_partitions(n: int, num_groups: int) -> int:
    """Number of distinct balanced partitions of ``n`` members into ``num_groups`` groups."""
    sizes = group_sizes(n, num_groups)
    count = math.factorial(n)
    for s in sizes:
        count //= math.factorial(s)
    for s in set(sizes):
        count //= math.factorial(sizes.count(s))
    return count


def enumerate_partitions(members: Sequence[int], sizes: Sequence[int]) -> Iterator[list[tuple]]:
    """Every partition of ``members`` into groups with the given size multiset, once each."""
    if not members:
        yield []
        return
    first, rest = members[0], members[1:]
    for size in sorted(set(sizes)):
        remaining = list(sizes)
        remaining.remove(size)
        for others in itertools.combinations(rest, size - 1):
            group = (first, *others)
            left = [m for m in rest if m not in others]
            for tail in enumerate_partitions(left, remaining):
                yield [group, *tail]


def _distances(counts: np.ndarray) -> np.ndarray:
    """Eq. (2) for many groups at once from their summed histograms ``[..., classes]``."""
    total = counts.sum(axis=-1, keepdims=True)
    share = np.divide(counts, total, out=np.zeros_like(counts), where=total > 0)
    dist = np.sqrt(np.sum((share - 1.0 / counts.shape[-1]) ** 2, axis=-1))
    return np.where(total[..., 0] > 0, dist, 0.0)


#: A swap must lower the objective by more than this to be made.
_TOL = 1e-12
#: Most pairs of groups scored exactly in one batch (bounds the memory of :func:`_swap_costs`).
_CHUNK = 1024
#: Integer arithmetic in doubles is exact below this.
_EXACT_INTS = 2.0**53


def _swap_costs(
    hist: np.ndarray,
    members: np.ndarray,
    sums: np.ndarray,
    dists: np.ndarray,
    cost: float,
    pairs: np.ndarray,
) -> np.ndarray:
    """The objective after swapping i ∈ a with j ∈ b, ``[pair, i, j]``, for pairs ``(a, b)``.

    The swap moves ``h_j − h_i`` into a and out of b. Every entry is computed by the same
    floating-point operations, in the same order, whatever the batch (entries past a group's
    end, ``members`` padding, are to be ignored).
    """
    a, b = pairs[:, 0], pairs[:, 1]
    delta = hist[members[b]][:, None, :, :] - hist[members[a]][:, :, None, :]  # [K, i, j, C]
    return (
        ((cost - dists[a]) - dists[b])[:, None, None]
        + _distances(sums[a][:, None, None, :] + delta)
        + _distances(sums[b][:, None, None, :] - delta)
    )


def _distance_from_norms(square: np.ndarray, total: np.ndarray, classes: int) -> np.ndarray:
    """Eq. (2) from ``|Z|²`` and ``T`` of a group, ``Z = C·S − T`` (S its summed histogram):
    ``‖S/T − 1/C‖ = |Z| / (C·T)``."""
    safe = np.where(total > 0, total, 1.0)
    return np.where(total > 0, np.sqrt(np.maximum(square, 0.0)) / (classes * safe), 0.0)


class _SwapTable:
    """The best swap between every pair of groups (its change of Σ Eq. (2)), kept up to date.

    With ``z_c = C·h_c − t_c`` per client (``t_c`` its sample count) and ``Z = Σ z_c`` per group,
    swapping i ∈ x with j ∈ y gives x ``|Z_x + z_j − z_i|² = |Z_x|² + |z_j − z_i|² +
    2 Z_x·(z_j − z_i)``: every swap of a pair of groups is scored from dot products, exactly for
    integer counts. A swap changes two groups, so only their rows of the table are recomputed.
    """

    def __init__(self, hist: np.ndarray, groups: list[list[int]], dists: np.ndarray):
        self.dists, self.classes = dists, hist.shape[1]
        self.totals = hist.sum(axis=1)
        self.z = self.classes * hist - self.totals[:, None]
        self.norms = (self.z**2).sum(axis=1)
        width = max(len(g) for g in groups)
        self.members = np.zeros((len(groups), width), dtype=np.int64)
        self.real = np.zeros((len(groups), width), dtype=bool)
        for g, group in enumerate(groups):
            self.members[g, : len(group)] = group
            self.real[g, : len(group)] = True
        self.sums = np.zeros((len(groups), self.classes))  # Z per group
        self.own = np.zeros(len(hist))  # z_c · Z of c's group
        self.square, self.total = np.zeros(len(groups)), np.zeros(len(groups))
        self._update_sums(list(range(len(groups))))
        self.changes = np.stack([self._row(x) for x in range(len(groups))])
        count = len(groups)
        #: ``upper[x]``: the least entry of row x right of the diagonal, ``changes[x, x+1:]``.
        self.upper = np.where(np.tri(count, dtype=bool), np.inf, self.changes).min(axis=1)
        #: Entries of ``changes`` and ``upper`` read since the table was built (work, for tests).
        self.scanned = 0
        #: Every dot product of a pair's scoring involves the members of two groups at most
        #: (``z_i·z_j``, ``Z_x·z_j``, ``|Z_x + z_j − z_i|²``), so the samples of the ``2 ×
        #: width`` largest clients bound them, not the whole federation's: a FEMNIST-sized
        #: warm-up (issue 54: past 2⁵³ with all samples, 100× slower) stays exact.
        involved = float(np.sort(self.totals)[::-1][: 2 * width].sum())
        scale = 16 * (self.classes * involved) ** 2
        self.integral = bool(np.all(hist == np.round(hist))) and scale < _EXACT_INTS

    def error_bound(self, cost: float) -> float:
        """How far an entry may be from the exact change (:func:`_swap_costs` − ``cost``).

        With integer counts the dot products are exact and the two differ by rounding only:
        a few ulps of each distance (≤ (C/2 + 5)·ε each for Eq. (2) computed per class) and
        half an ulp of ``cost`` per addition. Otherwise no bound is claimed (``inf``: every
        improving pair is scored exactly).
        """
        if not self.integral:
            return math.inf
        eps = float(np.finfo(np.float64).eps)
        return eps * (4 * (abs(cost) + 4) + 2 * self.classes + 24)

    def _update_sums(self, changed: list[int]) -> None:
        for g in changed:
            members = self.members[g][self.real[g]]
            self.sums[g] = self.z[members].sum(axis=0)
            self.square[g], self.total[g] = self.sums[g] @ self.sums[g], self.totals[members].sum()
            self.own[members] = self.z[members] @ self.sums[g]

    def _row(self, x: int) -> np.ndarray:
        """Best change of the objective by a swap between group ``x`` and each group."""
        i, j = self.members[x], self.members  # [w], [G, w]
        zi = self.z[i]
        cross = (zi @ self.z.T)[:, j].transpose(1, 0, 2)  # z_i·z_j [G, w_i, w_j]
        moved = self.norms[i][None, :, None] + self.norms[j][:, None, :] - 2 * cross
        to_x = self.z @ self.sums[x]
        into_x = to_x[j][:, None, :] - to_x[i][None, :, None]  # Z_x·(z_j − z_i)
        into_y = (zi @ self.sums.T).T[:, :, None] - self.own[j][:, None, :]  # Z_y·(z_i − z_j)
        shift = self.totals[j][:, None, :] - self.totals[i][None, :, None]
        new_x = self.square[x] + moved + 2 * into_x
        new_y = self.square[:, None, None] + moved + 2 * into_y
        change = (
            _distance_from_norms(new_x, self.total[x] + shift, self.classes)
            + _distance_from_norms(new_y, self.total[:, None, None] - shift, self.classes)
            - (self.dists[x] + self.dists[:, None, None])
        )
        change = np.where(self.real[x][None, :, None] & self.real[:, None, :], change, np.inf)
        best = change.reshape(len(j), -1).min(axis=1)
        best[x] = np.inf
        return best

    def swap(self, a: int, b: int, i: int, j: int) -> None:
        """Member i of group a and member j of group b change places (``dists`` is current)."""
        self.members[a, i], self.members[b, j] = self.members[b, j], self.members[a, i]
        self._update_sums([a, b])
        before = self.changes[:, [a, b]].copy()
        for g in (a, b):
            self.changes[g] = self.changes[:, g] = self._row(g)
        self._update_upper((a, b), before)

    def _update_upper(self, changed: tuple[int, int], before: np.ndarray) -> None:
        """Keep :attr:`upper` after the rows and columns ``changed`` were recomputed
        (``before``: their columns as they were), in O(G): a row's least entry is lowered by a
        new entry below it, and only a row whose least entry was one that rose is rescanned."""
        count = len(self.upper)
        stale = np.zeros(count, dtype=bool)
        stale[list(changed)] = True
        for k, g in enumerate(changed):
            old, new = before[:g, k], self.changes[:g, g]
            stale[:g] |= (old == self.upper[:g]) & (new > old)
            self.upper[:g] = np.minimum(self.upper[:g], new)
        for x in np.flatnonzero(stale).tolist():
            self.upper[x] = self.changes[x, x + 1 :].min(initial=np.inf)
            self.scanned += count - x - 1
        self.scanned += 4 * count


def _best_swap(
    hist: np.ndarray, table: _SwapTable, sums: np.ndarray, cost: float
) -> tuple[float, tuple[int, int, int, int] | None]:
    """The swap of a full scan: pairs ``a < b`` in order, a pair's best swap (the first on ties)
    taken when it lowers the best objective so far by more than :data:`_TOL`.

    Only pairs whose table entry could pass that test are scored exactly: an entry is within
    ``slack`` of the exact change, so a pair whose entry is at or above
    ``best − cost − _TOL + slack`` cannot be taken. Rows are visited in order and only while
    their least entry (:attr:`_SwapTable.upper`) is under that bound, so a step reads O(G)
    entries and the rows it scores, not the G × G table. The first few pairs scored lower
    ``best``, which rules out most of the others.
    """
    slack, count = table.error_bound(cost), len(table.changes)
    rows = np.flatnonzero(table.upper < slack - _TOL)
    table.scanned += count
    best, move, take = cost, None, 1
    while len(rows):
        rows = rows[table.upper[rows] < best - cost - _TOL + slack]
        table.scanned += len(rows)
        if not len(rows):
            break
        a, rows = int(rows[0]), rows[1:]
        cols = a + 1 + np.flatnonzero(table.changes[a, a + 1 :] < slack - _TOL)
        table.scanned += count - a - 1
        while len(cols):
            cols = cols[table.changes[a, cols] < best - cost - _TOL + slack]
            batch, cols = cols[:take], cols[take:]
            if len(batch):
                best, move = _score_pairs(hist, table, sums, cost, a, batch, best, move)
            take = min(2 * take, _CHUNK)
    return best, move


def _score_pairs(
    hist: np.ndarray,
    table: _SwapTable,
    sums: np.ndarray,
    cost: float,
    a: int,
    cols: np.ndarray,
    best: float,
    move: tuple[int, int, int, int] | None,
) -> tuple[float, tuple[int, int, int, int] | None]:
    """Score the pairs ``(a, b)``, ``b`` in ``cols`` (in order), exactly; a pair's best swap
    (the first on ties) is taken when it lowers ``best`` by more than :data:`_TOL`."""
    width = table.members.shape[1]
    pairs = np.stack([np.full(len(cols), a), cols], axis=1)
    new = _swap_costs(hist, table.members, sums, table.dists, cost, pairs)
    real = table.real[pairs[:, 0]][:, :, None] & table.real[pairs[:, 1]][:, None, :]
    new = np.where(real, new, np.inf).reshape(len(pairs), -1)
    first = new.argmin(axis=1)
    for k, value in enumerate(new[np.arange(len(pairs)), first].tolist()):
        if value < best - _TOL:
            i, j = divmod(int(first[k]), width)
            best, move = value, (a, int(pairs[k, 1]), i, j)
    return best, move


def _swap_search(hist: np.ndarray, groups: list[list[int]]) -> tuple[float, list[list[int]]]:
    """Best-improvement pairwise swaps between groups until no swap helps.

    Each step makes the swap that lowers Σ Eq. (2) most (on ties: the first pair of groups in
    order, the first swap within it), as a scan scoring every pair exactly would; the pairs'
    best swaps are kept in a :class:`_SwapTable`, so few are scored (:func:`_best_swap`).
    """
    hist = np.asarray(hist, dtype=np.float64)
    sums = np.stack([hist[g].sum(axis=0) for g in groups])
    dists = _distances(sums)
    cost = float(dists.sum())
    table = _SwapTable(hist, groups, dists)
    while len(groups) > 1:
        best, move = _best_swap(hist, table, sums, cost)
        if move is None:
            break
        a, b, i, j = move
        groups[a][i], groups[b][j] = groups[b][j], groups[a][i]
        for g in (a, b):
            sums[g] = hist[groups[g]].sum(axis=0)
        dists[[a, b]] = _distances(sums[[a, b]])
        table.swap(a, b, i, j)
        cost = best
    return cost, groups


def balanced_groups(
    histograms: np.ndarray,
    num_groups: int,
    rng: np.random.Generator,
    exact_limit: int = 20000,
    restarts: int = 8,
) -> tuple[list[list[int]], bool]:
    """Partition rows of ``histograms`` into ``num_groups`` balanced groups minimising Σ Eq. (2).

    Returns:
        The groups (lists of row indices, each sorted, groups ordered by first member) and
        whether the search was exact.
    """
    n = histograms.shape[0]
    num_groups = max(1, min(num_groups, n))
    sizes = group_sizes(n, num_groups)
    if count_partitions(n, num_groups) <= exact_limit:
        best = min(
            enumerate_partitions(list(range(n)), sizes),
            key=lambda p: partition_cost(histograms, p),
        )
        return _canonical(best), True
    best_cost, best_groups = math.inf, None
    for _ in range(restarts):
        order = rng.permutation(n)
        start, groups = 0, []
        for s in sizes:
            groups.append([int(i) for i in order[start : start + s]])
            start += s
        cost, groups = _swap_search(histograms, groups)
        if cost < best_cost - 1e-12:
            best_cost, best_groups = cost, groups
    return _canonical(best_groups), False


def _canonical(groups: Sequence[Sequence[int]]) -> list[list[int]]:
    return sorted((sorted(int(i) for i in g) for g in groups), key=lambda g: g[0])
