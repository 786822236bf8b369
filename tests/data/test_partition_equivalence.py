"""The vectorised partitioners (issue 54) give exactly the parts the item-by-item ones gave
(``tests/partition_reference.py``, the code before): same seeds, same samples, same order."""

from __future__ import annotations

import numpy as np
import pytest

import partition_reference as before
from splitfl.data import partition
from splitfl.data.grouping import RankedSet


def _labels(n: int, classes: int, seed: int, skew: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if skew:  # unbalanced classes, one of them rare
        p = np.linspace(1.0, 8.0, classes)
        return rng.choice(classes, size=n, p=p / p.sum())
    return rng.integers(classes, size=n)


def _same(new: list[np.ndarray], old: list[np.ndarray]) -> None:
    assert len(new) == len(old)
    for a, b in zip(new, old, strict=True):
        assert a.dtype == np.int64 and b.dtype == np.int64
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize(("n", "clients"), [(1000, 10), (997, 33), (50, 50)])
def test_iid_equals_the_reference(seed, n, clients):
    labels = _labels(n, 10, seed)
    new = partition.iid(labels, clients, np.random.default_rng(seed))
    _same(new, before.iid(labels, clients, np.random.default_rng(seed)))


@pytest.mark.parametrize("seed", [0, 3, 11])
@pytest.mark.parametrize(
    ("alpha", "cap", "minimum"), [(0.5, False, 1), (0.1, True, 2), (5.0, False, 4)]
)
def test_dirichlet_equals_the_reference(seed, alpha, cap, minimum):
    labels = _labels(2000, 10, seed, skew=True)
    kw = {"alpha": alpha, "cap": cap, "min_samples": minimum}
    new = partition.dirichlet(labels, 40, np.random.default_rng(seed), **kw)
    _same(new, before.dirichlet(labels, 40, np.random.default_rng(seed), **kw))


@pytest.mark.parametrize("seed", [0, 5, 9])
@pytest.mark.parametrize("minimum", [3, 5])
def test_dirichlet_top_up_equals_the_reference(monkeypatch, seed, minimum):
    """Tiny alpha and one attempt: the last-resort top-up runs (donors that took samples
    themselves included: every client ends near ``min_samples``)."""
    monkeypatch.setattr(partition, "MAX_DIRICHLET_ATTEMPTS", 1)
    monkeypatch.setattr(before, "MAX_DIRICHLET_ATTEMPTS", 1)
    labels = _labels(30 * minimum + 7, 5, seed)
    kw = {"alpha": 0.01, "min_samples": minimum}
    new = partition.dirichlet(labels, 30, np.random.default_rng(seed), **kw)
    old = before.dirichlet(labels, 30, np.random.default_rng(seed), **kw)
    _same(new, old)
    assert min(len(p) for p in new) >= minimum


def test_top_up_refuses_too_few_samples():
    """A hand case the reference ends with a client short: 6 samples cannot give 3 clients
    3 each (:func:`partition.dirichlet` checks this first; the top-up says so itself)."""
    parts = [np.array([0, 1]), np.array([2]), np.array([3, 4, 5])]
    with pytest.raises(ValueError, match="6 samples cannot give 3 clients 3"):
        partition._top_up(parts, 3, np.random.default_rng(0))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("minimum", [1, 2, 5])
def test_top_up_moves_equal_the_one_by_one_reference(seed, minimum):
    """Random sizes with many equal ones (ties broken by the lowest id) and many short
    clients: the moves computed at once give the reference's parts (argmax per move)."""
    rng = np.random.default_rng(seed)
    sizes = rng.choice([0, 0, 1, minimum, minimum + 1, minimum + 3, 3 * minimum + 4], 60)
    sizes[0] = 60 * minimum  # enough samples for everyone
    parts = np.split(rng.permutation(int(sizes.sum())), np.cumsum(sizes)[:-1])
    new = partition.grouped(
        *partition._top_up([p.copy() for p in parts], minimum, np.random.default_rng(seed)), 60
    )
    old = before._top_up([p.copy() for p in parts], minimum, np.random.default_rng(seed))
    _same(new, [np.sort(p) for p in old])
    assert min(len(p) for p in new) >= minimum


def _calls_during(fn) -> int:
    """Python and C function calls made while ``fn`` runs (``sys.setprofile``)."""
    import sys

    calls = [0]

    def count(frame, event, arg):
        if event in ("call", "c_call"):
            calls[0] += 1

    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls[0]


def test_top_up_work_does_not_grow_with_the_moves():
    """Issue 54 (10⁶ clients, ~350,000 moves took ~3 s through a heap): the same 2,001
    parts with 1 short client or 1,000 short ones cost the same number of calls — the
    moves are computed in numpy at once, not one heap pop and push per move."""
    big = np.arange(5000, dtype=np.int64)

    def parts(short: int) -> list[np.ndarray]:
        ones = [np.array([5000 + i]) for i in range(2000 - short)]
        return [big, *ones, *[np.zeros(0, dtype=np.int64)] * short]

    few = _calls_during(lambda: partition._top_up(parts(1), 1, np.random.default_rng(0)))
    many = _calls_during(lambda: partition._top_up(parts(1000), 1, np.random.default_rng(0)))
    assert many - few < 50, (few, many)


@pytest.mark.parametrize("seed", [0, 2, 4])
@pytest.mark.parametrize(("clients", "k", "classes"), [(20, 2, 10), (50, 3, 10), (30, 3, 6)])
def test_shards_equal_the_reference(seed, clients, k, classes):
    labels = _labels(1200 + seed, classes, seed, skew=True)
    kw = {"classes_per_client": k}
    new = partition.shards(labels, clients, np.random.default_rng(seed), **kw)
    _same(new, before.shards(labels, clients, np.random.default_rng(seed), **kw))


@pytest.mark.parametrize("seed", [0, 6])
def test_natural_and_folders_equal_the_reference(seed):
    rng = np.random.default_rng(seed)
    writers = rng.integers(0, 60, size=3000) * 7  # sparse writer ids
    labels = _labels(3000, 10, seed)
    kw = {"writers": writers, "min_samples": 30}
    new = partition.natural(labels, 25, np.random.default_rng(seed), **kw)
    _same(new, before.natural(labels, 25, np.random.default_rng(seed), **kw))
    folders = np.unique(writers, return_inverse=True)[1]
    _same(partition.folders(folders, 60), before.folders(folders, 60))


@pytest.mark.parametrize("seed", [0, 1])
def test_label_histograms_equal_the_reference(seed):
    labels = _labels(500, 7, seed)
    parts = partition.dirichlet(labels, 12, np.random.default_rng(seed), alpha=0.3)
    np.testing.assert_array_equal(
        partition.label_histograms(labels, parts, 7), before.label_histograms(labels, parts, 7)
    )
    np.testing.assert_array_equal(  # fewer classes counted than the labels hold
        partition.label_histograms(labels, parts, 5), before.label_histograms(labels, parts, 5)
    )


def test_ranked_set_picks_the_rth_smallest_member():
    members = np.array([3, 4, 9, 15])
    ranked = RankedSet(17, members)
    assert [ranked.kth(r) for r in range(4)] == [3, 4, 9, 15]
    ranked.set(4, False)
    ranked.set(0, True)
    ranked.set(16, True)
    assert len(ranked) == 5
    assert [ranked.kth(r) for r in range(5)] == [0, 3, 9, 15, 16]


def test_partitioning_many_clients_scales_with_the_samples():
    """200,000 clients of 2 samples each: the reference's per-client passes are O(n·N) (and
    its top-up O(N²)); the vectorised ones finish this in well under a second."""
    labels = _labels(400_000, 10, 0)
    parts = partition.iid(labels, 200_000, np.random.default_rng(0))
    assert len(parts) == 200_000 and sum(len(p) for p in parts) == 400_000
    writers = np.arange(400_000) // 2
    assert len(partition.folders(writers, 200_000)) == 200_000


def test_a_shards_label_is_its_most_frequent_the_smaller_among_equals():
    """``np.bincount(labels).argmax()`` per shard: shard 0 holds 1, 1, 2, 2 (a tie: 1),
    shard 1 holds 0, 3, 3 (3), shard 2 holds 4 alone."""
    shard_of = np.array([0, 0, 0, 0, 1, 1, 1, 2])
    labels = np.array([1, 1, 2, 2, 0, 3, 3, 4])
    assert partition._shard_modes(shard_of, labels, 3).tolist() == [1, 3, 4]


def test_dirichlet_stops_redrawing_after_a_hopeless_draw(monkeypatch):
    """One sample a client on average (issue 54): a draw leaving ``HOPELESS_SHORT_CLIENTS``
    or more clients short ends the redraws, so one draw and the top-up — not
    ``MAX_DIRICHLET_ATTEMPTS`` draws that all fail — and every client still gets a sample."""
    draws = []
    real = partition._dirichlet_draw
    monkeypatch.setattr(partition, "_dirichlet_draw", lambda *a: draws.append(1) or real(*a))
    labels = _labels(3000, 10, 0)
    parts = partition.dirichlet(labels, 2000, np.random.default_rng(0), alpha=0.5)
    assert len(draws) == 1
    assert min(len(p) for p in parts) >= 1
    assert sorted(np.concatenate(parts).tolist()) == list(range(3000))


def test_top_up_shuffles_only_parts_of_two_or_more():
    """A million clients of about one sample (issue 54): ``rng.permutation`` of a part of 0 or
    1 samples draws nothing and returns it, so the top-up skips those calls — one call here,
    not three — and the parts are the reference's."""

    class Counting:
        def __init__(self):
            self.rng, self.calls = np.random.default_rng(0), 0

        def permutation(self, p):
            self.calls += 1
            return self.rng.permutation(p)

    parts = [np.array([0]), np.zeros(0, dtype=np.int64), np.array([1, 2, 3, 4])]
    counting = Counting()
    new = partition.grouped(*partition._top_up(parts, 1, counting), 3)
    old = before._top_up(parts, 1, np.random.default_rng(0))
    assert counting.calls == 1
    _same(new, [np.sort(p) for p in old])


def test_shard_swaps_call_no_numpy_per_try(monkeypatch):
    """500,000 clients (issue 54): a swap try works on the two k-long rows in plain Python,
    so ``np.unique`` runs twice (the shards' labels, the classes), not also once per try; the
    shards are the reference's."""
    labels = _labels(2000, 10, 1)
    old = before.shards(labels, 200, np.random.default_rng(1), classes_per_client=3)
    calls = []
    real = np.unique
    monkeypatch.setattr(np, "unique", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    new = partition.shards(labels, 200, np.random.default_rng(1), classes_per_client=3)
    monkeypatch.undo()
    assert len(calls) == 2
    _same(new, old)
