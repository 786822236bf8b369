"""The vectorised executor: many simulated clients as one batched computation.

Every client (and every server-side copy) of a round is a *row* of stacked parameter tensors;
the clients that share a cut point and a batch length this step run as one ``torch.func.vmap``
of ``functional_call`` over their rows (a batched/grouped convolution on the GPU), and so do
their server-side copies (SplitFed V1's per-client copies, S²FL's per-group copies). Each
iteration therefore costs a handful of large kernels instead of one small kernel per client.

It computes exactly what :class:`~splitfl.executors.sequential.SequentialExecutor` computes
(tested to fp32 tolerance for every algorithm):

* **Mixed cut points** — workers are bucketed per step by (cut, batch length); a server copy
  whose members have different cuts gathers its rows into several buckets and receives the sum
  of their gradients, as the sequential executor's group copy does.
* **Unequal batch sizes** (MergeSFL, AdaSFL, the short last batch of an epoch) — *bucketing*,
  not padding: a bucket holds only equal-length batches, so no sample is masked and BatchNorm
  sees exactly the client's batch.
* **BatchNorm** — running statistics are rows like the parameters: each client keeps its own.
  A group's server copy is run by several members in one step; its running statistics are
  combined afterwards in member order with the closed form of the sequential EMA
  (:func:`chain_ema`), so they equal the sequential result.
* **Merged batches** (``group_forward: concat``, MergeSFL/S²FL) — per group and cut point the
  members' smashed data are concatenated (across batch-length buckets) into one server-row
  batch; merged batches of equal cut and length share one batched call, and the per-member
  losses are slices of its output, so no plan of this kind falls back.
* **Optimiser** — SGD with momentum and weight decay applied row-wise (:func:`sgd_rows`), with
  torch's semantics: a row (or a server block not traversed this step) that received no
  gradient is not touched, its momentum buffer is created on its first update.
* **Dropout** — ``vmap(randomness="different")``: the masks differ from the sequential run's
  (same distribution), so models with dropout agree only statistically.

* **RingSFL's ring** — every start's batch visits blocks 0…W−1 in order, block b on the model
  of whichever client's segment covers it (Alg. 2), so block b of all starts is one vmap over
  the owners' rows; a client's block crossed by several starts collects the sum of their
  gradients and chains their BatchNorm updates, and v2 scales each block's rate by |U_j,(k)|.

Plans that are sequential by definition run on the reference executor: ``server_mode:
sequential`` (SplitFed V2, vanilla SL — each client's step depends on the previous client's
update) and LocFedMix-SL's mixup pairs (``mixup_alpha``). ``fallbacks`` counts them.

Memory scales with the round's participants: only their rows are stacked; the other
registered clients hold nothing but their data indices and algorithm state.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from splitfl.executors.common import (
    NonFiniteLossError,
    at_least_fp32,
    client_batches,
    precision_context,
    to_memory_format,
)
from splitfl.executors.sequential import SequentialExecutor
from splitfl.models import BlockModel, ModelPart, block_index
from splitfl.plan import ClientUpdate, RoundPlan, RoundResult
from splitfl.seeding import derive_seed


@dataclass
class RowStack:
    """Stacked copies ("rows") of one module's state, trained with row-wise SGD.

    ``params`` are leaf tensors ``[rows, ...]`` that collect gradients; ``buffers`` (BatchNorm
    running statistics) are updated in place; ``momentum``/``started`` hold SGD's buffers.
    """

    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    lr: torch.Tensor
    momentum: dict[str, torch.Tensor] = field(default_factory=dict)
    started: dict[str, torch.Tensor] = field(default_factory=dict)
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


def _expand(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
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
                    fresh = torch.where(_expand(started, d), buf.mul(momentum).add_(d), d)
                    buf = torch.where(_expand(mask, d), fresh, buf)
                stack.momentum[name] = buf
                started |= mask
                d = buf
            if every and same_lr is not None:
                p.add_(d, alpha=-same_lr)
            else:
                step = p - _expand(stack.lr, p) * d
                p.copy_(torch.where(_expand(mask, p), step, p))


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
    return keep**k * start + (_expand(powers, deltas) * deltas).sum(0)


def _bn_momenta(module: nn.Module) -> dict[str, float | None]:
    """``prefix.running_mean``/``running_var`` → the BatchNorm's momentum."""
    out: dict[str, float | None] = {}
    for name, m in module.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            for b in ("running_mean", "running_var", "num_batches_tracked"):
                out[f"{name}.{b}"] = m.momentum
    return out


@dataclass
class _Row:
    """A worker of the round: its stack, row, batches and counters."""

    task: object
    cut: int
    row: int
    group_row: int
    batches: list[torch.Tensor]
    samples: int = 0
    loss_sum: float = 0.0


@dataclass
class _Round:
    """What every step of a (non-ring) round works on."""

    model: BlockModel
    plan: RoundPlan
    device_stacks: dict[int, RowStack]
    server_stack: RowStack | None
    member_order: list[list[_Row]]
    momenta: dict[str, float | None]
    x_all: torch.Tensor
    y_all: torch.Tensor
    parts: dict[tuple[int, int], tuple[ModelPart, list[str]]] = field(default_factory=dict)

    def part(self, start: int, stop: int) -> tuple[ModelPart, list[str]]:
        """Blocks ``[start, stop)`` of the round's model and their state keys (built once)."""
        if (start, stop) not in self.parts:
            self.parts[start, stop] = _part(self.model, start, stop)
        return self.parts[start, stop]


def _part(model: BlockModel, start: int, stop: int) -> tuple[ModelPart, list[str]]:
    part = ModelPart(model, start, stop)
    return part, list(part.state_dict())


class VectorizedExecutor:
    """Runs all participants of a round as batched computations (see the module docstring)."""

    def __init__(
        self,
        device: str = "cpu",
        precision: str = "fp32",
        channels_last: bool = False,
        use_vmap: bool | None = None,
        max_rows: int | None = None,
    ):
        self.device = torch.device(device)
        #: How buckets run: ``vmap`` (default on GPUs), ``rows`` (one call per row on row
        #: leaves sharing the stacked state) or ``reference`` (default on CPU: the sequential
        #: loop itself). On 2 CPU cores neither batched mode reliably beats the loop — vmap's
        #: grouped convolutions ran at 0.49× for 10 ResNet-8 clients at batch 128, ``rows`` at
        #: 0.70–1.25× (benchmarks/README.md) — so CPU runs use the loop unless a mode is
        #: forced with ``use_vmap`` (the tests force both).
        if use_vmap is None:
            self.mode = "vmap" if self.device.type != "cpu" else "reference"
        else:
            self.mode = "vmap" if use_vmap else "rows"
        #: rows per batched call: all of a step's workers on GPUs; one group at a time on CPU,
        #: where batching gains nothing and holding every client's activations costs (100
        #: ResNet-8 clients at batch 128: 38 s vs 17 s sequential before this limit)
        self.max_rows = max_rows if max_rows is not None else (None if self.mode == "vmap" else 1)
        self.precision = precision
        self.channels_last = channels_last
        self.reference = SequentialExecutor(device, precision, channels_last)
        self.fallbacks = 0
        self._data: tuple[int, torch.Tensor, torch.Tensor] | None = None

    @staticmethod
    def batchable(plan: RoundPlan, model: BlockModel) -> bool:
        """Whether the plan runs vectorised (else: the reference executor). BatchNorm with a
        cumulative average (``momentum=None``) has no closed-form chaining (:func:`chain_ema`)."""
        ema_norms = all(
            m.momentum is not None
            for m in model.modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm)
        )
        if plan.ring is not None:
            return ema_norms
        split_plan = plan.server_mode == "per_step" and plan.device_loss == "server"
        return split_plan and not plan.mixup_alpha and ema_norms

    def _train_data(self, ctx) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = ctx.bundle.train.x, ctx.bundle.train.y
        if self._data is None or self._data[0] != id(x):
            self._data = (id(x), x.to(self.device), y.to(self.device))
        return self._data[1], self._data[2]

    # -- the round --------------------------------------------------------------------------
    def run_round(
        self, ctx, global_state: dict[str, torch.Tensor], plan: RoundPlan, round_seed: int
    ) -> RoundResult:
        if self.mode == "reference":
            return self.reference.run_round(ctx, global_state, plan, round_seed)
        if not self.batchable(plan, ctx.model):
            self.fallbacks += 1
            return self.reference.run_round(ctx, global_state, plan, round_seed)
        model: BlockModel = copy.deepcopy(ctx.model).to(self.device)
        model.load_state_dict(global_state)
        model.train()
        if plan.ring is not None:
            return self._run_ring(ctx, model, plan, round_seed)
        n = model.num_blocks
        x_all, y_all = self._train_data(ctx)
        groups = plan.groups()

        # rows: one device stack per cut point, one server stack over the groups that split
        by_cut: dict[int, list] = {}
        for tasks in groups.values():
            for t in tasks:
                by_cut.setdefault(t.cut, []).append(t)
        split_groups = [g for g, ts in groups.items() if any(t.cut < n for t in ts)]
        group_row = {g: i for i, g in enumerate(split_groups)}
        device_stacks: dict[int, RowStack] = {}
        rows: dict[int, _Row] = {}
        for cut, tasks in by_cut.items():
            part = ModelPart(model, 0, cut)
            base = part.state_dict()
            states = [base if t.init_state is None else {**base, **t.init_state} for t in tasks]
            device_stacks[cut] = RowStack.from_states(
                part, states, [t.lr for t in tasks], self.device
            )
            for i, t in enumerate(tasks):
                seed = derive_seed(round_seed, t.client)
                batches = client_batches(ctx.client_indices[t.client], t.batch_size, t.steps, seed)
                rows[t.client] = _Row(t, cut, i, group_row.get(t.group, -1), batches)
        server_stack, server_lo, server_part = None, n, None
        if split_groups:
            server_lo = min(t.cut for g in split_groups for t in groups[g] if t.cut < n)
            server_part = ModelPart(model, server_lo, n)
            base = server_part.state_dict()
            lrs = [
                plan.server_lr if plan.server_lr is not None else groups[g][0].lr
                for g in split_groups
            ]
            server_stack = RowStack.from_states(
                server_part, [base] * len(split_groups), lrs, self.device
            )
        momenta = _bn_momenta(server_part) if server_part is not None else {}
        member_order = [[rows[t.client] for t in groups[g] if t.cut < n] for g in split_groups]
        cfg = ctx.config.train
        round_ = _Round(
            model, plan, device_stacks, server_stack, member_order, momenta, x_all, y_all
        )
        for step in range(max(t.steps for t in plan.tasks)):
            active = [r for r in rows.values() if step < r.task.steps]
            for chunk in self._chunks(active):
                self._step(round_, chunk, step)
            for cut, stack in device_stacks.items():
                on = torch.zeros(stack.rows, dtype=torch.bool, device=self.device)
                for r in active:
                    if r.cut == cut:
                        on[r.row] = True
                sgd_rows(stack, dict.fromkeys(stack.params, on), cfg.momentum, cfg.weight_decay)
                stack.zero_grad()
            if server_stack is not None:
                masks = self._server_masks(server_stack, member_order, step, n)
                sgd_rows(server_stack, masks, cfg.momentum, cfg.weight_decay)
                server_stack.zero_grad()

        updates, server_states = [], {}
        for g, tasks in groups.items():
            for t in tasks:
                r = rows[t.client]
                state = device_stacks[r.cut].row_state(r.row)
                updates.append(
                    ClientUpdate(t.client, t.cut, g, r.samples, t.steps, state, r.loss_sum)
                )
            if g in group_row:
                lo = min(t.cut for t in tasks if t.cut < n)
                keys = [
                    k for k in server_stack.params | server_stack.buffers if block_index(k) >= lo
                ]
                server_states[g] = server_stack.row_state(group_row[g], keys)
        return RoundResult(updates=updates, server_states=server_states)

    def _chunks(self, active: list[_Row]) -> list[list[_Row]]:
        """Whole groups, packed up to ``max_rows`` rows per call (all at once when None).
        Groups are independent within a step, so any packing computes the same; smaller
        chunks hold fewer activations at once."""
        if self.max_rows is None:
            return [active]
        groups: dict[object, list[_Row]] = {}
        for r in active:
            key = r.group_row if r.group_row >= 0 else ("alone", r.task.client)
            groups.setdefault(key, []).append(r)
        chunks: list[list[_Row]] = [[]]
        for members in groups.values():
            if chunks[-1] and len(chunks[-1]) + len(members) > self.max_rows:
                chunks.append([])
            chunks[-1].extend(members)
        return chunks

    def _server_masks(self, stack: RowStack, members, step: int, n: int) -> dict:
        """Server row g, block b is updated iff an active member of g has cut ≤ b."""
        first = torch.full((stack.rows,), n, dtype=torch.long, device=self.device)
        for g, rows in enumerate(members):
            cuts = [r.cut for r in rows if step < r.task.steps]
            if cuts:
                first[g] = min(cuts)
        return {k: first <= block_index(k) for k in stack.params}

    # -- one iteration of every active worker ----------------------------------------------
    def _forward(
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
                outs.append(call(params, own, x[i]))
                for k, v in own.items():
                    after[k].append(v)
            return at_least_fp32(torch.stack(outs)), {k: torch.stack(v) for k, v in after.items()}

    def _batch(self, bucket: list[_Row], step: int, x_all, y_all):
        idx = torch.stack([r.batches[step] for r in bucket]).to(self.device)
        x = x_all[idx]
        if self.channels_last:
            x = to_memory_format(x)
        return x, y_all[idx]

    def _step(self, round_: _Round, active: list[_Row], step: int) -> None:
        """One iteration of every active worker (the batched twin of the sequential
        executor's ``_split_step``)."""
        plan = round_.plan
        device_stacks, server_stack = round_.device_stacks, round_.server_stack
        member_order, momenta = round_.member_order, round_.momenta
        x_all, y_all = round_.x_all, round_.y_all
        n = round_.model.num_blocks
        buckets: dict[tuple[int, int], list[_Row]] = {}
        for r in active:
            buckets.setdefault((r.cut, len(r.batches[step])), []).append(r)
        sent = []  # (bucket, fx, fx_server, y)
        for (cut, _), bucket in buckets.items():
            stack = device_stacks[cut]
            row_idx = [r.row for r in bucket]
            x, y = self._batch(bucket, step, x_all, y_all)
            out, buffers = self._forward(*round_.part(0, cut), stack, row_idx, x)
            stack.scatter_buffers(row_idx, buffers)
            if cut >= n:  # the whole model on the device (FedAvg)
                losses = _row_losses(out, y)
                _check_finite(losses, bucket)
                (losses / y.shape[1]).sum().backward()
                _account(bucket, losses, y.shape[1])
                continue
            fx_server = out.detach().requires_grad_(True)
            sent.append((bucket, out, fx_server, y))
        if not sent:
            return
        if plan.group_forward == "concat":
            server_losses, bn_results = self._server_concat(round_, sent)
        else:
            server_losses, bn_results = self._server_separate(round_, sent)
        group_loss: dict[int, list] = {}
        for (bucket, _, _, y), losses in zip(sent, server_losses, strict=True):
            _check_finite(losses, bucket)
            for i, r in enumerate(bucket):
                group_loss.setdefault(r.group_row, []).append((losses[i], y.shape[1]))
        group_samples = {g: sum(s for _, s in members) for g, members in group_loss.items()}
        total = []
        for g, members in group_loss.items():
            if plan.group_loss == "mean":
                total.append(torch.stack([ls for ls, _ in members]).sum() / group_samples[g])
            else:
                total.append(sum(ls / s for ls, s in members))
        torch.stack(total).sum().backward()
        self._combine_server_buffers(server_stack, bn_results, member_order, momenta)
        for (bucket, fx, fs, y), losses in zip(sent, server_losses, strict=True):
            grad = fs.grad
            if plan.device_grad == "own" and plan.group_loss == "mean":
                scale = [group_samples[r.group_row] / y.shape[1] for r in bucket]
                factor = torch.tensor(scale, dtype=grad.dtype, device=grad.device)
                grad = grad * _expand(factor, grad)
            fx.backward(grad)
            _account(bucket, losses.detach(), y.shape[1])

    def _server_separate(self, round_: _Round, sent: list) -> tuple[list, dict]:
        """Server forwards per device bucket, member by member (``group_forward: separate``):
        each bucket's per-row summed losses, and BatchNorm results keyed by member."""
        n, stack = round_.model.num_blocks, round_.server_stack
        server_losses, bn_results = [], {}
        for bucket, _, fs, y in sent:
            cut = bucket[0].cut
            grows = [r.group_row for r in bucket]
            out, buffers = self._forward(
                *round_.part(cut, n), stack, grows, fs, keep_stack_buffers=True, start=cut
            )
            server_losses.append(_row_losses(out, y))
            for i, r in enumerate(bucket):
                for k, v in buffers.items():
                    bn_results.setdefault(k, []).append((r, v[i]))
        return server_losses, bn_results

    def _server_concat(self, round_: _Round, sent: list) -> tuple[list, dict]:
        """``group_forward: concat`` (MergeSFL Eq. 16): per group and cut point, the members'
        smashed data concatenated in member order (across device buckets) is one server row's
        batch; merged batches of equal cut and length run as one batched call. Returns what
        :meth:`_server_separate` returns; a merged batch's BatchNorm result is ranked by its
        first member (the sequential executor's order of cut points)."""
        n, stack = round_.model.num_blocks, round_.server_stack
        rank = {id(r): k for members in round_.member_order for k, r in enumerate(members)}
        merged: dict[tuple[int, int], list[tuple[_Row, int, int]]] = {}
        for j, (bucket, *_) in enumerate(sent):
            for i, r in enumerate(bucket):
                merged.setdefault((r.group_row, r.cut), []).append((r, j, i))
        calls: dict[tuple[int, int], list[list[tuple[_Row, int, int]]]] = {}
        for (_, cut), members in merged.items():
            members.sort(key=lambda m: rank[id(m[0])])
            length = sum(sent[j][3].shape[1] for _, j, _ in members)
            calls.setdefault((cut, length), []).append(members)
        member_loss: dict[tuple[int, int], torch.Tensor] = {}
        bn_results: dict[str, list] = {}
        for (cut, _), batches in calls.items():
            x = torch.stack([torch.cat([sent[j][2][i] for _, j, i in b]) for b in batches])
            y = torch.stack([torch.cat([sent[j][3][i] for _, j, i in b]) for b in batches])
            grows = [b[0][0].group_row for b in batches]
            out, buffers = self._forward(
                *round_.part(cut, n), stack, grows, x, keep_stack_buffers=True, start=cut
            )
            per_sample = F.cross_entropy(out.flatten(0, 1), y.flatten(), reduction="none")
            per_sample = per_sample.view(y.shape)
            for row, b in enumerate(batches):
                sizes = [sent[j][3].shape[1] for _, j, _ in b]
                for (_, j, i), part in zip(b, per_sample[row].split(sizes), strict=True):
                    member_loss[j, i] = part.sum()
                for k, v in buffers.items():
                    bn_results.setdefault(k, []).append((b[0][0], v[row]))
        server_losses = [
            torch.stack([member_loss[j, i] for i in range(len(bucket))])
            for j, (bucket, *_) in enumerate(sent)
        ]
        return server_losses, bn_results

    @staticmethod
    def _combine_server_buffers(stack, results, member_order, momenta) -> None:
        """Each group's BatchNorm statistics after its members' forwards in order."""
        if stack is None:
            return
        rank = {id(r): i for members in member_order for i, r in enumerate(members)}
        ranked = {
            key: [(r.group_row, rank[id(r)], v) for r, v in items] for key, items in results.items()
        }
        chain_buffers(stack, ranked, momenta)

    # -- RingSFL ------------------------------------------------------------------------------
    def _run_ring(self, ctx, model: BlockModel, plan: RoundPlan, round_seed: int) -> RoundResult:
        """RingSFL's BatchUpdate (Alg. 2) for every start at once: each start's batch visits
        blocks 0…W−1 in order, block b on the model of the client whose segment covers b, so
        block b of all starts is one vmap over the owners' rows (a row appears once per start
        through it and collects the sum of their gradients, as the sequential ring does)."""
        ring = plan.ring
        n = model.num_blocks
        x_all, y_all = self._train_data(ctx)
        full = ModelPart(model, 0, n)
        base = full.state_dict()
        tasks = plan.tasks
        states = [base if t.init_state is None else {**base, **t.init_state} for t in tasks]
        stack = RowStack.from_states(full, states, [t.lr for t in tasks], self.device)
        row = {t.client: i for i, t in enumerate(tasks)}
        blocks = [_part(model, b, b + 1) for b in range(n)]
        momenta = _bn_momenta(full)
        owner = {}
        for t in tasks:
            for client, lo, hi in ring.segments(t.client):
                for b in range(lo, hi):
                    owner[t.client, b] = row[client]
        workers = [
            _Row(
                t,
                n,
                i,
                i,
                client_batches(
                    ctx.client_indices[t.client],
                    t.batch_size,
                    t.steps,
                    derive_seed(round_seed, t.client),
                ),
            )
            for i, t in enumerate(tasks)
        ]
        lr = tasks[0].lr
        for step in range(max(t.steps for t in tasks)):
            active = [w for w in workers if step < w.task.steps]
            buckets: dict[int, list[_Row]] = {}
            for w in active:
                buckets.setdefault(len(w.batches[step]), []).append(w)
            rank = {id(w): i for i, w in enumerate(active)}
            results: dict[str, list] = {}
            total = []
            for bucket in buckets.values():
                x, y = self._batch(bucket, step, x_all, y_all)
                h = x
                for b, (part, keys) in enumerate(blocks):
                    rows = [owner[w.task.client, b] for w in bucket]
                    h, buffers = self._forward(part, keys, stack, rows, h, keep_stack_buffers=True)
                    for k, v in buffers.items():
                        results.setdefault(k, []).extend(
                            (r, rank[id(w)], v[i])
                            for i, (r, w) in enumerate(zip(rows, bucket, strict=True))
                        )
                means = _row_losses(h, y) / y.shape[1]
                _check_finite(means, bucket)
                weights = torch.tensor(
                    [ring.weights[w.task.client] for w in bucket], dtype=means.dtype
                )
                total.append((weights.to(means.device) * means).sum())
                for w, loss in zip(bucket, means.detach().tolist(), strict=True):
                    w.samples += y.shape[1]
                    w.loss_sum += loss * y.shape[1]
            torch.stack(total).sum().backward()
            chain_buffers(stack, results, momenta)
            counts = ring.overlap_counts(n, [w.task.client for w in active])
            rates = [  # per block, per row: lr (v2: × |U_j,(k)|), 0 where no batch passed
                torch.tensor(
                    [lr * (c if ring.dynamic_lr else 1) * (c > 0) for c in per_row],
                    dtype=stack.lr.dtype,
                    device=self.device,
                )
                for per_row in zip(*(counts[t.client] for t in tasks), strict=True)
            ]
            stack.collect_row_grads()
            with torch.no_grad():
                for key, p in stack.params.items():
                    p.sub_(_expand(rates[block_index(key)], p) * p.grad)
            stack.zero_grad()
        updates = [
            ClientUpdate(
                w.task.client, n, i, w.samples, w.task.steps, stack.row_state(i), w.loss_sum
            )
            for i, w in enumerate(workers)
        ]
        return RoundResult(updates=updates, server_states={})


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


def _row_losses(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-row summed cross-entropy of ``[rows, batch, classes]`` logits."""
    flat = F.cross_entropy(at_least_fp32(logits.flatten(0, 1)), y.flatten(), reduction="none")
    return flat.view(y.shape).sum(1)


def _check_finite(losses: torch.Tensor, bucket: list[_Row]) -> None:
    bad = ~torch.isfinite(losses)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise NonFiniteLossError(
            f"non-finite training loss ({losses[i].item()}) at client {bucket[i].task.client}"
        )


def _account(bucket: list[_Row], losses: torch.Tensor, size: int) -> None:
    for r, loss in zip(bucket, losses.detach().tolist(), strict=True):
        r.samples += size
        r.loss_sum += loss
