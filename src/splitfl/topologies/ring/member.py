"""RingSFL's ring training step (``papers/ringsfl.md`` §3.2–3.5, Alg. 2, Eq. 5–7).

The ring's topology (segments, overlaps) is :class:`splitfl.core.plan.RingSpec`; the propagation
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
from torch import nn

from splitfl.core.activations import (
    Activation,
    Gradient,
    as_server_input,
    input_grad,
    leaves,
    tree_map,
)
from splitfl.core.topology import RingSpec
from splitfl.models.base import BlockModel
from splitfl.training import loss_fn


def ring_batch_update(
    models: Mapping[int, BlockModel],
    order: Sequence[int],
    lengths: Mapping[int, int],
    batches: Mapping[int, tuple[torch.Tensor, torch.Tensor]],
    weights: Mapping[int, float],
    lr: float,
    dynamic_lr: bool,
    loss: str = "cross_entropy",
) -> dict[int, float]:
    """One BatchUpdate step for every client in ``batches`` (Alg. 2), updating ``models`` in
    place with plain SGD (v2: per-block rate × |U_j,(k)|, Eq. 7). Returns each client's mean
    ``loss`` (``train.loss``)."""
    criterion = loss_fn(loss)
    for m in models.values():
        m.zero_grad(set_to_none=True)
    ring = RingSpec(list(order), dict(lengths), dict(weights), dynamic_lr)
    losses = {}
    for start, (x, y) in batches.items():
        h = x
        for client, lo, hi in ring.segments(start):
            h = models[client](h, lo, hi)
        value = criterion(h, y)
        (weights[start] * value).backward()
        losses[start] = value.item()
    num_blocks = next(iter(models.values())).num_blocks
    counts = ring.overlap_counts(num_blocks, list(batches))
    for client, model in models.items():
        ring_update(model, counts[client], lr, dynamic_lr)
    return losses


def block_rates(counts: Sequence[int], lr: float, dynamic_lr: bool) -> list[float]:
    """Each block's learning rate on one client's model in a BatchUpdate step: ``lr`` (v1),
    or ``lr`` × |U_j,(k)| = ``counts[k]`` with v2's dynamic rate (Eq. 7); 0 for a block no
    batch passed through. The one definition of Eq. (7), used by every executor's ring."""
    return [lr * (c if dynamic_lr else 1) if c > 0 else 0.0 for c in counts]


def ring_update(model: BlockModel, counts: Sequence[int], lr: float, dynamic_lr: bool) -> None:
    """The end of a BatchUpdate step on one client's model: plain SGD on the accumulated
    gradients at :func:`block_rates` (v2: block k's rate × |U_j,(k)|, Eq. 7)."""
    with torch.no_grad():
        for block, rate in zip(model.blocks, block_rates(counts, lr, dynamic_lr), strict=True):
            for p in block.parameters():
                if p.grad is not None:
                    p.sub_(rate * p.grad)


class RingMember:
    """One client's share of a BatchUpdate step when the ring runs over messages (a device
    process of the networked executor): Alg. 2 cut at the segment boundaries.

    Each client's batch travels ``hop`` 0, 1, …, N−1 through the segments of
    :meth:`RingSpec.segments`; hop N brings the logits back to the batch's own client, which
    computes its loss (labels never leave it) and sends ∂(a_i·loss)/∂logits back around the
    ring in reverse. Each hop keeps its segment's input and output so the gradient that comes
    back is applied with the same chain rule as one autograd graph. Each start's gradients are
    kept apart and summed in :meth:`end_step` in the order of ``starts``, as
    :func:`ring_batch_update` accumulates them: a sum in arrival order rounds differently from
    run to run (float addition is not associative; a block crossed by three batches), and on a
    BatchNorm CNN such last-bit differences can grow over a few steps into a visibly different
    model.

    A member runs the hops in the order they arrive, but BatchNorm running statistics depend
    on the order of the forwards through a block; :func:`ring_batch_update` forwards one
    start's batch after another in the order of ``starts`` (task order). So each BatchNorm
    input of the step is kept, and :meth:`end_step` restores the step's starting statistics
    and replays those inputs in the order of ``starts`` (the module's own update, so any
    momentum, cumulative averages included): the member ends with the reference's statistics.
    """

    def __init__(self, client: int, model: BlockModel, ring: RingSpec, loss: str = "cross_entropy"):
        self.client, self.model, self.ring = client, model, ring
        self.criterion = loss_fn(loss)
        self.saved: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor]] = {}
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.grads: dict[int, tuple[torch.Tensor | None, ...]] = {}  # per start, summed in order
        self.backward_done = 0
        self.norms = [
            m
            for m in model.modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
        ]
        for m in self.norms:
            m.register_forward_pre_hook(self._keep_norm_input)
        self._start: int | None = None  # whose batch is being forwarded (None: no record)
        self._norm_inputs: list[tuple[int, nn.Module, torch.Tensor]] = []
        self._norm_stats: list[dict[str, torch.Tensor]] = []

    def segment(self, start: int, hop: int) -> tuple[int, int]:
        owner, lo, hi = self.ring.segments(start)[hop]
        if owner != self.client:
            raise ValueError(f"hop {hop} of client {start}'s batch is client {owner}'s, not ours")
        return lo, hi

    def begin_step(self) -> None:
        self.model.zero_grad(set_to_none=True)
        self.saved.clear()
        self.grads.clear()
        self.backward_done = 0
        self._norm_inputs.clear()
        self._norm_stats = [{k: b.clone() for k, b in m.named_buffers()} for m in self.norms]

    def _keep_norm_input(self, module: nn.Module, args: tuple) -> None:
        if self._start is not None:
            self._norm_inputs.append((self._start, module, args[0].detach()))

    def forward(self, start: int, hop: int, h: Activation) -> Activation:
        """Run this client's segment of ``start``'s batch (hop 0: ``h`` is the raw batch);
        the output to pass on (one tensor, or a tuple where several cross), detached."""
        lo, hi = self.segment(start, hop)
        h_in = None if hop == 0 else as_server_input(h)
        self._start = start
        try:
            out = self.model(h if h_in is None else h_in, lo, hi)
        finally:
            self._start = None
        self.saved[(start, hop)] = (h_in, out)
        return tree_map(torch.Tensor.detach, out)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, float]:
        """Hop N at the batch's own client: ∂(a_i·loss_i)/∂logits and loss_i."""
        leaf = logits.detach().requires_grad_()
        loss = self.criterion(leaf, labels)
        (self.ring.weights[self.client] * loss).backward()
        return leaf.grad, loss.item()

    def backward(self, start: int, hop: int, grad: Gradient) -> Gradient:
        """Back through this client's segment of ``start``'s batch; the gradient of its input
        to send to the previous hop (None at hop 0; ``None`` too for an input tensor that is
        not floating). The parameters' gradients are kept for :meth:`end_step` (a start
        crosses this member's model once)."""
        h_in, out = self.saved.pop((start, hop))
        pairs = [
            (o, g)
            for o, g in zip(leaves(out), leaves(grad), strict=True)
            if g is not None and o.requires_grad
        ]
        for o, g in pairs:
            if g.shape != o.shape:
                raise ValueError(f"gradient shape {tuple(g.shape)} for output {tuple(o.shape)}")
        wanted = [] if h_in is None else [t for t in leaves(h_in) if t.requires_grad]
        grads = torch.autograd.grad(
            [o for o, _ in pairs], [*self.params, *wanted], [g for _, g in pairs], allow_unused=True
        )
        self.grads[start] = grads[: len(self.params)]
        self.backward_done += 1
        if h_in is None:
            return None
        for t, g in zip(wanted, grads[len(self.params) :], strict=True):
            t.grad = g
        return input_grad(h_in)

    def end_step(self, starts: Sequence[int], lr: float) -> None:
        """Eq. (5)-(7): the step's update once every active batch has come back; ``starts``
        in the reference's order (task order), which the BatchNorm statistics follow."""
        self._replay_norms(starts)
        self._sum_grads(starts)
        counts = self.ring.overlap_counts(self.model.num_blocks, list(starts))[self.client]
        ring_update(self.model, counts, lr, self.ring.dynamic_lr)

    def _sum_grads(self, starts: Sequence[int]) -> None:
        """Each parameter's ``grad``: the kept per-start gradients added in the order of
        ``starts``, as autograd accumulates them in :func:`ring_batch_update`."""
        for i, p in enumerate(self.params):
            total = None
            for start in starts:
                g = self.grads[start][i] if start in self.grads else None
                if g is not None:
                    total = g if total is None else total + g
            p.grad = total
        self.grads.clear()

    def _replay_norms(self, starts: Sequence[int]) -> None:
        """BatchNorm running statistics as :func:`ring_batch_update` leaves them: the step's
        starting statistics, then the kept inputs run through their modules in the order of
        ``starts`` (outputs discarded; a start crosses a module of this member at most once)."""
        rank = {s: i for i, s in enumerate(starts)}
        with torch.no_grad():
            for m, stats in zip(self.norms, self._norm_stats, strict=True):
                for k, b in m.named_buffers():
                    b.copy_(stats[k])
            for _, module, x in sorted(self._norm_inputs, key=lambda e: rank[e[0]]):
                module(x)
        self._norm_inputs.clear()
