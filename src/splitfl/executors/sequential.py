"""The reference executor: a :class:`~splitfl.plan.RoundPlan` run client by client.

:class:`SequentialExecutor` is the reference: clients one after another, the way the papers'
own code runs. Other executors (GPU-vectorised, networked) must return the same
:class:`~splitfl.plan.RoundResult` for the same plan.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from splitfl.executors.common import (
    at_least_fp32,
    aux_head,
    check_finite,
    client_batches,
    detached,
    precision_context,
    sgd,
    to_memory_format,
)
from splitfl.executors.ring import ring_batch_update
from splitfl.models import BlockModel, ModelPart
from splitfl.plan import ClientTask, ClientUpdate, RoundPlan, RoundResult
from splitfl.seeding import derive_seed


@dataclass
class _Worker:
    """A participant's device part, optimiser and batches for the round."""

    task: ClientTask
    part: ModelPart
    optimizer: torch.optim.Optimizer
    batches: list[torch.Tensor]
    aux: nn.Module | None = None
    samples: int = 0
    loss_sum: float = 0.0


def _mix_pairs(sent, rng: np.random.Generator, alpha: float):
    """Mixup of the smashed data of random pairs of members with equal cut points
    (LocFedMix-SL): yields (mixed features, start block, y_a, y_b, λ ~ Beta(α, α))."""
    order = rng.permutation(len(sent)).tolist()
    for a, b in zip(order[0::2], order[1::2], strict=False):
        (wa, _, fa, ya), (wb, _, fb, yb) = sent[a], sent[b]
        if wa.task.cut != wb.task.cut:
            continue
        m = min(len(ya), len(yb))
        lam = float(rng.beta(alpha, alpha))
        mixed = lam * fa[:m].detach() + (1 - lam) * fb[:m].detach()
        yield mixed, wa.task.cut, ya[:m], yb[:m], lam


class SequentialExecutor:
    """Reference executor on one torch device (CPU by default)."""

    def __init__(self, device: str = "cpu", precision: str = "fp32", channels_last: bool = False):
        self.device = torch.device(device)
        self.precision = precision
        self.channels_last = channels_last

    def run_round(
        self, ctx, global_state: dict[str, torch.Tensor], plan: RoundPlan, round_seed: int
    ) -> RoundResult:
        model: BlockModel = copy.deepcopy(ctx.model).to(self.device)
        model.load_state_dict(global_state)
        model.train()
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        x_all, y_all = ctx.bundle.train.x, ctx.bundle.train.y
        n = model.num_blocks

        def worker(task: ClientTask) -> _Worker:
            part = copy.deepcopy(ModelPart(model, 0, task.cut))
            if task.init_state is not None:
                part.load_state_dict(task.init_state)
            seed = derive_seed(round_seed, task.client)
            batches = client_batches(
                ctx.client_indices[task.client], task.batch_size, task.steps, seed
            )
            aux = None
            trainable = nn.ModuleList([part])
            if plan.device_loss == "local" and task.cut < n:
                elems = ctx.profile.blocks[task.cut - 1].out_elements
                dtype = next(model.parameters()).dtype
                aux = aux_head(elems, ctx.bundle.num_classes).to(self.device, dtype)
                if task.aux_state is not None:
                    aux.load_state_dict(task.aux_state)
                trainable.append(aux)
            return _Worker(task, part, sgd(trainable, task.lr, ctx.config.train), batches, aux)

        def fetch(w: _Worker, step: int) -> tuple[torch.Tensor, torch.Tensor]:
            idx = w.batches[step]
            x = x_all[idx].to(self.device)
            return (to_memory_format(x) if self.channels_last else x), y_all[idx].to(self.device)

        if plan.ring is not None:
            return self._run_ring(model, plan, worker, fetch)
        gen = np.random.default_rng(derive_seed(round_seed, "mix"))
        updates: list[ClientUpdate] = []
        server_states: dict[int, dict[str, torch.Tensor]] = {}
        for group, tasks in plan.groups().items():
            workers = [worker(t) for t in tasks]
            split_cuts = [t.cut for t in tasks if t.cut < n]
            server = copy.deepcopy(ModelPart(model, min(split_cuts), n)) if split_cuts else None
            lr = plan.server_lr if plan.server_lr is not None else tasks[0].lr
            server_opt = sgd(server, lr, ctx.config.train) if server is not None else None
            if plan.server_mode == "sequential":
                order = {c: i for i, c in enumerate(plan.order)}
                previous = None
                for w in sorted(workers, key=lambda w: order.get(w.task.client, 0)):
                    if plan.chain_devices and previous is not None:
                        w.part.load_state_dict(previous.part.state_dict())
                    previous = w
                    for step in range(w.task.steps):
                        self._split_step([w], server, server_opt, step, fetch, plan, gen)
            else:
                for step in range(max(t.steps for t in tasks)):
                    active = [w for w in workers if step < w.task.steps]
                    self._split_step(active, server, server_opt, step, fetch, plan, gen)
            for w in workers:
                updates.append(
                    ClientUpdate(
                        client=w.task.client,
                        cut=w.task.cut,
                        group=group,
                        samples=w.samples,
                        steps=w.task.steps,
                        state=detached(w.part.state_dict()),
                        loss_sum=w.loss_sum,
                        aux_state=None if w.aux is None else detached(w.aux.state_dict()),
                    )
                )
            if server is not None:
                server_states[group] = detached(server.state_dict())
        return RoundResult(updates=updates, server_states=server_states)

    def _run_ring(self, model: BlockModel, plan: RoundPlan, worker, fetch) -> RoundResult:
        """RingSFL (Alg. 1–2): full local models, every client's batch around the ring."""
        ring = plan.ring
        n = model.num_blocks
        workers = {t.client: worker(t) for t in plan.tasks}
        # each client's local full model: its worker's (copied) blocks, no second copy
        models = {
            c: BlockModel([w.part.blocks[str(i)] for i in range(n)], model.cut_points)
            for c, w in workers.items()
        }
        lr = plan.tasks[0].lr
        for step in range(max(t.steps for t in plan.tasks)):
            active = {c: w for c, w in workers.items() if step < w.task.steps}
            batches = {c: fetch(w, step) for c, w in active.items()}
            losses = ring_batch_update(
                models, ring.order, ring.lengths, batches, ring.weights, lr, ring.dynamic_lr
            )
            for c, loss in losses.items():
                check_finite(torch.tensor(loss), c)
                size = len(batches[c][1])
                active[c].samples += size
                active[c].loss_sum += loss * size
        updates = [
            ClientUpdate(
                c, n, i, w.samples, w.task.steps, detached(models[c].state_dict()), w.loss_sum
            )
            for i, (c, w) in enumerate(workers.items())
        ]
        return RoundResult(updates=updates, server_states={})

    def _fwd(self, module: nn.Module, x: torch.Tensor, **kwargs) -> torch.Tensor:
        """``module(x)`` under the configured precision; logits/features back in fp32."""
        with precision_context(self.device, self.precision):
            return at_least_fp32(module(x, **kwargs))

    def _split_step(self, workers, server, server_opt, step, fetch, plan, gen) -> None:
        """One iteration of a group: device forwards, one server step on the combined loss
        (S²FL Eq. 3–4, MergeSFL Eq. 16; a single worker is plain split learning), then device
        updates from the returned gradients (or from their local loss)."""
        local_only = [w for w in workers if server is None or w.task.cut >= server.stop]
        for w in local_only:  # whole model on the device (FedAvg)
            x, y = fetch(w, step)
            loss = F.cross_entropy(self._fwd(w.part, x), y)
            self._device_update(w, loss, len(y), loss.item() * len(y))
        split = [w for w in workers if w not in local_only]
        if not split:
            return
        sent = []
        for w in split:
            x, y = fetch(w, step)
            fx = self._fwd(w.part, x)
            sent.append((w, fx, fx.detach().requires_grad_(), y))
        losses = self._server_losses(server, sent, plan.group_forward)
        for (w, *_), loss_sum in zip(sent, losses, strict=True):
            check_finite(loss_sum, w.task.client)
        sizes = [len(y) for *_, y in sent]
        loss = self._group_loss(losses, sizes, plan)
        if plan.mixup_alpha:
            mixed_terms, mixed_n = [], 0
            for fm, cut, ya, yb, lam in _mix_pairs(sent, gen, plan.mixup_alpha):
                out = self._fwd(server, fm, start=cut)
                mixed_terms.append(
                    lam * F.cross_entropy(out, ya, reduction="sum")
                    + (1 - lam) * F.cross_entropy(out, yb, reduction="sum")
                )
                mixed_n += len(ya)
            if mixed_terms:
                loss = (loss * sum(sizes) + torch.stack(mixed_terms).sum()) / (sum(sizes) + mixed_n)
        server_opt.zero_grad()
        loss.backward()
        server_opt.step()
        total = sum(sizes)
        for (w, fx, fx_server, y), loss_sum, size in zip(sent, losses, sizes, strict=True):
            if plan.device_loss == "local":
                local = F.cross_entropy(self._fwd(w.aux, fx), y)
                self._device_update(w, local, size, loss_sum.item())
                continue
            grad = fx_server.grad
            if plan.device_grad == "own" and plan.group_loss == "mean":
                grad = grad * (total / size)
            w.optimizer.zero_grad()
            fx.backward(grad)
            w.optimizer.step()
            w.samples += size
            w.loss_sum += loss_sum.item()

    def _server_losses(self, server, sent, group_forward: str) -> list[torch.Tensor]:
        """Each member's summed cross-entropy on the group's server part. ``separate``: one
        forward per member. ``concat`` (MergeSFL Eq. 16, S²FL's merged batches): one forward
        per cut point on its members' concatenated smashed data (member order), the output
        sliced back per member; autograd slices the input gradient the same way."""
        if group_forward == "separate":
            return [
                F.cross_entropy(self._fwd(server, fs, start=w.task.cut), y, reduction="sum")
                for w, _, fs, y in sent
            ]
        if group_forward != "concat":
            raise ValueError(f"group_forward must be concat or separate (got {group_forward!r})")
        by_cut: dict[int, list[int]] = {}
        for i, (w, *_) in enumerate(sent):
            by_cut.setdefault(w.task.cut, []).append(i)
        losses: list[torch.Tensor] = [torch.zeros(())] * len(sent)
        for cut, members in by_cut.items():
            fs = torch.cat([sent[i][2] for i in members])
            y = torch.cat([sent[i][3] for i in members])
            per_sample = F.cross_entropy(self._fwd(server, fs, start=cut), y, reduction="none")
            sizes = [len(sent[i][3]) for i in members]
            for i, part in zip(members, per_sample.split(sizes), strict=True):
                losses[i] = part.sum()
        return losses

    @staticmethod
    def _group_loss(losses, sizes, plan: RoundPlan) -> torch.Tensor:
        """S²FL Eq. (3): mean over the union of samples, or the sum of member means."""
        if plan.group_loss == "mean":
            return torch.stack(losses).sum() / sum(sizes)
        return sum(ls / s for ls, s in zip(losses, sizes, strict=True))

    @staticmethod
    def _device_update(w: _Worker, loss: torch.Tensor, size: int, loss_sum: float) -> None:
        check_finite(loss, w.task.client)
        w.optimizer.zero_grad()
        loss.backward()
        w.optimizer.step()
        w.samples += size
        w.loss_sum += loss_sum
