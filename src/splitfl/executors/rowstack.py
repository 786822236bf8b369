"""Row-stacked tensors: the machinery of the vectorised executors.

Every client (and every server-side copy) of a round is a *row* of stacked parameter tensors
(:class:`RowStack`); the rows that share a module and a batch length run as one
``torch.func.vmap`` of ``functional_call`` (or row by row on row leaves of the stack,
:meth:`RowRunner.forward`) and are trained with row-wise SGD (:func:`sgd_rows`, torch's
semantics). BatchNorm running statistics are rows too; a row run several times in one step
gets the closed form of the sequential EMA (:func:`chain_ema`, :func:`chain_buffers`).
Dropout uses ``vmap(randomness="different")``: the masks differ from the sequential run's
(same distribution).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.func import functional_call, vmap

from splitfl.config import TrainConfig
from splitfl.core.activations import row_of, stack_rows
from splitfl.data.transforms import Transforms, augment_batch, batch_seed
from splitfl.models import BlockModel, ModelPart
from splitfl.roles.common import (
    NonFiniteLossError,
    at_least_fp32,
    precision_context,
    to_memory_format,
)
from splitfl.training import loss_fn


@dataclass
class RowStack:
    """Stacked copies ("rows") of one module's state, trained with row-wise SGD.

    ``params`` are leaf tensors ``[rows, ...]`` that collect gradients; ``buffers`` (BatchNorm
    running statistics) are updated in place; ``momentum``/``started`` hold SGD's buffers
    (``momentum``, ``second``, ``steps``: Adam's moments and step counts).
    """

    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    lr: torch.Tensor
    momentum: dict[str, torch.Tensor] = field(default_factory=dict)
    started: dict[str, torch.Tensor] = field(default_factory=dict)
    #: Adam/AdamW: second moments and per-row step counts (first moments in ``momentum``)
    second: dict[str, torch.Tensor] = field(default_factory=dict)
    steps: dict[str, torch.Tensor] = field(default_factory=dict)
    row_leaves: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)

    @classmethod
    def from_states(
        cls, module: nn.Module, states: list[dict[str, torch.Tensor]], lrs: list[float], device
    ) -> RowStack:
        names = dict(module.named_parameters())
        params, buffers = {}, {}
        for key in module.state_dict():
            stacked = torch.stack([s[key] for s in states]).to(device)
            if key in names:
                params[key] = stacked.requires_grad_(True)
            else:
                buffers[key] = stacked
        dtype = next(iter(params.values())).dtype if params else torch.float32
        lr = torch.tensor(lrs, dtype=dtype, device=device)
        return cls(params, buffers, lr)

    @property
    def rows(self) -> int:
        return len(self.lr)

    def row_state(self, row: int, keys: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
        chosen = list(keys) if keys is not None else [*self.params, *self.buffers]
        both = {**self.params, **self.buffers}
        return {k: both[k][row].detach().cpu().clone() for k in chosen}

    def gather(self, rows: list[int], keys: Iterable[str]) -> tuple[dict, dict]:
        """Parameters (differentiable w.r.t. the stack) and buffers of ``rows``: the stack's
        own tensors when ``rows`` is every row in order (updated in place by BatchNorm), else
        copies (see :meth:`scatter_buffers`)."""
        pick = None if rows == list(range(self.rows)) else torch.tensor(rows, device=self.lr.device)
        params, buffers = {}, {}
        for k in keys:
            if k in self.params:
                params[k] = self.params[k] if pick is None else self.params[k][pick]
            elif k in self.buffers:
                # a copy unless every row: BatchNorm saves its buffers for backward, so two
                # buckets updating views of one stack in place would invalidate each other
                buffers[k] = self.buffers[k] if pick is None else self.buffers[k][pick].clone()
        return params, buffers

    def scatter_buffers(self, rows: list[int], buffers: dict[str, torch.Tensor]) -> None:
        """Write per-row buffers (copies a forward updated) back to ``rows``; tensors that are
        the stack's own were updated in place already."""
        index = torch.tensor(rows, device=self.lr.device)
        with torch.no_grad():
            for k, v in buffers.items():
                if v is not self.buffers[k]:
                    self.buffers[k][index] = v

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None
        self.row_leaves.clear()

    def row_param(self, key: str, row: int) -> torch.Tensor:
        """Row ``row`` of parameter ``key`` as its own leaf for this step (shares the stack's
        storage). Row-by-row calls differentiate these instead of views of the stack, whose
        backward would materialise a full-stack-sized gradient per row;
        :meth:`collect_row_grads` moves their gradients into the stack."""
        leaf = self.row_leaves.get((key, row))
        if leaf is None:
            leaf = self.params[key][row].detach().requires_grad_(True)
            self.row_leaves[key, row] = leaf
        return leaf

    def collect_row_grads(self) -> None:
        """Add the row leaves' gradients into the stacked parameters' ``.grad``."""
        if not self.row_leaves:
            return
        for (key, row), leaf in self.row_leaves.items():
            if leaf.grad is None:
                continue
            p = self.params[key]
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad[row] += leaf.grad
        self.row_leaves.clear()


def expand_rows(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """One value per row, shaped to broadcast against the row-stacked tensor ``like``."""
    return values.view(-1, *([1] * (like.dim() - 1)))


def sgd_rows(
    stack: RowStack, masks: dict[str, torch.Tensor], momentum: float, weight_decay: float
) -> None:
    """``torch.optim.SGD`` (no dampening, not Nesterov) applied to each row independently:
    d = g + λ·p; b = d on a row's first update, else μ·b + d; p ← p − η_row·b. Rows where
    ``masks[name]`` is False (no gradient this step) are left untouched."""
    stack.collect_row_grads()
    lrs = stack.lr.tolist()
    same_lr = lrs[0] if all(lr == lrs[0] for lr in lrs) else None
    with torch.no_grad():
        for name, p in stack.params.items():
            g = p.grad
            mask = masks.get(name)
            if g is None or mask is None or not bool(mask.any()):
                continue
            every = bool(mask.all())
            d = g.add_(p, alpha=weight_decay) if weight_decay else g
            if momentum:
                started = stack.started.setdefault(
                    name, torch.zeros(stack.rows, dtype=torch.bool, device=p.device)
                )
                buf = stack.momentum.get(name)
                if buf is None:
                    buf = d.clone()
                elif every and bool(started.all()):  # the common case, in place
                    buf.mul_(momentum).add_(d)
                else:
                    fresh = torch.where(expand_rows(started, d), buf.mul(momentum).add_(d), d)
                    buf = torch.where(expand_rows(mask, d), fresh, buf)
                stack.momentum[name] = buf
                started |= mask
                d = buf
            if every and same_lr is not None:
                p.add_(d, alpha=-same_lr)
            else:
                step = p - expand_rows(stack.lr, p) * d
                p.copy_(torch.where(expand_rows(mask, p), step, p))


def step_rows(stack: RowStack, masks: dict[str, torch.Tensor], train: TrainConfig) -> None:
    """``train.optimizer`` applied to each row of ``stack`` where ``masks`` allow:
    :func:`sgd_rows` or :func:`adam_rows`."""
    if train.optimizer == "sgd":
        sgd_rows(stack, masks, train.momentum, train.weight_decay)
    else:
        adam_rows(stack, masks, train)


def adam_rows(stack: RowStack, masks: dict[str, torch.Tensor], train: TrainConfig) -> None:
    """``torch.optim.Adam`` / ``AdamW`` (not amsgrad, not maximize) applied to each row
    independently, with per-row step counts t: AdamW first decays p ← p·(1 − η·λ), Adam adds
    λ·p to the gradient; m ← β1·m + (1−β1)·g; v ← β2·v + (1−β2)·g²;
    p ← p − η/(1−β1^t) · m / (√v / √(1−β2^t) + ε). Rows where ``masks[name]`` is False
    (no gradient this step) are left untouched, their moments and step counts too."""
    stack.collect_row_grads()
    b1, b2, eps, decay = train.beta1, train.beta2, train.eps, train.weight_decay
    with torch.no_grad():
        for name, p in stack.params.items():
            g, mask = p.grad, masks.get(name)
            if g is None or mask is None or not bool(mask.any()):
                continue
            on, lr = expand_rows(mask, p), expand_rows(stack.lr, p)
            t = stack.steps.get(name, torch.zeros(stack.rows, dtype=p.dtype, device=p.device))
            t = torch.where(mask, t + 1, t)
            base = p * (1 - lr * decay) if train.optimizer == "adamw" and decay else p
            if train.optimizer == "adam" and decay:
                g = g.add(p, alpha=decay)
            m0 = stack.momentum.get(name, torch.zeros_like(p))
            v0 = stack.second.get(name, torch.zeros_like(p))
            m = m0.lerp(g, 1 - b1)
            v = v0.mul(b2).addcmul_(g, g, value=1 - b2)
            tt = expand_rows(t.clamp(min=1), p)
            denom = (v.sqrt() / (1 - b2**tt).sqrt()).add_(eps)
            step = base - (lr / (1 - b1**tt)) * m / denom
            p.copy_(torch.where(on, step, p))
            stack.momentum[name] = torch.where(on, m, m0)
            stack.second[name] = torch.where(on, v, v0)
            stack.steps[name] = t


def chain_ema(start: torch.Tensor, results: torch.Tensor, momentum: float) -> torch.Tensor:
    """The running statistic after k BatchNorm updates applied one after another, from k
    updates that each started from ``start``: with r_i = (1−m)·r0 + m·s_i,
    r_k = (1−m)^k·r0 + Σ_i (1−m)^(k−i)·(r_i − (1−m)·r0)."""
    k = results.shape[0]
    keep = 1.0 - momentum
    powers = torch.tensor(
        [keep ** (k - 1 - i) for i in range(k)], dtype=results.dtype, device=results.device
    )
    deltas = results - keep * start
    return keep**k * start + (expand_rows(powers, deltas) * deltas).sum(0)


def bn_momenta(module: nn.Module) -> dict[str, float | None]:
    """``prefix.running_mean``/``running_var`` → the BatchNorm's momentum."""
    out: dict[str, float | None] = {}
    for name, m in module.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            for b in ("running_mean", "running_var", "num_batches_tracked"):
                out[f"{name}.{b}"] = m.momentum
    return out


def chain_buffers(stack: RowStack, results: dict[str, list], momenta: dict) -> None:
    """Set each row's BatchNorm statistics to the result of its forwards in rank order:
    ``results[key]`` holds ``(row, rank, value after that forward alone)``; see
    :func:`chain_ema`."""
    with torch.no_grad():
        for key, items in results.items():
            by_row: dict[int, list] = {}
            for r, rank, v in items:
                by_row.setdefault(r, []).append((rank, v))
            for r, vals in by_row.items():
                vals.sort(key=lambda p: p[0])
                start = stack.buffers[key][r]
                if key.endswith("num_batches_tracked"):
                    stack.buffers[key][r] = start + len(vals)
                else:
                    values = torch.stack([v for _, v in vals])
                    stack.buffers[key][r] = chain_ema(start, values, momenta[key])


@dataclass
class WorkerRow:
    """A worker of the round: its task, cut, stack row, server (group) row, batches and
    counters."""

    task: object
    cut: int
    row: int
    group_row: int
    batches: list[torch.Tensor]
    samples: int = 0
    loss_sum: float = 0.0


@dataclass(frozen=True)
class RowRunner:
    """How a bucket of rows runs: ``mode`` ``vmap`` (one batched call) or ``rows`` (one call
    per row on row leaves sharing the stacked state), on ``device`` at ``precision``, with
    training loss ``loss`` (``train.loss``)."""

    mode: str
    device: torch.device
    precision: str
    channels_last: bool
    loss: str = "cross_entropy"
    augment: Transforms | None = None
    round_seed: int = 0

    def forward(
        self,
        module: nn.Module,
        keys: list[str],
        stack: RowStack,
        rows: list[int],
        x: torch.Tensor,
        keep_stack_buffers: bool = False,
        **kwargs,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``module`` with the state of ``stack``'s ``rows`` (row i on ``x[i]``): one vmap, or
        row by row on row leaves of the stacked parameters. Returns the outputs and each row's
        buffers after its forward; the stack's buffers are updated in place only where they
        are the returned tensors and ``keep_stack_buffers`` is False. ``keys``: the module's
        state keys."""

        def call(p, b, xb):
            return functional_call(module, (p, b), (xb,), kwargs)

        with precision_context(self.device, self.precision):
            if self.mode == "vmap" and len(rows) > 1:
                params, buffers = stack.gather(rows, keys)
                if keep_stack_buffers:
                    buffers = {k: v.clone() for k, v in buffers.items()}
                out = vmap(call, randomness="different")(params, buffers, x)
                return at_least_fp32(out), buffers
            outs, after = [], {k: [] for k in keys if k in stack.buffers}
            for i, r in enumerate(rows):
                own = {k: stack.buffers[k][r].clone() for k in after}
                params = {k: stack.row_param(k, r) for k in keys if k in stack.params}
                outs.append(call(params, own, row_of(x, i)))
                for k, v in own.items():
                    after[k].append(v)
            return at_least_fp32(stack_rows(outs)), {k: torch.stack(v) for k, v in after.items()}

    def batch(self, bucket: list[WorkerRow], step: int, x_all, y_all):
        """The bucket's ``step``-th batches, stacked ``[rows, batch, ...]`` on the device."""
        idx = torch.stack([r.batches[step] for r in bucket]).to(self.device)
        x = x_all[idx]
        if self.augment is not None and self.augment.augment:  # as Runtime.batch, per row
            seeds = [batch_seed(self.round_seed, r.task.client, step) for r in bucket]
            x = torch.stack(
                [augment_batch(self.augment, xr, s) for xr, s in zip(x, seeds, strict=True)]
            )
        if self.channels_last:
            x = to_memory_format(x)
        return x, y_all[idx]


def model_part(model: BlockModel, start: int, stop: int) -> tuple[ModelPart, list[str]]:
    """Blocks ``[start, stop)`` of ``model`` and their state keys."""
    part = ModelPart(model, start, stop)
    return part, list(part.state_dict())


def row_losses(logits: torch.Tensor, y: torch.Tensor, loss: str) -> torch.Tensor:
    """Per-row summed ``loss`` (``train.loss``) of ``[rows, batch, outputs]`` logits against
    ``[rows, batch, ...]`` targets."""
    flat = loss_fn(loss)(at_least_fp32(logits.flatten(0, 1)), y.flatten(0, 1), reduction="none")
    return flat.view(y.shape[:2]).sum(1)


def check_finite(losses: torch.Tensor, bucket: list[WorkerRow]) -> None:
    """Raise :class:`NonFiniteLossError` naming the first worker whose loss is not finite."""
    bad = ~torch.isfinite(losses)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise NonFiniteLossError(
            f"non-finite training loss ({losses[i].item()}) at client {bucket[i].task.client}"
        )


def account(bucket: list[WorkerRow], losses: torch.Tensor, size: int) -> None:
    """Add each worker's summed loss and ``size`` samples to its counters."""
    for r, loss in zip(bucket, losses.detach().tolist(), strict=True):
        r.samples += size
        r.loss_sum += loss
