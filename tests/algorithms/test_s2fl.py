"""S²FL mechanisms on hand-made inputs: §3.1 cut selection, §3.2 grouping, Algorithm 1."""

import itertools

import numpy as np
import pytest
import torch

from splitfl.aggregation.layerwise import layerwise_aggregate
from splitfl.algorithms.s2fl import closest_to_median
from splitfl.algorithms.s2fl.data_balance import (
    _distances,
    _swap_search,
    balance_distance,
    balanced_groups,
    count_partitions,
    enumerate_partitions,
    group_sizes,
    partition_cost,
)
from splitfl.core.plan import ClientUpdate


def test_closest_to_median_on_crafted_table():
    # Prepare: 3 devices x 3 cuts; entries sorted: 2,3,4,5,6,7,8,9,12 -> median 6
    table = {
        0: {1: 2.0, 2: 3.0, 3: 4.0},  # fast device: largest part (closest 4)
        1: {1: 5.0, 2: 6.0, 3: 7.0},  # mid device: middle part
        2: {1: 8.0, 2: 9.0, 3: 12.0},  # slow device: smallest part
    }
    choice, median = closest_to_median(table)
    assert median == 6.0
    assert choice == {0: 3, 1: 2, 2: 1}


def test_closest_to_median_even_count_and_ties_go_to_smaller_cut():
    table = {0: {1: 1.0, 2: 3.0}, 1: {1: 5.0, 2: 7.0}}  # median (3+5)/2 = 4
    choice, median = closest_to_median(table)
    assert median == 4.0
    assert choice == {0: 2, 1: 1}
    choice, _ = closest_to_median({0: {1: 3.0, 2: 5.0}})  # median 4, tie 3 vs 5
    assert choice == {0: 1}


def test_eq2_distance_by_hand():
    hist = np.array([[3, 1], [1, 3]])
    assert balance_distance(hist) == 0.0  # combined 4:4 is uniform
    # single client 3:1 -> (0.75-0.5)^2 + (0.25-0.5)^2 = 0.125
    assert balance_distance(hist[:1]) == pytest.approx(np.sqrt(0.125))


def test_group_sizes_and_partition_count():
    assert group_sizes(10, 3) == [4, 3, 3]
    assert count_partitions(10, 2) == 126
    assert count_partitions(10, 5) == 945
    parts = list(enumerate_partitions(list(range(7)), group_sizes(7, 3)))
    assert len(parts) == count_partitions(7, 3) == 105
    assert len({tuple(sorted(map(tuple, p))) for p in parts}) == 105  # each once


def _brute_force(hist, num_groups):
    n = len(hist)
    best = np.inf
    for labels in itertools.product(range(num_groups), repeat=n):
        sizes = sorted(labels.count(g) for g in range(num_groups))
        if sizes != sorted(group_sizes(n, num_groups)):
            continue
        groups = [[i for i in range(n) if labels[i] == g] for g in range(num_groups)]
        best = min(best, partition_cost(hist, groups))
    return best


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n,g", [(6, 2), (7, 3), (8, 4)])
def test_grouping_exact_and_heuristic_find_the_optimum(seed, n, g):
    rng = np.random.default_rng(seed)
    hist = rng.integers(0, 20, size=(n, 4)) * (rng.random((n, 4)) < 0.5)
    hist[:, 0] += 1
    optimum = _brute_force(hist, g)
    exact, was_exact = balanced_groups(hist, g, np.random.default_rng(0))
    assert was_exact and partition_cost(hist, exact) == pytest.approx(optimum)
    heur, was_exact = balanced_groups(hist, g, np.random.default_rng(0), exact_limit=1, restarts=8)
    assert not was_exact and partition_cost(hist, heur) == pytest.approx(optimum)
    assert sorted(i for grp in heur for i in grp) == list(range(n))


def test_grouping_pairs_complementary_clients():
    # clients 0/1 hold only class A/B, 2/3 only C/D: balanced pairs are {0,1},{2,3}
    hist = np.array([[10, 0, 0, 0], [0, 10, 0, 0], [0, 0, 10, 0], [0, 0, 0, 10]])
    groups, _ = balanced_groups(hist, 2, np.random.default_rng(0))
    # every 2+2 split gives 2 classes per group; equal cost -> any; check cost equals optimum
    assert partition_cost(hist, groups) == pytest.approx(_brute_force(hist, 2))
    hist3 = np.array([[10, 0], [0, 10], [9, 1], [1, 9]])
    groups, _ = balanced_groups(hist3, 2, np.random.default_rng(0))
    assert partition_cost(hist3, groups) == pytest.approx(0.0)


def _full_scan_swaps(hist, groups):
    """The swap search as first written (every pair of groups scored exactly every step): the
    oracle the incremental search must reproduce exactly, ties included."""
    hist = np.asarray(hist, dtype=np.float64)
    sums = np.stack([hist[g].sum(axis=0) for g in groups])
    dists = _distances(sums)
    cost = float(dists.sum())
    while True:
        best, move = cost, None
        for a, b in itertools.combinations(range(len(groups)), 2):
            delta = hist[groups[b]][None, :, :] - hist[groups[a]][:, None, :]
            new = cost - dists[a] - dists[b] + _distances(sums[a] + delta)
            new = new + _distances(sums[b] - delta)
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


def _random_start(n, num_groups, seed):
    order = np.random.default_rng(seed).permutation(n)
    cuts = np.cumsum([0, *group_sizes(n, num_groups)])
    return [[int(i) for i in order[cuts[g] : cuts[g + 1]]] for g in range(num_groups)]


def _histograms(kind, n, classes, rng):
    if kind == "dirichlet":  # label counts as a Dirichlet(0.5) partition deals them
        return np.stack([rng.multinomial(600, rng.dirichlet([0.5] * classes)) for _ in range(n)])
    if kind == "one_sample":  # every client one sample: one-hot rows, ties everywhere
        return np.eye(classes, dtype=np.int64)[rng.integers(0, classes, n)]
    if kind == "repeated":  # a few distinct rows: exact ties between pairs of groups
        return rng.integers(0, 6, (3, classes))[rng.integers(0, 3, n)]
    return rng.dirichlet([0.5] * classes, n)  # shares, not counts: no integer shortcut


@pytest.mark.parametrize("kind", ["dirichlet", "one_sample", "repeated", "shares"])
@pytest.mark.parametrize("n,num_groups", [(10, 2), (23, 5), (40, 8)])
def test_swap_search_reproduces_the_full_scan(kind, n, num_groups):
    # Prepare
    hist = _histograms(kind, n, 10, np.random.default_rng(n))
    for seed in range(3):
        start = _random_start(n, num_groups, seed)
        # Execute
        expected = _full_scan_swaps(hist, [list(g) for g in start])
        got = _swap_search(hist, [list(g) for g in start])
        # Assert: the same swaps, so the same groups (member order included) and cost bits
        assert got == expected


def test_grouping_at_the_papers_size_is_unchanged():
    # Prepare: S²FL's warm-up groups all 100 devices (20 groups of 5); the round's 10 selected
    # devices (2 groups) are enumerated exactly. The reference: restarts as balanced_groups
    # draws them, each improved by the full scan.
    hist = _histograms("dirichlet", 100, 10, np.random.default_rng(7))
    rng, best = np.random.default_rng(0), (np.inf, None)
    for _ in range(2):
        order = rng.permutation(100)
        cost, groups = _full_scan_swaps(
            hist, [[int(i) for i in order[k : k + 5]] for k in range(0, 100, 5)]
        )
        best = (cost, groups) if cost < best[0] - 1e-12 else best
    expected = sorted((sorted(g) for g in best[1]), key=lambda g: g[0])
    # Execute
    groups, exact = balanced_groups(hist, 20, np.random.default_rng(0), restarts=2)
    ten, ten_exact = balanced_groups(hist[:10], 2, np.random.default_rng(0))
    # Assert
    assert not exact and groups == expected
    assert ten_exact and ten == _brute_force_groups(hist[:10], 2)


def _brute_force_groups(hist, num_groups):
    """Groups of the first optimal partition in :func:`enumerate_partitions` order."""
    best = min(
        enumerate_partitions(list(range(len(hist))), group_sizes(len(hist), num_groups)),
        key=lambda p: partition_cost(hist, p),
    )
    return sorted((sorted(g) for g in best), key=lambda g: g[0])


def _update(client, cut, group, value):
    state = {f"blocks.{b}.w": torch.full((2,), float(value)) for b in range(cut)}
    return ClientUpdate(client, cut, group, samples=1, steps=1, state=state, loss_sum=0.0)


def test_algorithm1_layerwise_aggregation_by_hand():
    # Prepare: 3 blocks; client 0 (|D|=1) cut 1 group 0; client 1 (|D|=3) cut 2 group 0;
    # client 2 (|D|=4) cut 3 (whole model).
    global_state = {f"blocks.{b}.w": torch.zeros(2) for b in range(3)}
    updates = [_update(0, 1, 0, 1.0), _update(1, 2, 0, 2.0), _update(2, 3, 1, 3.0)]
    server = {0: {f"blocks.{b}.w": torch.full((2,), 10.0 + b) for b in range(1, 3)}}
    weights = {0: 1.0, 1: 3.0, 2: 4.0}
    # Execute
    out = layerwise_aggregate(global_state, updates, server, weights)
    # Assert: block 0 from all devices; block 1: client 0 uses its group's server copy (11)
    assert torch.allclose(out["blocks.0.w"], torch.full((2,), (1 * 1 + 3 * 2 + 4 * 3) / 8))
    assert torch.allclose(out["blocks.1.w"], torch.full((2,), (1 * 11 + 3 * 2 + 4 * 3) / 8))
    assert torch.allclose(out["blocks.2.w"], torch.full((2,), (1 * 12 + 3 * 12 + 4 * 3) / 8))


def test_aggregation_rounds_integer_buffers():
    g = {"blocks.0.num_batches_tracked": torch.tensor(0)}
    ups = [
        ClientUpdate(0, 1, 0, 1, 1, {"blocks.0.num_batches_tracked": torch.tensor(3)}, 0.0),
        ClientUpdate(1, 1, 1, 1, 1, {"blocks.0.num_batches_tracked": torch.tensor(4)}, 0.0),
    ]
    out = layerwise_aggregate(g, ups, {}, {0: 1.0, 1: 1.0})
    assert out["blocks.0.num_batches_tracked"].dtype == torch.int64
    assert int(out["blocks.0.num_batches_tracked"]) == 4  # round(3.5) half-to-even -> 4
