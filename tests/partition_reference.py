"""The partitioners as they were before issue 54 (item-by-item Python loops, O(N^2) top-up),
kept only as the reference the vectorised :mod:`splitfl.data.partition` must equal sample for
sample (``tests/data/test_partition_equivalence.py``). Not product code: nothing imports it
but that test and ``benchmarks/bench_scale.py`` (the "before" figures)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_DIRICHLET_ATTEMPTS = 1000


def _finish(parts: list[np.ndarray], min_samples: int, scheme: str) -> list[np.ndarray]:
    out = [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    small = [i for i, p in enumerate(out) if len(p) < min_samples]
    if small:
        raise ValueError(
            f"{scheme} partition: {len(small)} client(s) got fewer than {min_samples} samples"
        )
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
    return _finish(np.array_split(rng.permutation(n), num_clients), min_samples, "iid")


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    alpha: float,
    min_samples: int = 1,
    cap: bool = False,
) -> list[np.ndarray]:
    """Per-class ``Dir(alpha)`` label skew, redrawn until every client has ``min_samples``.

    ``cap``: skip clients already holding ``N / num_clients`` samples when dealing a class.
    """
    if not alpha > 0:
        raise ValueError(f"dirichlet partition: alpha must be > 0, got {alpha}")
    labels = np.asarray(labels)
    _check_sizes(len(labels), num_clients, min_samples, "dirichlet")
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(MAX_DIRICHLET_ATTEMPTS):
        draw = _dirichlet_draw(by_class, num_clients, rng, alpha, cap, len(labels))
        if draw.held.min() >= min_samples:
            return _finish(draw.parts(), min_samples, "dirichlet")
    return _finish(_top_up(draw.parts(), min_samples, rng), min_samples, "dirichlet")


@dataclass
class _Draw:
    """One Dirichlet draw: each class's shuffled indices and where they are cut among the
    clients; ``held`` the samples each client gets."""

    classes: list[tuple[np.ndarray, np.ndarray]]
    held: np.ndarray

    def parts(self) -> list[np.ndarray]:
        """Each client's indices: its chunk of every class, in class order."""
        chunks = [np.split(idx, cuts) for idx, cuts in self.classes]
        return [np.concatenate([c[client] for c in chunks]) for client in range(len(self.held))]


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


def _top_up(parts: list[np.ndarray], min_samples: int, rng: np.random.Generator) -> list:
    """Last resort when no Dirichlet draw gave every client ``min_samples``: move random
    samples from the currently largest client to each short client (documented deviation
    from the pure draw; it only runs when :data:`MAX_DIRICHLET_ATTEMPTS` draws failed)."""
    parts = [rng.permutation(p) for p in parts]
    for client in range(len(parts)):
        while len(parts[client]) < min_samples:
            donor = int(np.argmax([len(p) for p in parts]))
            parts[client] = np.append(parts[client], parts[donor][-1])
            parts[donor] = parts[donor][:-1]
    return parts


def _dedupe_shards(
    assign: np.ndarray, shard_label: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Swap shards between clients until no client holds two shards of one class (if possible)."""
    num_clients, k = assign.shape
    if k > len(np.unique(shard_label)):
        return assign
    labs = shard_label[assign]

    def is_bad(c: int) -> bool:
        return len(np.unique(labs[c])) < k

    bad = {c for c in range(num_clients) if is_bad(c)}
    for _ in range(50 * num_clients * k):
        if not bad:
            break
        a = sorted(bad)[rng.integers(len(bad))]
        _, first = np.unique(labs[a], return_index=True)
        pa = int(np.setdiff1d(np.arange(k), first)[0])  # a duplicated position
        b, pb = int(rng.integers(num_clients)), int(rng.integers(k))
        if b == a or labs[b, pb] in np.delete(labs[a], pa) or labs[a, pa] in np.delete(labs[b], pb):
            continue
        assign[[a, b], [pa, pb]] = assign[[b, a], [pb, pa]]
        labs[[a, b], [pa, pb]] = labs[[b, a], [pb, pa]]
        bad -= {a, b}
        bad |= {c for c in (a, b) if is_bad(c)}
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
    pieces = np.array_split(order, num_shards)
    shard_label = np.array([np.bincount(labels[p]).argmax() for p in pieces])
    assign = rng.permutation(num_shards).reshape(num_clients, k)
    assign = _dedupe_shards(assign, shard_label, rng)
    return _finish(
        [np.concatenate([pieces[s] for s in row]) for row in assign], min_samples, "shards"
    )


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
    return _finish([np.flatnonzero(writers == w) for w in chosen], min_samples, "natural")


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
    return _finish([np.flatnonzero(writers == k) for k in range(count)], min_samples, "folders")


def label_histograms(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """Per-client label counts, int64 ``[len(parts), num_classes]``."""
    labels = np.asarray(labels, dtype=np.int64)
    if not parts:
        return np.zeros((0, num_classes), dtype=np.int64)
    return np.stack(
        [
            np.bincount(labels[np.asarray(p, dtype=np.int64)], minlength=num_classes)[:num_classes]
            for p in parts
        ]
    ).astype(np.int64)
