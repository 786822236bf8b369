"""Which client holds which sample, computed over all samples at once (issue 54): the parts
of a partition from one sort of ``(client, sample)`` keys, the sizes ``np.array_split`` cuts,
and a set that answers "its ``r``-th smallest member" in O(log N). What
:mod:`splitfl.data.partition` builds its schemes from, so that each costs O(n log n) in the
samples and O(N) in the clients instead of a pass over the samples per client."""

from __future__ import annotations

import numpy as np


def check_min_sizes(sizes: np.ndarray, min_samples: int, scheme: str) -> None:
    small = int((sizes < min_samples).sum())
    if small:
        raise ValueError(
            f"{scheme} partition: {small} client(s) got fewer than {min_samples} samples"
        )


def grouped(
    values: np.ndarray, owner: np.ndarray, num_clients: int, *, keep_order: bool = False
) -> list[np.ndarray]:
    """Client ``k``'s part: the ``values`` whose ``owner`` is ``k`` — sorted ascending, or in
    their order in ``values`` (``keep_order``). One sort of all ``n`` samples and one split,
    O(n log n + N), instead of a pass over the samples per client."""
    values, owner = np.asarray(values, dtype=np.int64), np.asarray(owner, dtype=np.int64)
    if keep_order:
        order = np.argsort(owner, kind="stable")
    else:  # by (owner, value) as one int64 key: sample indices are below n, owners below N
        width = int(values.max()) + 1 if len(values) else 1
        order = np.argsort(owner * width + values)
    flat = values[order]
    ends = np.cumsum(np.bincount(owner, minlength=num_clients)).tolist()
    return [flat[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def grouped_checked(
    values: np.ndarray, owner: np.ndarray, num_clients: int, min_samples: int, scheme: str
) -> list[np.ndarray]:
    """:func:`grouped` (sorted parts) after the ``min_samples`` check on their sizes."""
    check_min_sizes(np.bincount(owner, minlength=num_clients), min_samples, scheme)
    return grouped(values, owner, num_clients)


def split_sizes(n: int, sections: int) -> np.ndarray:
    """The sizes ``np.array_split`` cuts ``n`` items into: the first ``n % sections`` one more."""
    base, extra = divmod(n, sections)
    sizes = np.full(sections, base, dtype=np.int64)
    sizes[:extra] += 1
    return sizes


class RankedSet:
    """A set of ints in ``0..size-1`` that gives its ``r``-th smallest member in O(log size)
    (a Fenwick tree of membership counts): ``sorted(members)[r]`` without the sort."""

    def __init__(self, size: int, members: np.ndarray):
        self._has = np.zeros(size, dtype=bool)
        self._has[members] = True
        self._count = int(self._has.sum())
        prefix = np.concatenate(([0], np.cumsum(self._has, dtype=np.int64)))
        node = np.arange(1, size + 1)
        tree = np.zeros(size + 1, dtype=np.int64)  # node i counts members i-lowbit(i)..i-1
        tree[1:] = prefix[node] - prefix[node - (node & -node)]
        self._tree, self._size = tree.tolist(), size
        self._top = 1 << max(size.bit_length() - 1, 0)

    def __len__(self) -> int:
        return self._count

    def set(self, member: int, present: bool) -> None:
        if bool(self._has[member]) == present:
            return
        self._has[member] = present
        delta = 1 if present else -1
        self._count += delta
        i = member + 1
        while i <= self._size:
            self._tree[i] += delta
            i += i & -i

    def kth(self, r: int) -> int:
        """The ``r``-th smallest member (0-based)."""
        pos, step = 0, self._top
        while step:
            if pos + step <= self._size and self._tree[pos + step] <= r:
                pos += step
                r -= self._tree[pos]
            step >>= 1
        return pos
