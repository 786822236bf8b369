"""Executors run a :class:`~splitfl.algorithms.base.RoundPlan`; the per-batch loop lives here.

:class:`SequentialExecutor` is the reference: clients one after another, the way the papers'
own code runs. Other executors (GPU-vectorised, networked) must return the same
:class:`~splitfl.algorithms.base.RoundResult` for the same plan.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from splitfl.algorithms.base import ClientTask, ClientUpdate, RoundPlan, RoundResult
from splitfl.models import BlockModel, ModelPart
from splitfl.seeding import derive_seed


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN/inf loss."""


def _sgd(module: nn.Module, lr: float, config) -> torch.optim.Optimizer:
    params = [p for p in module.parameters() if p.requires_grad]
    return torch.optim.SGD(
        params, lr=lr, momentum=config.train.momentum, weight_decay=config.train.weight_decay
    )


def client_batches(
    indices: np.ndarray, batch_size: int, steps: int, seed: int
) -> list[torch.Tensor]:
    """``steps`` mini-batches of sample indices, reshuffled every epoch (seeded)."""
    gen = torch.Generator().manual_seed(seed)
    pool = torch.as_tensor(indices, dtype=torch.long)
    out: list[torch.Tensor] = []
    while len(out) < steps:
        perm = pool[torch.randperm(len(pool), generator=gen)]
        out.extend(perm.split(batch_size))
    return out[:steps]


def _check_finite(loss: torch.Tensor, client: int) -> None:
    if not torch.isfinite(loss):
        raise NonFiniteLossError(f"non-finite training loss ({loss.item()}) at client {client}")


@dataclass
class _Worker:
    """A participant's device part, optimiser and batches for the round."""

    task: ClientTask
    part: ModelPart
    optimizer: torch.optim.Optimizer
    batches: list[torch.Tensor]
    samples: int = 0
    loss_sum: float = 0.0


class SequentialExecutor:
    """Reference executor on one torch device (CPU by default)."""

    def __init__(self, device: str = "cpu"):
        self.device = torch.device(device)

    def run_round(
        self, ctx, global_state: dict[str, torch.Tensor], plan: RoundPlan, round_seed: int
    ) -> RoundResult:
        model: BlockModel = copy.deepcopy(ctx.model).to(self.device)
        model.load_state_dict(global_state)
        model.train()
        x_all, y_all = ctx.bundle.train.x, ctx.bundle.train.y
        n = model.num_blocks

        def worker(task: ClientTask) -> _Worker:
            part = copy.deepcopy(ModelPart(model, 0, task.cut))
            seed = derive_seed(round_seed, task.client)
            batches = client_batches(
                ctx.client_indices[task.client], task.batch_size, task.steps, seed
            )
            return _Worker(task, part, _sgd(part, task.lr, ctx.config), batches)

        def fetch(w: _Worker, step: int) -> tuple[torch.Tensor, torch.Tensor]:
            idx = w.batches[step]
            return x_all[idx].to(self.device), y_all[idx].to(self.device)

        updates: list[ClientUpdate] = []
        server_states: dict[int, dict[str, torch.Tensor]] = {}
        for group, tasks in plan.groups().items():
            workers = [worker(t) for t in tasks]
            split_cuts = [t.cut for t in tasks if t.cut < n]
            server = copy.deepcopy(ModelPart(model, min(split_cuts), n)) if split_cuts else None
            lr = plan.server_lr if plan.server_lr is not None else tasks[0].lr
            server_opt = _sgd(server, lr, ctx.config) if server is not None else None
            if plan.server_mode == "sequential":
                order = {c: i for i, c in enumerate(plan.order)}
                for w in sorted(workers, key=lambda w: order.get(w.task.client, 0)):
                    for step in range(w.task.steps):
                        self._split_step([w], server, server_opt, step, fetch, plan)
            else:
                for step in range(max(t.steps for t in tasks)):
                    active = [w for w in workers if step < w.task.steps]
                    self._split_step(active, server, server_opt, step, fetch, plan)
            for w in workers:
                updates.append(
                    ClientUpdate(
                        client=w.task.client,
                        cut=w.task.cut,
                        group=group,
                        samples=w.samples,
                        steps=w.task.steps,
                        state={k: v.detach().cpu() for k, v in w.part.state_dict().items()},
                        loss_sum=w.loss_sum,
                    )
                )
            if server is not None:
                server_states[group] = {k: v.detach().cpu() for k, v in server.state_dict().items()}
        return RoundResult(updates=updates, server_states=server_states)

    def _split_step(self, workers, server, server_opt, step, fetch, plan: RoundPlan) -> None:
        """One iteration of a group: device forwards, one server step on the combined loss
        (S²FL Eq. 3–4; a single worker is plain split learning), device backwards."""
        local_only = [w for w in workers if server is None or w.task.cut >= server.stop]
        for w in local_only:  # whole model on the device (FedAvg)
            x, y = fetch(w, step)
            loss = F.cross_entropy(w.part(x), y)
            _check_finite(loss, w.task.client)
            w.optimizer.zero_grad()
            loss.backward()
            w.optimizer.step()
            w.samples += len(y)
            w.loss_sum += loss.item() * len(y)
        split = [w for w in workers if w not in local_only]
        if not split:
            return
        sent, losses, sizes = [], [], []
        for w in split:
            x, y = fetch(w, step)
            fx = w.part(x)
            fx_server = fx.detach().requires_grad_()
            loss_sum = F.cross_entropy(server(fx_server, start=w.task.cut), y, reduction="sum")
            _check_finite(loss_sum, w.task.client)
            sent.append((w, fx, fx_server))
            losses.append(loss_sum)
            sizes.append(len(y))
        total = sum(sizes)
        if plan.group_loss == "mean":
            loss = torch.stack(losses).sum() / total
        else:
            loss = sum(ls / s for ls, s in zip(losses, sizes, strict=True))
        server_opt.zero_grad()
        loss.backward()
        server_opt.step()
        for (w, fx, fx_server), ls, size in zip(sent, losses, sizes, strict=True):
            grad = fx_server.grad
            if plan.device_grad == "own" and plan.group_loss == "mean":
                grad = grad * (total / size)
            w.optimizer.zero_grad()
            fx.backward(grad)
            w.optimizer.step()
            w.samples += size
            w.loss_sum += ls.item()


EXECUTORS = {"sequential": SequentialExecutor}


def make_executor(name: str) -> SequentialExecutor:
    return EXECUTORS[name]()


def evaluate(
    model: BlockModel, x: torch.Tensor, y: torch.Tensor, batch_size: int
) -> tuple[float, float]:
    """Accuracy and mean cross-entropy of ``model`` on ``(x, y)`` in eval mode."""
    model.eval()
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for start in range(0, len(y), batch_size):
            xb, yb = x[start : start + batch_size], y[start : start + batch_size]
            logits = model(xb)
            loss_sum += F.cross_entropy(logits, yb, reduction="sum").item()
            correct += int((logits.argmax(1) == yb).sum())
    return correct / len(y), loss_sum / len(y)
