"""One iteration of a batched split round (the vectorised twin of the sequential executor's
``_split_step``): device forwards per (cut, batch length) bucket, the server side per group —
separately per member or on the merged batch (``group_forward: concat``, MergeSFL Eq. 16) —
each group's loss (``group_loss``), and the devices' backward with their gradient of
``device_grad``. The round around it is :class:`~splitfl.executors.vectorized.
VectorizedExecutor`; the row machinery is :mod:`splitfl.executors.rowstack`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from splitfl.core.activations import (
    as_server_input,
    backward,
    cat,
    input_grad,
    map_grad,
    row_of,
    stack_rows,
)
from splitfl.core.plan import RoundPlan
from splitfl.executors.rowstack import (
    RowRunner,
    RowStack,
    WorkerRow,
    account,
    chain_buffers,
    check_finite,
    expand_rows,
    model_part,
    row_losses,
)
from splitfl.models import BlockModel, ModelPart
from splitfl.roles.cut_record import Tap
from splitfl.roles.sides import group_loss, own_grad_factor
from splitfl.training import loss_fn


@dataclass
class SplitRound:
    """What every step of a (non-ring) round works on: the rows, their stacks and the data."""

    model: BlockModel
    plan: RoundPlan
    runner: RowRunner
    rows: dict[int, WorkerRow]
    group_row: dict[int, int]
    device_stacks: dict[int, RowStack]
    server_stack: RowStack | None
    member_order: list[list[WorkerRow]]
    momenta: dict[str, float | None]
    x_all: torch.Tensor
    y_all: torch.Tensor
    tap: Tap | None = None
    parts: dict[tuple[int, int], tuple[ModelPart, list[str]]] = field(default_factory=dict)

    def part(self, start: int, stop: int) -> tuple[ModelPart, list[str]]:
        """Blocks ``[start, stop)`` of the round's model and their state keys (built once)."""
        if (start, stop) not in self.parts:
            self.parts[start, stop] = model_part(self.model, start, stop)
        return self.parts[start, stop]


def split_step(round_: SplitRound, active: list[WorkerRow], step: int) -> None:
    """One iteration of every active worker (the batched twin of the sequential
    executor's ``_split_step``)."""
    plan = round_.plan
    sent = _device_forward(round_, active, step)
    if not sent:
        return
    spec = plan.topology.server
    if spec.forward == "concat":
        server_losses, bn_results = _server_concat(round_, sent)
    else:
        server_losses, bn_results = _server_separate(round_, sent)
    group_sizes = _server_backward(round_, sent, server_losses, bn_results)
    for (bucket, fx, fs, y), losses in zip(sent, server_losses, strict=True):
        grad = input_grad(fs)
        if spec.device_grad == "own":
            mode, size = spec.group_loss, y.shape[1]
            scale = [own_grad_factor(size, group_sizes[r.group_row], mode) for r in bucket]
            # float64: the sequential executor's Python-float factor, cast to the gradient's
            # dtype below (a float32 tensor here rounded it ~3e-8 off in float64 runs)
            factor = torch.tensor(scale, dtype=torch.float64, device=y.device)
            grad = map_grad(lambda g, f=factor: g * expand_rows(f.to(g.dtype), g), grad)
        backward(fx, grad)
        account(bucket, losses.detach(), y.shape[1])


def _device_forward(round_: SplitRound, active: list[WorkerRow], step: int) -> list:
    """Device forwards per (cut, batch length) bucket; whole-model buckets (FedAvg) train
    right away. Returns ``(bucket, fx, fx_server, y)`` for the buckets that split."""
    n = round_.model.num_blocks
    buckets: dict[tuple[int, int], list[WorkerRow]] = {}
    for r in active:
        buckets.setdefault((r.cut, len(r.batches[step])), []).append(r)
    sent = []  # (bucket, fx, fx_server, y)
    for (cut, _), bucket in buckets.items():
        stack = round_.device_stacks[cut]
        row_idx = [r.row for r in bucket]
        x, y = round_.runner.batch(bucket, step, round_.x_all, round_.y_all)
        out, buffers = round_.runner.forward(*round_.part(0, cut), stack, row_idx, x)
        stack.scatter_buffers(row_idx, buffers)
        if cut >= n:  # the whole model on the device (FedAvg)
            losses = row_losses(out, y, round_.runner.loss)
            check_finite(losses, bucket)
            (losses / y.shape[1]).sum().backward()
            account(bucket, losses, y.shape[1])
            continue
        if round_.tap is not None:  # privacy.record: each row, as the server receives it
            for i, r in enumerate(bucket):
                round_.tap.smashed(r.task.client, step, row_of(out, i))
        sent.append((bucket, out, as_server_input(out), y))
    return sent


def _server_backward(
    round_: SplitRound, sent: list, server_losses: list, bn_results: dict
) -> dict[int, list[int]]:
    """Backward of every group's loss (:func:`~splitfl.roles.sides.group_loss` of the
    plan's ``group_loss``), then the server rows' BatchNorm statistics. Returns each group's
    members' batch sizes this step."""
    members: dict[int, list] = {}
    for (bucket, _, _, y), losses in zip(sent, server_losses, strict=True):
        check_finite(losses, bucket)
        for i, r in enumerate(bucket):
            members.setdefault(r.group_row, []).append((losses[i], y.shape[1]))
    sizes = {g: [s for _, s in ms] for g, ms in members.items()}
    mode = round_.plan.topology.server.group_loss
    total = [group_loss([ls for ls, _ in ms], sizes[g], mode) for g, ms in members.items()]
    torch.stack(total).sum().backward()
    _combine_server_buffers(round_.server_stack, bn_results, round_.member_order, round_.momenta)
    return sizes


def _server_separate(round_: SplitRound, sent: list) -> tuple[list, dict]:
    """Server forwards per device bucket, member by member (``group_forward: separate``):
    each bucket's per-row summed losses, and BatchNorm results keyed by member."""
    n, stack = round_.model.num_blocks, round_.server_stack
    server_losses, bn_results = [], {}
    for bucket, _, fs, y in sent:
        cut = bucket[0].cut
        grows = [r.group_row for r in bucket]
        out, buffers = round_.runner.forward(
            *round_.part(cut, n), stack, grows, fs, keep_stack_buffers=True, start=cut
        )
        server_losses.append(row_losses(out, y, round_.runner.loss))
        for i, r in enumerate(bucket):
            for k, v in buffers.items():
                bn_results.setdefault(k, []).append((r, v[i]))
    return server_losses, bn_results


def _server_concat(round_: SplitRound, sent: list) -> tuple[list, dict]:
    """``group_forward: concat`` (MergeSFL Eq. 16): per group and cut point, the members'
    smashed data concatenated in member order (across device buckets) is one server row's
    batch; merged batches of equal cut and length run as one batched call. Returns what
    :func:`_server_separate` returns; a merged batch's BatchNorm result is ranked by its
    first member (the sequential executor's order of cut points)."""
    n, stack = round_.model.num_blocks, round_.server_stack
    rank = {id(r): k for members in round_.member_order for k, r in enumerate(members)}
    merged: dict[tuple[int, int], list[tuple[WorkerRow, int, int]]] = {}
    for j, (bucket, *_) in enumerate(sent):
        for i, r in enumerate(bucket):
            merged.setdefault((r.group_row, r.cut), []).append((r, j, i))
    calls: dict[tuple[int, int], list[list[tuple[WorkerRow, int, int]]]] = {}
    for (_, cut), members in merged.items():
        members.sort(key=lambda m: rank[id(m[0])])
        length = sum(sent[j][3].shape[1] for _, j, _ in members)
        calls.setdefault((cut, length), []).append(members)
    member_loss: dict[tuple[int, int], torch.Tensor] = {}
    bn_results: dict[str, list] = {}
    for (cut, _), batches in calls.items():
        x = stack_rows([cat([row_of(sent[j][2], i) for _, j, i in b]) for b in batches])
        y = torch.stack([torch.cat([sent[j][3][i] for _, j, i in b]) for b in batches])
        grows = [b[0][0].group_row for b in batches]
        out, buffers = round_.runner.forward(
            *round_.part(cut, n), stack, grows, x, keep_stack_buffers=True, start=cut
        )
        loss = loss_fn(round_.runner.loss)
        per_sample = loss(out.flatten(0, 1), y.flatten(0, 1), reduction="none").view(y.shape[:2])
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


def _combine_server_buffers(stack, results, member_order, momenta) -> None:
    """Each group's BatchNorm statistics after its members' forwards in order."""
    if stack is None:
        return
    rank = {id(r): i for members in member_order for i, r in enumerate(members)}
    ranked = {
        key: [(r.group_row, rank[id(r)], v) for r, v in items] for key, items in results.items()
    }
    chain_buffers(stack, ranked, momenta)
