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


def _swap_search(hist: np.ndarray, groups: list[list[int]]) -> tuple[float, list[list[int]]]:
    """Best-improvement pairwise swaps between groups until no swap helps."""
    cost = partition_cost(hist, groups)
    improved = True
    while improved:
        improved = False
        best = (cost, None)
        for a, b in itertools.combinations(range(len(groups)), 2):
            for i, j in itertools.product(range(len(groups[a])), range(len(groups[b]))):
                ga, gb = list(groups[a]), list(groups[b])
                ga[i], gb[j] = gb[j], ga[i]
                new = cost - partition_cost(hist, [groups[a], groups[b]])
                new += partition_cost(hist, [ga, gb])
                if new < best[0] - 1e-12:
                    best = (new, (a, b, ga, gb))
        if best[1] is not None:
            a, b, ga, gb = best[1]
            groups[a], groups[b] = ga, gb
            cost = best[0]
            improved = True
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
