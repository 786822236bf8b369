"""RingSFL's ring training (``papers/ringsfl.md`` §3.2–3.5, Alg. 2, Eq. 3–7) as functions.

Every client holds a full local model. For client i's mini-batch, BatchUpdate (Alg. 2) runs the
forward through L_i blocks of u_i's *own* model, then the next L_j blocks of each following
client's model around the ring, computes the loss at u_i, and propagates back in reverse; each
client accumulates the a_i-weighted gradients of the blocks it processed (every client's batch
is processed in each step). Each client then updates its local model with its accumulated
gradients — v1 with one learning rate; v2 multiplies the rate of each block by |U_j,(k)|, the
number of clients whose batches passed through that block of u_j's model (Eq. 7). The server
averages the resulting *blended* models (Eq. 5–6); with the learning rate multiplied by N the
round equals FedAvg's update (tested).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from splitfl.models.base import BlockModel


def largest_remainder(shares: Sequence[float], total: int) -> list[int]:
    """Integers ≥ 1 summing to ``total`` proportional to ``shares``.

    Rounding rule: floor of each exact share, the remaining blocks to the largest remainders
    (ties: lower index); then every client left with 0 blocks takes one from the client with
    the most blocks. Exact shares stay exact (C = 4:2:1:1 over 16 blocks → 8, 4, 2, 2), and
    RingSFL's public sweeps come out as printed (e.g. 100:1:1:1:1 over 10 blocks → 6:1:1:1:1).
    """
    n = len(shares)
    if total < n:
        raise ValueError(f"{total} blocks cannot give {n} clients at least one block each")
    w = np.asarray(shares, dtype=float)
    if np.any(w <= 0):
        raise ValueError("propagation shares must be positive")
    ideal = w / w.sum() * total
    lengths = np.floor(ideal).astype(int)
    for i in np.argsort(-(ideal - lengths), kind="stable")[: total - lengths.sum()]:
        lengths[i] += 1
    for i in np.flatnonzero(lengths == 0):
        lengths[int(np.argmax(lengths))] -= 1
        lengths[i] = 1
    return lengths.tolist()


def propagation_lengths(power: Sequence[float], num_blocks: int) -> list[int]:
    """Eq. (3): L_i = C_i / ΣC · W, rounded by :func:`largest_remainder`."""
    return largest_remainder(power, num_blocks)


def parse_ratios(spec: str, n: int, num_blocks: int) -> list[int]:
    """Explicit ratios ``"6:1:1:1:1"`` → lengths (rounded as Eq. 3)."""
    parts = [float(p) for p in spec.split(":")]
    if len(parts) != n:
        raise ValueError(f"{len(parts)} ratios for {n} clients")
    return largest_remainder(parts, num_blocks)


def segments(order: Sequence[int], lengths: Mapping[int, int], start: int) -> list[tuple]:
    """Alg. 2 lines 2–6 for client ``start``: [(client, first block, stop block), …]."""
    pos = list(order).index(start)
    out, lo = [], 0
    for k in range(len(order)):
        client = order[(pos + k) % len(order)]
        out.append((client, lo, lo + lengths[client]))
        lo += lengths[client]
    return out


def overlap_counts(
    order: Sequence[int],
    lengths: Mapping[int, int],
    num_blocks: int,
    starts: Sequence[int] | None = None,
) -> dict:
    """|U_j,(k)|: for every client j and block k, how many of the ``starts`` clients' batches
    (default: all) pass through it."""
    counts = {c: [0] * num_blocks for c in order}
    for start in order if starts is None else starts:
        for client, lo, hi in segments(order, lengths, start):
            for k in range(lo, hi):
                counts[client][k] += 1
    return counts


def ring_batch_update(
    models: Mapping[int, BlockModel],
    order: Sequence[int],
    lengths: Mapping[int, int],
    batches: Mapping[int, tuple[torch.Tensor, torch.Tensor]],
    weights: Mapping[int, float],
    lr: float,
    dynamic_lr: bool,
) -> dict[int, float]:
    """One BatchUpdate step for every client in ``batches`` (Alg. 2), updating ``models`` in
    place with plain SGD (v2: per-block rate × |U_j,(k)|, Eq. 7). Returns each client's loss."""
    for m in models.values():
        m.zero_grad(set_to_none=True)
    losses = {}
    for start, (x, y) in batches.items():
        h = x
        for client, lo, hi in segments(order, lengths, start):
            h = models[client](h, lo, hi)
        loss = F.cross_entropy(h, y)
        (weights[start] * loss).backward()
        losses[start] = loss.item()
    num_blocks = next(iter(models.values())).num_blocks
    counts = overlap_counts(order, lengths, num_blocks, list(batches))
    with torch.no_grad():
        for client, model in models.items():
            for k, block in enumerate(model.blocks):
                rate = lr * (counts[client][k] if dynamic_lr else 1)
                for p in block.parameters():
                    if p.grad is not None:
                        p.sub_(rate * p.grad)
    return losses
