"""Helpers shared by every executor: batches, precision, memory format, optimiser, evaluation.

Executors (:mod:`splitfl.executors.sequential`, :mod:`splitfl.executors.vectorized`) run a
:class:`~splitfl.core.plan.RoundPlan`; what they need of the run is the model, the data and the
training hyperparameters (:class:`~splitfl.config.TrainConfig`), never the whole config.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch
from torch import nn

from splitfl.config import TrainConfig
from splitfl.core.activations import Activation, tree_map
from splitfl.core.seeding import derive_seed
from splitfl.data.partition import epoch_batch_sizes
from splitfl.models import BlockModel
from splitfl.training import loss_fn, make_optimizer, score


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN/inf loss."""


def at_least_fp32(x: Activation) -> Activation:
    """Each floating tensor of ``x`` in fp32 when autocast produced a lower precision;
    fp32/fp64 kept as they are (fp64 runs are how the equivalence tests compare executors
    free of kernel-order noise), integer and bool tensors (masks, ids) untouched."""
    if isinstance(x, torch.Tensor):  # one tensor: no tree to walk
        return _at_least_fp32(x)
    return tree_map(_at_least_fp32, x)


def _at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    keep = t.dtype in (torch.float32, torch.float64) or not t.is_floating_point()
    return t if keep else t.float()


def local_optimizer(module: nn.Module, lr: float, train: TrainConfig) -> torch.optim.Optimizer:
    """``train.optimizer`` (:func:`~splitfl.training.make_optimizer`: SGD with the run's
    momentum and weight decay, Adam, AdamW) over ``module``'s trainable parameters."""
    return make_optimizer((p for p in module.parameters() if p.requires_grad), lr, train)


def client_batches(
    indices: np.ndarray, batch_size: int, steps: int, seed: int, drop_last: bool | str = False
) -> list[torch.Tensor]:
    """``steps`` mini-batches of sample indices, reshuffled every epoch (seeded); an epoch's
    last batch is dropped where ``train.drop_last`` says so
    (:func:`~splitfl.data.partition.epoch_batch_sizes`: the same sizes the clock prices)."""
    gen = torch.Generator().manual_seed(seed)
    pool = torch.as_tensor(indices, dtype=torch.long)
    kept = len(epoch_batch_sizes(len(pool), batch_size, drop_last))
    out: list[torch.Tensor] = []
    while len(out) < steps:
        perm = pool[torch.randperm(len(pool), generator=gen)]
        out.extend(perm.split(batch_size)[:kept])
    return out[:steps]


def task_batches(
    indices: np.ndarray, task, round_seed: int, drop_last: bool | str = False
) -> list[torch.Tensor]:
    """A task's mini-batches of the round: :func:`client_batches` of the client's sample
    ``indices`` seeded by ``derive_seed(round_seed, client)``, the same in every executor."""
    seed = derive_seed(round_seed, task.client)
    return client_batches(indices, task.batch_size, task.steps, seed, drop_last)


def round_batches(
    tasks, client_indices, round_seed: int, drop_last: bool | str = False
) -> dict[int, list[torch.Tensor]]:
    """Each task's :func:`task_batches` (what its :class:`~splitfl.roles.sides.DeviceRole`
    would draw), drawn for every client in one pass before training: torch's small ops run
    cache-warm one after another (~4 µs each) instead of one client's at a time between
    training steps (~15 µs each on a 2-core machine, ~0.4 ms of a 30 ms FedAvg round)."""
    return {
        t.client: task_batches(client_indices[t.client], t, round_seed, drop_last) for t in tasks
    }


#: ``precision`` values: fp32, or bf16 autocast of the forward passes (losses in fp32).
PRECISIONS = ("fp32", "bf16")


def precision_context(device: torch.device, precision: str):
    """bf16 autocast on ``device`` (forward passes only), or nothing for fp32."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def to_memory_format(x: torch.Tensor) -> torch.Tensor:
    """Channels-last layout for image batches (4-D, or 5-D stacked per client); others as is."""
    if x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    if x.dim() == 5:
        return x.contiguous(memory_format=torch.channels_last_3d)
    return x


def check_finite(loss: torch.Tensor, client: int) -> None:
    if not torch.isfinite(loss):
        raise NonFiniteLossError(f"non-finite training loss ({loss.item()}) at client {client}")


def finite_value(loss: torch.Tensor, client: int) -> float:
    """A scalar loss's value, checked as :func:`check_finite` does (one read, not two)."""
    value = loss.item()
    if not math.isfinite(value):
        raise NonFiniteLossError(f"non-finite training loss ({value}) at client {client}")
    return value


def detached(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in state.items()}


def evaluate(
    model: BlockModel,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    loss: str = "cross_entropy",
    metrics: tuple[str, ...] | list[str] = ("accuracy",),
) -> dict[str, float | None]:
    """The mean test ``loss`` (key ``loss``) and each of ``metrics``
    (:func:`~splitfl.training.score`) of ``model`` on ``(x, y)`` in eval mode; a value that is
    not finite is None (metrics rows are strict JSON)."""
    model.eval()
    device = next(model.parameters()).device
    criterion = loss_fn(loss)
    loss_sum, outputs = 0.0, []
    with torch.no_grad():
        for start in range(0, len(y), batch_size):
            xb = x[start : start + batch_size].to(device)
            yb = y[start : start + batch_size].to(device)
            out = model(xb)
            loss_sum += criterion(out, yb, reduction="sum").item()
            outputs.append(out.cpu())
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
    values = {"loss": loss_sum / len(y)}
    values.update({m: score(m, out, y) for m in metrics if m != "loss"})
    return {k: v if math.isfinite(v) else None for k, v in values.items()}
