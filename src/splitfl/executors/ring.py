"""RingSFL's ring training step (``papers/ringsfl.md`` §3.2–3.5, Alg. 2, Eq. 5–7).

The ring's topology (segments, overlaps) is :class:`splitfl.plan.RingSpec`; the propagation
lengths (Eq. 3) are RingSFL's own (:mod:`splitfl.algorithms.ringsfl`).

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

import torch
import torch.nn.functional as F

from splitfl.models.base import BlockModel
from splitfl.plan import RingSpec


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
    ring = RingSpec(list(order), dict(lengths), dict(weights), dynamic_lr)
    losses = {}
    for start, (x, y) in batches.items():
        h = x
        for client, lo, hi in ring.segments(start):
            h = models[client](h, lo, hi)
        loss = F.cross_entropy(h, y)
        (weights[start] * loss).backward()
        losses[start] = loss.item()
    num_blocks = next(iter(models.values())).num_blocks
    counts = ring.overlap_counts(num_blocks, list(batches))
    with torch.no_grad():
        for client, model in models.items():
            for k, block in enumerate(model.blocks):
                rate = lr * (counts[client][k] if dynamic_lr else 1)
                for p in block.parameters():
                    if p.grad is not None:
                        p.sub_(rate * p.grad)
    return losses
