"""Client partitioners: split a dataset's sample indices among federated clients.

Every partitioner is deterministic given its ``numpy.random.Generator``, returns disjoint,
sorted int64 index arrays (one per client) and guarantees each client ``>= min_samples``
samples, or raises :class:`ValueError` with a one-line reason.

Schemes (see :func:`partition_indices`):

* ``iid``: shuffle, then split into near-equal parts.
* ``dirichlet``: label skew. For each class, proportions ``p ~ Dir(alpha * 1)`` over the
  clients decide how that class's samples are dealt (the per-class Dirichlet scheme of
  Hsu et al. 2019 / Yurochkin et al. 2019 as used by FedMR and NIID-Bench). Small ``alpha``
  gives strong skew; large ``alpha`` approaches iid. Papers' concentration ``a`` (or ``delta``)
  is ``alpha``; where a paper states ``p = 1/delta`` the config layer converts before calling.
  Draws are repeated (at most :data:`MAX_DIRICHLET_ATTEMPTS` times) until every client has
  ``min_samples`` (a draw leaving :data:`HOPELESS_SHORT_CLIENTS` or more short ends the
  redraws); if none does, the last draw is topped up by moving random samples from the
  largest clients to the short ones (:func:`_top_up`). With ``cap=True`` a client that
  already holds ``N / num_clients`` samples gets no share of later classes (the NIID-Bench
  rule also used by FedMR, the S²FL authors' group).
* ``shards``: McMahan et al. 2017 pathological non-iid: sort by label, cut into
  ``num_clients * classes_per_client`` shards and give each client ``classes_per_client``
  shards, swapping shards between clients so that a client's shards come from distinct
  classes whenever possible (so balanced labels give exactly ``k`` classes per client; e.g.
  RingSFL's "two classes per client").
* ``natural``: one client per writer/user (``writers`` array); ``num_clients`` writers having
  ``>= min_samples`` samples are drawn with the generator (client order: ascending writer id).
* ``folders``: the data's own per-client layout (``root/clients/<id>/...``, read by
  :mod:`splitfl.data.formats`, which numbers the folders ``0..K-1`` as ``writers``): client
  ``k`` is folder ``k``; ``num_clients`` must equal ``K``. No randomness.

One concept (how samples are dealt to clients) over ~400 lines: the five schemes share the
size checks and the grouping, and Dirichlet's redraw/top-up rules sit beside the draw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from splitfl.data.grouping import (
    RankedSet,
    check_min_sizes,
    grouped,
    grouped_checked,
    split_sizes,
)

MAX_DIRICHLET_ATTEMPTS = 1000
#: A Dirichlet draw leaving at least this many clients short of ``min_samples`` ends the
#: redraws at once (the top-up then runs on it). splitfl's own choice (issue 54), not the
#: papers': the short clients of independent draws are a sum of many rare events, about
#: Poisson, so a draw with 64 short makes one with none about e^-64-unlikely — the 1000
#: redraws (each O(n + C·N)) would all fail; with 10⁶ clients they took minutes. Below 64
#: clients nothing changes.
HOPELESS_SHORT_CLIENTS = 64


def _finish(parts: list[np.ndarray], min_samples: int, scheme: str) -> list[np.ndarray]:
    """``parts`` sorted, as int64, after the ``min_samples`` check (schemes that build their
    parts one by one; the others group all samples at once, :func:`grouped`)."""
    out = [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    check_min_sizes(np.array([len(p) for p in out], dtype=np.int64), min_samples, scheme)
    return out


def _check_sizes(n: int, num_clients: int, min_samples: int, scheme: str) -> None:
    if num_clients < 1:
        raise ValueError(f"{scheme} partition: num_clients must be >= 1, got {num_clients}")
    if n < num_clients * min_samples:
        raise ValueError(
            f"{scheme} partition: {n} samples cannot give {num_clients} clients "
            f"{min_samples} samples each"
        )


def iid(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, min_samples: int = 1
) -> list[np.ndarray]:
    """Random near-equal split (sizes differ by at most one)."""
    n = len(labels)
    _check_sizes(n, num_clients, min_samples, "iid")
    perm = rng.permutation(n)
    owner = np.repeat(np.arange(num_clients), split_sizes(n, num_clients))
    return grouped_checked(perm, owner, num_clients, min_samples, "iid")


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    alpha: float,
    min_samples: int = 1,
    cap: bool = False,
) -> list[np.ndarray]:
    """Per-class ``Dir(alpha)`` label skew, redrawn until every client has ``min_samples``
    (not after a draw leaving :data:`HOPELESS_SHORT_CLIENTS` short: the top-up then).

    ``cap``: skip clients already holding ``N / num_clients`` samples when dealing a class.
    """
    if not alpha > 0:
        raise ValueError(f"dirichlet partition: alpha must be > 0, got {alpha}")
    labels = np.asarray(labels)
    _check_sizes(len(labels), num_clients, min_samples, "dirichlet")
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(MAX_DIRICHLET_ATTEMPTS):
        draw = _dirichlet_draw(by_class, num_clients, rng, alpha, cap, len(labels))
        short = int(np.count_nonzero(draw.held < min_samples))
        if short == 0:
            return grouped_checked(*draw.owners(), num_clients, min_samples, "dirichlet")
        if short >= HOPELESS_SHORT_CLIENTS:
            break
    return grouped_checked(
        *_top_up(draw.parts(), min_samples, rng), num_clients, min_samples, "dirichlet"
    )


@dataclass
class _Draw:
    """One Dirichlet draw: each class's shuffled indices and where they are cut among the
    clients; ``held`` the samples each client gets."""

    classes: list[tuple[np.ndarray, np.ndarray]]
    held: np.ndarray

    def owners(self) -> tuple[np.ndarray, np.ndarray]:
        """Every sample (class by class, each in its shuffled order) and the client its class's
        cuts deal it to: position ``t`` of a class goes to the client ``k`` with
        ``cuts[k-1] <= t < cuts[k]`` (the chunks ``np.split(idx, cuts)`` gives; cuts ascend)."""
        if not self.classes:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        values = np.concatenate([idx for idx, _ in self.classes])
        owner = np.concatenate(
            [np.searchsorted(cuts, np.arange(len(idx)), side="right") for idx, cuts in self.classes]
        )
        return values, owner

    def parts(self) -> list[np.ndarray]:
        """Each client's indices: its chunk of every class, in class order."""
        return grouped(*self.owners(), len(self.held), keep_order=True)


def _dirichlet_draw(
    by_class: list[np.ndarray],
    num_clients: int,
    rng: np.random.Generator,
    alpha: float,
    cap: bool,
    n: int,
) -> _Draw:
    """Deal every class by ``p ~ Dir(alpha)`` (``cap``: not to clients holding ``n /
    num_clients`` already). Sizes come from the cut positions, so a draw that gives some
    client fewer than ``min_samples`` is rejected without building the clients' arrays."""
    held = np.zeros(num_clients, dtype=np.int64)
    classes = []
    for idx in by_class:
        idx = rng.permutation(idx)
        p = rng.dirichlet(np.full(num_clients, float(alpha)))
        if cap:
            p = p * (held < n / num_clients)
            p = p / p.sum() if p.sum() > 0 else np.full(num_clients, 1.0 / num_clients)
        if not np.all(np.isfinite(p)) or p.sum() <= 0:  # underflow at tiny alpha
            p = np.eye(num_clients)[rng.integers(num_clients)]
        cuts = (np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
        bounds = np.clip(np.concatenate(([0], cuts, [len(idx)])), 0, len(idx))
        held += np.maximum(np.diff(bounds), 0)  # the chunk sizes np.split(idx, cuts) gives
        classes.append((idx, cuts))
    return _Draw(classes, held)


def _top_up(
    parts: list[np.ndarray], min_samples: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Last resort when no Dirichlet draw gave every client ``min_samples``: each short client
    in turn takes the last sample of the currently largest client (the lowest id among equals),
    one at a time, every part shuffled first (documented deviation from the pure draw; it only
    runs when the redraws failed). The moves are computed at once (:func:`_donations`), not one
    by one. Returns every sample and its client (for :func:`grouped`), so no per-client array
    is built in Python; a part of under 2 samples is not shuffled (``rng.permutation`` of it
    draws nothing and returns it: the same stream and parts).

    With ``sum(sizes) >= N * min_samples`` (what :func:`dirichlet` checks first) a client
    that took samples never gives one: while a client is short some client holds more than
    ``min_samples`` (pigeonhole), so the largest is never one that stopped at ``min_samples``.
    Fewer samples than that raise :class:`ValueError`."""
    parts = [rng.permutation(p) if len(p) > 1 else p for p in parts]
    sizes = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
    if int(sizes.sum()) < len(parts) * min_samples:
        raise ValueError(
            f"dirichlet partition: {int(sizes.sum())} samples cannot give {len(parts)} "
            f"clients {min_samples} samples each"
        )
    deficit = np.maximum(min_samples - sizes, 0)
    donor, position = _donations(sizes, int(deficit.sum()))
    clients = np.arange(len(parts), dtype=np.int64)
    flat = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)
    owner = np.repeat(clients, sizes)
    start = np.cumsum(sizes) - sizes
    kept = sizes - np.bincount(donor, minlength=len(parts))  # a shuffled part's own prefix
    own = np.arange(len(flat)) - start[owner] < kept[owner]
    return (
        np.concatenate([flat[own], flat[start[donor] + position]]),
        np.concatenate([owner[own], np.repeat(clients, deficit)]),  # move j's taker, in order
    )


def _donations(sizes: np.ndarray, moves: int) -> tuple[np.ndarray, np.ndarray]:
    """The donor of each of ``moves`` successive "take one from the largest client (lowest
    id among equals)" steps, and the position in its part of the sample it gives (its last
    one then: size - 1). Taking from the largest lowers the clients of the top size one by
    one in id order, then those of the next size, so the moves are every client's sizes
    ``v = size, size - 1, ...`` sorted by (``v`` descending, id), down to the highest level
    ``t`` whose sum ``sum(max(0, size - t + 1))`` covers ``moves`` (a binary search):
    O(N log max + moves log moves), no per-move Python."""
    if moves == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    low, high = 1, int(sizes.max())
    while low < high:  # the highest level whose steps (and all above it) cover ``moves``
        mid = (low + high + 1) // 2
        if int(np.maximum(sizes - mid + 1, 0).sum()) >= moves:
            low = mid
        else:
            high = mid - 1
    count = np.maximum(sizes - low + 1, 0)
    donor = np.repeat(np.arange(len(sizes), dtype=np.int64), count)
    level = sizes[donor] - (np.arange(len(donor)) - (np.cumsum(count) - count)[donor])
    order = np.lexsort((donor, -level))[:moves]
    return donor[order], level[order] - 1


def _dedupe_shards(
    assign: np.ndarray, shard_label: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Swap shards between clients until no client holds two shards of one class (if possible).

    Each try picks the ``r``-th (ascending) client still holding a duplicate, ``r`` drawn by
    ``rng``; the clients with duplicates are kept in a :class:`RankedSet` (O(log N) a pick)."""
    num_clients, k = assign.shape
    if k > len(np.unique(shard_label)):
        return assign
    labs = shard_label[assign]

    def is_bad(c: int) -> bool:
        return len(set(labs[c].tolist())) < k

    row_sorted = np.sort(labs, axis=1)
    bad = RankedSet(num_clients, np.flatnonzero((np.diff(row_sorted, axis=1) == 0).any(axis=1)))
    for _ in range(50 * num_clients * k):  # a try: plain Python on k-long rows, no numpy call
        if not len(bad):
            break
        a = bad.kth(int(rng.integers(len(bad))))
        row_a = labs[a].tolist()
        pa = next(i for i in range(k) if row_a[i] in row_a[:i])  # first repeat of a class
        b, pb = int(rng.integers(num_clients)), int(rng.integers(k))
        row_b = labs[b].tolist()
        if b == a or row_b[pb] in row_a[:pa] + row_a[pa + 1 :]:
            continue
        if row_a[pa] in row_b[:pb] + row_b[pb + 1 :]:
            continue
        assign[a, pa], assign[b, pb] = assign[b, pb], assign[a, pa]
        labs[a, pa], labs[b, pb] = row_b[pb], row_a[pa]
        for c in (a, b):
            bad.set(c, is_bad(c))
    return assign


def shards(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    classes_per_client: int,
    min_samples: int = 1,
) -> list[np.ndarray]:
    """McMahan shards: ``classes_per_client`` label-sorted shards per client."""
    k = int(classes_per_client)
    if k < 1:
        raise ValueError(f"shards partition: classes_per_client must be >= 1, got {k}")
    labels = np.asarray(labels)
    num_shards = num_clients * k
    _check_sizes(len(labels), num_shards, 1, "shards")
    _check_sizes(len(labels), num_clients, min_samples, "shards")
    perm = rng.permutation(len(labels))
    order = perm[np.argsort(labels[perm], kind="stable")]  # by label, random within a class
    shard_of = np.repeat(np.arange(num_shards), split_sizes(len(order), num_shards))
    shard_label = _shard_modes(shard_of, labels[order], num_shards)
    assign = rng.permutation(num_shards).reshape(num_clients, k)
    assign = _dedupe_shards(assign, shard_label, rng)
    client_of_shard = np.empty(num_shards, dtype=np.int64)
    client_of_shard[assign.reshape(-1)] = np.repeat(np.arange(num_clients), k)
    return grouped_checked(order, client_of_shard[shard_of], num_clients, min_samples, "shards")


def _shard_modes(shard_of: np.ndarray, labels: np.ndarray, num_shards: int) -> np.ndarray:
    """Each shard's most frequent label, the smallest among equals (``bincount().argmax()``
    per shard), from one sort of the ``(shard, label)`` pairs."""
    labels = np.asarray(labels, dtype=np.int64)
    width = int(labels.max()) + 1 if len(labels) else 1
    keys, counts = np.unique(shard_of * width + labels, return_counts=True)
    shard, label = np.divmod(keys, width)
    best = np.lexsort((label, -counts, shard))  # by shard, the most frequent first, then label
    first = best[np.r_[True, np.diff(shard[best]) != 0]]
    modes = np.zeros(num_shards, dtype=np.int64)
    modes[shard[first]] = label[first]
    return modes


def natural(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    writers: np.ndarray,
    min_samples: int = 1,
) -> list[np.ndarray]:
    """One client per writer: ``num_clients`` writers with ``>= min_samples`` samples."""
    writers = np.asarray(writers)
    if len(writers) != len(labels):
        raise ValueError(f"natural partition: {len(writers)} writer ids for {len(labels)} labels")
    ids, counts = np.unique(writers, return_counts=True)
    eligible = ids[counts >= min_samples]
    if num_clients > len(eligible):
        raise ValueError(
            f"natural partition: {num_clients} clients requested but only {len(eligible)} "
            f"writers have >= {min_samples} samples"
        )
    chosen = np.sort(rng.choice(eligible, size=num_clients, replace=False))
    return _writers_parts(writers, chosen, min_samples, "natural")


def _writers_parts(
    writers: np.ndarray, chosen: np.ndarray, min_samples: int, scheme: str
) -> list[np.ndarray]:
    """Client ``k``'s samples: those of writer ``chosen[k]`` (``chosen`` ascending, unique),
    ascending — ``np.flatnonzero(writers == w)`` for every ``w`` in one sort, O(n log n)."""
    slot = np.searchsorted(chosen, writers)
    mine = (slot < len(chosen)) & (chosen[np.minimum(slot, len(chosen) - 1)] == writers)
    return grouped_checked(np.flatnonzero(mine), slot[mine], len(chosen), min_samples, scheme)


def folders(writers: np.ndarray, num_clients: int, min_samples: int = 1) -> list[np.ndarray]:
    """Client ``k`` holds the samples of folder ``k`` (``writers == k``), every folder; the
    labels and the generator play no part."""
    writers = np.asarray(writers)
    count = int(writers.max()) + 1 if len(writers) else 0
    if num_clients != count:
        raise ValueError(
            f"folders partition: the data has {count} client folders but num_clients is "
            f"{num_clients}; set data.num_clients: {count}"
        )
    return _writers_parts(writers, np.arange(count), min_samples, "folders")


PARTITIONERS: dict[str, Callable[..., list[np.ndarray]]] = {
    "iid": iid,
    "dirichlet": dirichlet,
    "shards": shards,
    "natural": natural,
    "folders": folders,
}


def partition_indices(
    scheme: str,
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    alpha: float | None = None,
    dirichlet_cap: bool = False,
    classes_per_client: int | None = None,
    writers: np.ndarray | None = None,
    min_samples: int = 1,
) -> list[np.ndarray]:
    """Split ``range(len(labels))`` into ``num_clients`` disjoint sorted index arrays.

    ``alpha`` is required by ``dirichlet``, ``classes_per_client`` by ``shards`` and
    ``writers`` by ``natural``; other schemes ignore them.
    """
    labels = np.asarray(labels)
    if scheme == "iid":
        return iid(labels, num_clients, rng, min_samples=min_samples)
    if scheme == "dirichlet":
        if alpha is None:
            raise ValueError("dirichlet partition needs alpha")
        return dirichlet(
            labels, num_clients, rng, alpha=alpha, min_samples=min_samples, cap=dirichlet_cap
        )
    if scheme == "shards":
        if classes_per_client is None:
            raise ValueError("shards partition needs classes_per_client")
        return shards(
            labels,
            num_clients,
            rng,
            classes_per_client=classes_per_client,
            min_samples=min_samples,
        )
    if scheme == "natural":
        if writers is None:
            raise ValueError("natural partition needs per-sample writer ids (dataset has none)")
        return natural(labels, num_clients, rng, writers=writers, min_samples=min_samples)
    if scheme == "folders":
        if writers is None:
            raise ValueError("folders partition needs a per-client folder layout (root/clients/)")
        return folders(writers, num_clients, min_samples)
    choices = ", ".join(PARTITIONERS)
    raise ValueError(f"unknown partition scheme {scheme!r}; choose one of {choices}")


def label_histograms(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """Per-client label counts, int64 ``[len(parts), num_classes]`` (labels outside
    ``0..num_classes-1`` are not counted): one ``bincount`` over every client's samples."""
    labels = np.asarray(labels, dtype=np.int64)
    if not parts:
        return np.zeros((0, num_classes), dtype=np.int64)
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    taken = labels[np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])]
    client = np.repeat(np.arange(len(parts)), sizes)
    counted = taken < num_classes
    flat = np.bincount(
        client[counted] * num_classes + taken[counted], minlength=len(parts) * num_classes
    )
    return flat.reshape(len(parts), num_classes).astype(np.int64)


def epoch_batch_sizes(
    num_samples: int, batch_size: int, drop_last: bool | str = False
) -> list[int]:
    """Sizes of one epoch's mini-batches of ``num_samples`` under ``train.drop_last``
    (resolved: ``False`` keeps the incomplete last batch, ``True`` drops it, ``"single"``
    drops it when it holds one sample; ``"auto"`` unresolved counts as ``False``). An epoch
    without a full batch keeps its one batch: a client trains on something."""
    full, rest = divmod(num_samples, batch_size)
    sizes = [batch_size] * full
    dropped = full > 0 and (drop_last is True or (drop_last == "single" and rest == 1))
    if rest and not dropped:
        sizes.append(rest)
    return sizes


def batch_sizes(
    num_samples: int, batch_size: int, steps: int, drop_last: bool | str = False
) -> list[int]:
    """Sizes of ``steps`` consecutive mini-batches cycling over epochs of ``num_samples``
    (:func:`epoch_batch_sizes`)."""
    per_epoch = epoch_batch_sizes(num_samples, batch_size, drop_last)
    return [per_epoch[i % len(per_epoch)] for i in range(steps)]
