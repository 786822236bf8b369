"""RingSFL's ring (Alg. 2) for the vectorised executor: every start's batch at once.

Every start's batch visits blocks 0…W−1 in order, block b on the model of whichever client's
segment covers it (Alg. 2), so block b of all starts is one vmap over the owners' rows; a
client's block crossed by several starts collects the sum of their gradients and chains their
BatchNorm updates, and v2 scales each block's rate by |U_j,(k)| (Eq. 3's overlap counts).
Computes what :func:`~splitfl.topologies.ring.member.ring_batch_update` computes client by client.
"""

from __future__ import annotations

import torch

from splitfl.core.plan import ClientUpdate, RoundPlan, RoundResult
from splitfl.executors.rowstack import (
    RowRunner,
    RowStack,
    WorkerRow,
    bn_momenta,
    chain_buffers,
    check_finite,
    expand_rows,
    model_part,
    row_losses,
)
from splitfl.models import BlockModel, ModelPart, block_index
from splitfl.roles.common import task_batches
from splitfl.topologies.ring.member import block_rates


class _BatchedRing:
    """One round of the ring on one stack of whole-model rows (one row per client)."""

    def __init__(
        self, runner: RowRunner, ctx, model: BlockModel, plan: RoundPlan, round_seed: int
    ) -> None:
        self.runner, self.ring, self.tasks = runner, plan.topology.spec, plan.tasks
        self.n = n = model.num_blocks
        full = ModelPart(model, 0, n)
        base = full.state_dict()
        states = [base if t.init_state is None else {**base, **t.init_state} for t in self.tasks]
        lrs = [t.lr for t in self.tasks]
        self.stack = RowStack.from_states(full, states, lrs, runner.device)
        row = {t.client: i for i, t in enumerate(self.tasks)}
        self.blocks = [model_part(model, b, b + 1) for b in range(n)]
        self.momenta = bn_momenta(full)
        self.owner: dict[tuple[int, int], int] = {}
        for t in self.tasks:
            for client, lo, hi in self.ring.segments(t.client):
                for b in range(lo, hi):
                    self.owner[t.client, b] = row[client]
        self.workers = [
            WorkerRow(
                t,
                n,
                i,
                i,
                task_batches(
                    ctx.client_indices[t.client], t, round_seed, ctx.config.train.drop_last
                ),
            )
            for i, t in enumerate(self.tasks)
        ]

    def bucket_loss(
        self, bucket: list[WorkerRow], step: int, rank: dict, results: dict, data
    ) -> torch.Tensor:
        """The bucket's batches through blocks 0…W−1 on their owners' rows: the Alg. 2
        weighted sum of the starts' mean losses; BatchNorm results go to ``results``."""
        x, y = self.runner.batch(bucket, step, *data)
        h = x
        for b, (part, keys) in enumerate(self.blocks):
            rows = [self.owner[w.task.client, b] for w in bucket]
            h, buffers = self.runner.forward(
                part, keys, self.stack, rows, h, keep_stack_buffers=True
            )
            for k, v in buffers.items():
                results.setdefault(k, []).extend(
                    (r, rank[id(w)], v[i])
                    for i, (r, w) in enumerate(zip(rows, bucket, strict=True))
                )
        means = row_losses(h, y, self.runner.loss) / y.shape[1]
        check_finite(means, bucket)
        weights = torch.tensor(
            [self.ring.weights[w.task.client] for w in bucket], dtype=means.dtype
        )
        for w, loss in zip(bucket, means.detach().tolist(), strict=True):
            w.samples += y.shape[1]
            w.loss_sum += loss * y.shape[1]
        return (weights.to(means.device) * means).sum()

    def step(self, step: int, data) -> None:
        """One iteration of every active start: forward/backward, BatchNorm chaining, SGD."""
        active = [w for w in self.workers if step < w.task.steps]
        buckets: dict[int, list[WorkerRow]] = {}
        for w in active:
            buckets.setdefault(len(w.batches[step]), []).append(w)
        rank = {id(w): i for i, w in enumerate(active)}
        results: dict[str, list] = {}
        total = [self.bucket_loss(bucket, step, rank, results, data) for bucket in buckets.values()]
        torch.stack(total).sum().backward()
        chain_buffers(self.stack, results, self.momenta)
        self.update(active)

    def update(self, active: list[WorkerRow]) -> None:
        """Each block of each row by its rate (:func:`~splitfl.topologies.ring.member.block_rates`:
        lr, v2 × |U_j,(k)|; 0 where no batch passed)."""
        ring, stack, lr = self.ring, self.stack, self.tasks[0].lr
        counts = ring.overlap_counts(self.n, [w.task.client for w in active])
        per_client = [block_rates(counts[t.client], lr, ring.dynamic_lr) for t in self.tasks]
        rates = [
            torch.tensor(per_block, dtype=stack.lr.dtype, device=self.runner.device)
            for per_block in zip(*per_client, strict=True)
        ]
        stack.collect_row_grads()
        with torch.no_grad():
            for key, p in stack.params.items():
                p.sub_(expand_rows(rates[block_index(key)], p) * p.grad)
        stack.zero_grad()

    def result(self) -> RoundResult:
        updates = [
            ClientUpdate(
                w.task.client,
                self.n,
                i,
                w.samples,
                w.task.steps,
                self.stack.row_state(i),
                w.loss_sum,
            )
            for i, w in enumerate(self.workers)
        ]
        return RoundResult(updates=updates, server_states={})


def run_batched_ring(
    runner: RowRunner,
    ctx,
    model: BlockModel,
    plan: RoundPlan,
    round_seed: int,
    data: tuple[torch.Tensor, torch.Tensor],
) -> RoundResult:
    """RingSFL's BatchUpdate (Alg. 2) for every start at once on ``model`` (the round's copy
    at the global state); ``data`` is the training set ``(x, y)`` on the device."""
    ring = _BatchedRing(runner, ctx, model, plan, round_seed)
    for step in range(max(t.steps for t in plan.tasks)):
        ring.step(step, data)
    return ring.result()
