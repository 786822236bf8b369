"""S²FL §3.2 data balance-based grouping: partition devices to minimise Eq. (2).

Eq. (2): for a group G, ``Dist(G) = || (Σ_{c∈G} D_c) / (Σ_{c∈G} |D_c|) − 1/n ||_2`` — the L2
distance of the group's combined label distribution from uniform. The paper does not fix the
number or the size of the groups, so splitfl asks for ``num_groups`` groups whose sizes differ
by at most one (without a size constraint, one large group and singletons would be favoured),
and minimises the *sum* of the groups' distances.

Search: exact enumeration of every balanced partition when there are at most ``exact_limit``
of them (e.g. 126 for 10 devices in 2 groups, 945 for 10 in 5 pairs); otherwise a heuristic —
random balanced starts (from the run's seed) improved by pairwise swaps between groups until no
swap lowers the objective; the best of ``restarts`` local optima is returned.
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


def _swap_search(hist: np.ndarray, groups: list[list[int]]) -> tuple[float, list[list[int]]]:
    """Best-improvement pairwise swaps between groups until no swap helps.

    Every swap of a pair of groups is scored at once from the groups' summed histograms:
    swapping i ∈ a with j ∈ b moves ``h_j − h_i`` into a and out of b.
    """
    hist = np.asarray(hist, dtype=np.float64)
    sums = np.stack([hist[g].sum(axis=0) for g in groups])
    dists = _distances(sums)
    cost = float(dists.sum())
    while True:
        best, move = cost, None
        for a, b in itertools.combinations(range(len(groups)), 2):
            delta = hist[groups[b]][None, :, :] - hist[groups[a]][:, None, :]  # [i, j, C]
            new = (
                cost
                - dists[a]
                - dists[b]
                + _distances(sums[a] + delta)
                + _distances(sums[b] - delta)
            )
            i, j = np.unravel_index(int(np.argmin(new)), new.shape)
            if new[i, j] < best - 1e-12:
                best, move = float(new[i, j]), (a, b, int(i), int(j))
        if move is None:
            return cost, groups
        a, b, i, j = move
        groups[a][i], groups[b][j] = groups[b][j], groups[a][i]
        for g in (a, b):
            sums[g] = hist[groups[g]].sum(axis=0)
        dists[[a, b]] = _distances(sums[[a, b]])
        cost = best


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
